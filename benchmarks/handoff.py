"""What the trainer process pays to take each microbatch from the loader, while the GPU would be busy.

    python benchmarks/handoff.py [--workers 0 2] [--step-seconds 0.25] [--steps 12]

The gpu_check job (Llama-3 1B's data side: 64 lanes, rows of 2048 tokens, 64 rows per step in
microbatches of 8, the demo corpus and tokenizer), consumed as a trainer does: 8 microbatches per step,
with `--step-seconds` of sleep standing in for the step's compute (so producers have time to get ahead).
Reported per worker count, over the steps after the first 3: the wait for the step's first microbatch
(it receives the whole step), for each of the other 7, and in total per step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(REPO, "scripts"), os.path.join(REPO, "examples")]


def measure(workers: int, steps: int, step_seconds: float, root: str) -> dict:
    import gpu_check

    loader, document = gpu_check.build_loader(root, steps, cpu=False, workers=workers)
    training = document["training"]
    microbatches = training["global_batch_size"] // training["local_batch_size"]
    waits: list[list[float]] = []
    try:
        batches = iter(loader)
        for _ in range(steps):
            step = []
            for _ in range(microbatches):
                started = time.perf_counter()
                next(batches)
                step.append(time.perf_counter() - started)
                time.sleep(step_seconds / microbatches)
            waits.append(step)
    finally:
        loader.close()
    steady = waits[3:]
    return {
        "first_ms": statistics.median(w[0] for w in steady) * 1e3,
        "others_ms": statistics.median(x for w in steady for x in w[1:]) * 1e3,
        "per_step_ms": statistics.median(sum(w) for w in steady) * 1e3,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--step-seconds", type=float, default=0.25, help="the compute each step stands for")
    args = p.parse_args()
    root = tempfile.mkdtemp(prefix="handoff_")
    print("| workers | wait for the step's first microbatch | each other microbatch | per step |")
    print("|---|---|---|---|")
    for workers in args.workers:
        r = measure(workers, args.steps, args.step_seconds, root)
        print(f"| {workers} | {r['first_ms']:.1f} ms | {r['others_ms']:.2f} ms | {r['per_step_ms']:.1f} ms |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
