"""Whether processes asked to run side by side have cores to run on: what `plan --procs N` and `[dataloader]
num_workers` can gain on this machine, said when they cannot.

Both pay only with free cores: measured on 2 loaded cores, 2 workers ran at 0.43-0.95x of in process and
`plan --procs 2` at 0.79x (docs/performance.md). The cores are those this process may use (its CPU affinity);
the free ones are those left by the 1-minute load average, which counts every runnable process of the machine.
"""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on (its affinity; the machine's where there is none)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def free_cores() -> float:
    """The usable cores the 1-minute load average leaves (0 when the machine is busier than that)."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average here: assume the cores are free
        load = 0.0
    return max(0.0, usable_cores() - load)


def procs_note(procs: int) -> str | None:
    """`plan --procs N`: why N processes cannot all run at once here (None: they can)."""
    usable, free = usable_cores(), free_cores()
    if procs > usable:
        return (
            f"--procs {procs} on {usable} usable core{'s' if usable != 1 else ''}: at most {usable} run at once, "
            f"so expect no gain beyond --procs {usable}"
        )
    if procs > free + 0.5:
        return (
            f"--procs {procs} with ~{free:.1f} free cores ({usable} usable, load {usable - free:.1f}): the "
            f"processes share cores with other work, expect well under {procs}x (--procs 1 may be as fast)"
        )
    return None


def workers_note(num_workers: int, ranks_on_host: int) -> str | None:
    """`num_workers`: why worker processes are unlikely to beat in process (0) on this host (None: they may)."""
    if num_workers < 1:
        return None
    usable = usable_cores()
    per_rank = usable / max(ranks_on_host, 1)
    if per_rank >= num_workers + 1:  # the trainer's thread, and one core per worker
        return None
    return (
        f"num_workers = {num_workers} with {per_rank:g} core{'s' if per_rank != 1 else ''} per rank ({usable} "
        f"usable, {ranks_on_host} rank{'s' if ranks_on_host != 1 else ''} on this host): the workers share cores "
        "with the trainer and each other and may be slower than num_workers = 0 (in process); give each rank "
        f"num_workers + 1 cores, or set num_workers = {max(int(per_rank) - 1, 0)}"
    )
