"""`zephon-titan plan --procs N`: wall time and planned tokens per second for several N, same job, same steps.

    python examples/demo.py --build-only
    sed -e 's/^seq_len = 128/seq_len = 2048/' -e 's/^global_batch_size = 16 .*/global_batch_size = 64/' \\
        -e 's/^num_lanes = 8/num_lanes = 64/' configs/debug_cpu.toml > demo_out/plan_bench.toml
    python benchmarks/plan_procs.py demo_out/plan_bench.toml --steps 300 --procs 1 2 --repeats 2

Each run is `plan_ledger` as the command runs it (job loading and process start included in "wall"); "steady"
is the rate from the first entry to the last (tokens: rows x seq_len per step, padding included); "per CPU
second": the tokens over the CPU time of the run, its processes' included (job loading too), which a loaded
machine disturbs far less than wall time. The runs
alternate (1, 2, 1, 2, ...) so that a noisy machine weighs on each alike; every run's ledger must equal the
first's.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time

from zephon_titan.plan import plan_ledger
from zephon_titan.titan.job import load_job


def cpu_seconds() -> float:
    """User + system time of this process and of its children that have exited (the plan processes)."""
    return sum(
        usage.ru_utime + usage.ru_stime
        for usage in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    )


def run(job: str, steps: int, procs: int) -> tuple[float, float, float, list]:
    """(wall seconds, seconds from the first entry to the last, CPU seconds, entries)."""
    cpu = cpu_seconds()
    began = time.perf_counter()
    entries, first = [], 0.0
    for entry in plan_ledger(job, steps, procs=procs):
        if not entries:
            first = time.perf_counter()
        entries.append(entry)
    end = time.perf_counter()
    return end - began, end - first, cpu_seconds() - cpu, entries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("job")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    job = load_job(args.job)
    tokens_per_step = job.global_batch_size * job.seq_len
    cores = len(os.sched_getaffinity(0))
    print(
        f"{args.job}: {job.data.num_lanes} lanes, {job.global_batch_size} rows of {job.seq_len} tokens per step, "
        f"{args.steps} steps ({args.steps * tokens_per_step / 1e6:.1f} M tokens), {cores} cores, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    reference = None
    results: dict[int, list[tuple[float, float, float]]] = {p: [] for p in args.procs}
    for repeat in range(args.repeats):
        for procs in args.procs:
            wall, steady, cpu, entries = run(args.job, args.steps, procs)
            reference = reference if reference is not None else entries
            assert entries == reference, f"--procs {procs}: a different ledger"
            rate = (len(entries) - 1) * tokens_per_step / steady
            per_cpu = len(entries) * tokens_per_step / cpu
            results[procs].append((wall, rate, per_cpu))
            print(
                f"  run {repeat + 1}, --procs {procs}: wall {wall:.1f} s, steady {rate / 1e6:.2f} M tokens/s, "
                f"{per_cpu / 1e6:.2f} M tokens per CPU second (load average {os.getloadavg()[0]:.1f})"
            )
    base = statistics.median(w for w, _, _ in results[args.procs[0]])
    print("medians:")
    for procs in args.procs:
        wall, rate, per_cpu = (statistics.median(r[i] for r in results[procs]) for i in range(3))
        print(
            f"  --procs {procs}: wall {wall:.1f} s (speed-up x{base / wall:.2f}), steady {rate / 1e6:.2f} M tokens/s, "
            f"{per_cpu / 1e6:.2f} M tokens per CPU second: 10 B tokens take {1e10 / per_cpu / 3600:.2f} core-hours"
        )


if __name__ == "__main__":
    main()
