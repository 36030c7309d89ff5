"""1,024 data-parallel ranks in one process: the real loader and real DCP checkpoints on torch's own
multi-threaded process group (issue 28, Proof).

    python scripts/thousand_ranks.py                       # L 64, G 3,072: save on 256, resume on 1,024, 96, 3
    python scripts/thousand_ranks.py --lanes 8 --global-batch 96 --save-on 16 --resume-on 48,3   # the gate's

Every rank is a thread of this process holding its own `ZephonDataLoader`, built exactly as data_run builds
it (`DataJob.build_loader`: `config.build(dp_world_size=W, dp_rank=r, tokenizer=, seq_len=, local_batch_size=)`), in a world of
`torch.testing._internal.distributed.multi_threaded_pg`, the "threaded" backend PyTorch's own distributed
tests run on (`MultiThreadedTestCase`): `dist.init_process_group("threaded", rank=r, world_size=W,
store=<one HashStore>)` in each thread, with a thread-local default group. Collectives are real
`torch.distributed` calls (all_reduce, gather, broadcast, ...) whose data moves between the threads; the
checkpoint is real `dcp.save({"dataloader": loader, "train_state": counter})` (one `__<rank>_0.distcp`
file per rank, the coordinator's `.metadata`), and each resume is `loader/state.restore`, data_run's and
the trainer's resume sequence. Each rank consumes its G/W rows of every step, and each step's ledger
entry is gathered by `gather_ledger_entry` over the world. Every step of every phase must be SHA-256-equal
to `zephon_titan.plan.plan_ledger` (one process, no ranks); another seed is the negative control.

What it is not: the ranks share one interpreter, so they take turns on the GIL (the engine is pure
Python) and share the tokenizer object the trainer would build once per process; each still builds its
own engine spec, lanes, prefetch thread and tokenizer backend. Wall time is therefore the sum of every
rank's work. The ranks run with `tokenizer_backend = "tokenizers"` (a speed knob: every backend computes
the same ids, and the plan, which keeps the job's `auto`, checks it): a fastokens backend costs ~50 MB per
loader that builds one, paid once per process by real ranks but 1,024 times here. And the GIL switch interval
is 0.5 s, not 5 ms: each of the ~3,000 threads waiting for the GIL wakes every interval to ask for it, which
at 5 ms cost the 1,024-rank phase 70 M context switches and more than half its time (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import threading
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.testing._internal.distributed.multi_threaded_pg import (
    ProcessLocalGroup,
    _install_threaded_pg,
    _uninstall_threaded_pg,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "scripts"))

from elastic_scale import write_job  # noqa: E402  (the demo corpus and its job TOML)

from zephon_titan.loader.ledger import gather_ledger_entry  # noqa: E402
from zephon_titan.loader.state import restore  # noqa: E402
from zephon_titan.plan import plan_ledger  # noqa: E402
from zephon_titan.titan.data_run import DataJob, StepCounter  # noqa: E402
from zephon_titan.titan.job import load_job  # noqa: E402


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_world(world: int, rank_main) -> None:
    """Run `rank_main(rank)` on `world` threads, each the rank of one threaded process group (as
    MultiThreadedTestCase._spawn_threads does); re-raise the first rank's failure."""
    torch._C._distributed_c10d._set_thread_isolation_mode(True)
    _install_threaded_pg()
    store = dist.HashStore()
    failures: list[tuple[int, str]] = []

    def thread(rank: int) -> None:
        dist.init_process_group("threaded", rank=rank, world_size=world, store=store)
        try:
            rank_main(rank)
        except BaseException as e:  # wake the ranks waiting for this one in a collective
            failures.append((rank, traceback.format_exc()))
            ProcessLocalGroup.exception_handle(e)
        finally:
            dist.destroy_process_group()

    threads = [threading.Thread(target=thread, args=(rank,), name=f"rank{rank}") for rank in range(world)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        ProcessLocalGroup.reset()
        _uninstall_threaded_pg()
        torch._C._distributed_c10d._set_thread_isolation_mode(False)
    if failures:
        rank, trace = min(failures)
        raise RuntimeError(f"{len(failures)} of {world} ranks failed; rank {rank}:\n{trace}")


def run_phase(
    job: DataJob,
    tokenizer: Any,
    world: int,
    steps: int,
    resume: str | None = None,
    save_at: int | None = None,
    checkpoint: str | None = None,
) -> dict:
    """One run of `world` ranks: resume (or start), consume to `steps`, save after `save_at`. Returns the
    ledger rank 0 gathered ({step: sha256}), wall time and memory."""
    job.check_layout(world)
    microbatches = job.global_batch_size // (job.local_batch_size * world)
    ledger: dict[int, str] = {}
    built = threading.Barrier(world)
    seconds: dict[str, float] = {}
    started = time.perf_counter()

    def rank_main(rank: int) -> None:
        try:
            loader = job.build_loader(world, rank, tokenizer)
        except BaseException:
            built.abort()
            raise
        if built.wait() == 0:
            seconds["build"] = time.perf_counter() - started
            seconds["rss_built"] = rss_mb()
        counter = StepCounter()
        if resume:
            restore({"dataloader": loader, "train_state": counter}, resume, loader)
        batches = iter(loader)
        try:
            while counter.step < steps:
                for _ in range(microbatches):
                    next(batches)
                counter.step += 1
                entry = gather_ledger_entry(loader, counter.step, dist.group.WORLD)
                if entry is not None:
                    ledger[counter.step] = entry.sha256
                if counter.step == save_at:
                    assert checkpoint is not None
                    path = os.path.join(checkpoint, f"step-{counter.step}")
                    dcp.save({"dataloader": loader, "train_state": counter}, checkpoint_id=path)
        finally:
            loader.close()

    run_world(world, rank_main)
    phase = {
        "ranks": world,
        "wall_s": round(time.perf_counter() - started, 1),
        "build_s": round(seconds["build"], 1),
        "rss_built_mb": round(seconds["rss_built"]),
        "peak_rss_mb": round(peak_rss_mb()),
        "ledger": ledger,
    }
    print(f"  {phase['wall_s']} s ({phase['build_s']} s to build the loaders)", flush=True)
    return phase


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default="thousand_out")
    p.add_argument("--lanes", type=int, default=64)
    p.add_argument("--global-batch", type=int, default=3072)
    p.add_argument("--local-batch", type=int, default=1)
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--save-at", type=int, default=2)
    p.add_argument("--save-on", type=int, default=256, help="ranks of the run that saves the checkpoint")
    p.add_argument("--resume-on", default="1024,96,3", help="ranks of each resume of that checkpoint")
    p.add_argument(
        "--tokenizer-backend",
        default="tokenizers",
        help="the ranks' [dataloader] tokenizer_backend (the plan keeps the job's: auto)",
    )
    p.add_argument("--switch-interval", type=float, default=0.5, help="sys.setswitchinterval (s): see above")
    args = p.parse_args(argv)
    sys.setswitchinterval(args.switch_interval)
    os.makedirs(args.work, exist_ok=True)
    work = os.path.abspath(args.work)
    path = write_job(work, args, seed=2026)
    job = DataJob.of(load_job(path, ["--dataloader.tokenizer_backend", args.tokenizer_backend]))
    tokenizer = job.trainer_tokenizer()  # one per process, as the trainer builds it: the ranks share it

    started = time.perf_counter()
    planned = {e.step: e.sha256 for e in plan_ledger(path, args.steps)}
    print(f"plan: {args.steps} steps in {time.perf_counter() - started:.1f} s", flush=True)
    checkpoint = os.path.join(work, "ckpt")
    print(f"{args.save_on} ranks: steps 1-{args.steps}, saving step {args.save_at} ...", flush=True)
    phases = [run_phase(job, tokenizer, args.save_on, args.steps, save_at=args.save_at, checkpoint=checkpoint)]
    phases[0]["phase"] = f"{args.save_on} ranks (saves step {args.save_at})"
    saved = os.path.join(checkpoint, f"step-{args.save_at}")
    for world in [int(x) for x in args.resume_on.split(",") if x]:
        print(f"{args.save_on} -> {world} ranks: resuming step {args.save_at} ...", flush=True)
        phase = run_phase(job, tokenizer, world, args.steps, resume=saved)
        phase["phase"] = f"{args.save_on} -> {world}"
        phases.append(phase)
    other = {e.step: e.sha256 for e in plan_ledger(write_job(work, args, seed=2027), args.steps)}

    ok = True
    print(
        f"\nL = {args.lanes}, G = {args.global_batch} ({args.global_batch // args.lanes} rows per lane), seq_len "
        f"{args.seq_len}, local batch {args.local_batch}; checkpoint: {len(os.listdir(saved))} files\n"
    )
    print("| phase | ranks | steps | equal to plan | wall | loaders built after | RSS once built | peak RSS so far |")
    print("|---|---|---|---|---|---|---|---|")
    for phase in phases:
        ledger = phase["ledger"]
        first = args.save_at + 1 if "->" in phase["phase"] else 1
        expected = list(range(first, args.steps + 1))
        equal = sum(ledger.get(s) == planned[s] for s in expected)
        ok &= sorted(ledger) == expected and equal == len(expected)
        print(
            f"| {phase['phase']} | {phase['ranks']} | {first}-{args.steps} | {equal}/{len(expected)} | "
            f"{phase['wall_s']} s | {phase['build_s']} s | {phase['rss_built_mb']} MB | {phase['peak_rss_mb']} MB |"
        )
    control = sum(other[s] != planned[s] for s in planned)
    ok &= control == len(planned)
    print(f"\nnegative control (seed 2027): differs from the plan at {control}/{len(planned)} steps")
    print("ALL MATCH" if ok else "MISMATCH")
    with open(os.path.join(work, "summary.json"), "w") as f:
        json.dump({"ok": ok, "planned": planned, "phases": phases}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
