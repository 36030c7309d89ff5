#!/usr/bin/env bash
# One GPU: train Llama-3 1B for a few dozen steps on our loader and on pre-made batches, and compare
# (step time, data wait, host-to-device copies). `--cpu`: the same path on CPU as a dry run.
#   bash scripts/gpu_check.sh [--cpu] [--steps N]
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
out=${OUT:-gpu_check_out}
mkdir -p "$out"
for loader in zephon premade; do
    "$py" -m torch.distributed.run --standalone --nproc_per_node 1 scripts/gpu_check.py \
        --loader "$loader" --workdir "$out/work" --out "$out/$loader.json" "$@" > "$out/$loader.log" 2>&1 \
        || { tail -30 "$out/$loader.log"; exit 1; }
done
"$py" scripts/gpu_check.py --report "$out/zephon.json" "$out/premade.json" | tee "$out/report.md"
