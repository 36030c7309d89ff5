#!/usr/bin/env bash
# One GPU: train Llama-3 1B for a few dozen steps on our loader and on pre-made batches, and compare
# (step time, data wait, host-to-device copies). `--cpu`: the same path on CPU as a dry run.
#   bash scripts/gpu_check.sh [--cpu] [--steps N]
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
out=${OUT:-gpu_check_out}
work=${WORKDIR:-$out/work}  # the demo corpus and the run's dump folder
mkdir -p "$out"
if ! "$py" -c "import torchtitan.trainer" 2>/dev/null; then  # TorchTitan 0.3.0 needs torch 2.14
    echo "TorchTitan's trainer does not import with torch $("$py" -c 'import torch; print(torch.__version__)');" \
        "measuring with a plain PyTorch loop instead (scripts/plain_loop.py)"
    set -- --trainer plain "$@"
fi
for loader in zephon premade; do
    "$py" -m torch.distributed.run --standalone --nproc_per_node 1 scripts/gpu_check.py \
        --loader "$loader" --workdir "$work" --out "$out/$loader.json" "$@" > "$out/$loader.log" 2>&1 \
        || { tail -30 "$out/$loader.log"; exit 1; }
done
"$py" scripts/gpu_check.py --report "$out/zephon.json" "$out/premade.json" | tee "$out/report.md"
