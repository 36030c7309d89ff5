"""The cost of a lane: memory, time to the first step and steady throughput against the number of lanes.

    python benchmarks/lane_cost.py [--lanes 8 --lanes 1024 ...] [--baseline-ref REF] [--sources jsonl]

One rank produces every lane (`open_lane_group(spec, range(L), rows_per_step)`, in process, its rows with
the lane states as the trainer's loader takes them: `next_step_with_states`), with the
default windows (1 MiB JSONL blocks, 4-block shuffle windows) and rows of 2,048 tokens. The corpus is
written here: 2 JSONL sources (the Python documentation topics and the standard library's modules, each
`--jsonl-mib` MiB) and 2 Parquet sources with row groups of `--row-group-mib` MiB of text (the same texts),
and a byte-level BPE trained on them. Each (code, L) runs in a fresh process, all of them side by side in
one invocation, so the ratios are comparable on a noisy machine:

- `peak RSS`: the process's peak resident memory (VmHWM) minus its RSS after the imports and the
  tokenizer load, i.e. what the spec and the lanes cost;
- `first step`: build_engine + open_lane_group + the first step (one row per lane), wall and CPU seconds
  (the process's CPU time, all threads: less sensitive to other load on the machine than the wall time);
- `tokens/s`: input tokens per second over `--rows` rows (at least `--rows-per-lane` per lane), after as
  many rows of warm-up (the first documents of the fast tokenizer are checked against the reference, and
  each lane's first batches of documents are tokenized ahead of its rows), per wall second and per CPU
  second. `--rows 0 --rows-per-lane 0` measures the first step only. `--gc torchtitan` times them under
  the garbage-collection policy of TorchTitan's trainer, the process a rank's lanes run in by default
  (`num_workers = 0`): automatic collection off, a young collection every 50 steps (`training.gc_freq`).
  `--global-batch G` gives every lane count the same job: G rows per step, G / L per lane (the default, one
  row per lane and step, makes a step of L rows).

`--repeat N` runs every (code, L) N times, the codes alternating, so that before and after meet the same load.

`--baseline-ref REF` also runs the code of git revision REF (a temporary worktree), for before/after
tables. A process is stopped when its RSS passes `--max-rss-gb` (reported as ">").
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEQ_LEN = 2048
TITAN_GC_FREQ = 50  # TorchTitan's [training] gc_freq default


def _rss_kb(field: str, pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def write_corpus(root: str, jsonl_mib: int, row_group_mib: int, row_groups: int) -> None:
    """Two JSONL sources and two Parquet sources of real-looking text (the documents repeat, numbered)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sys.path.insert(0, os.path.join(REPO, "examples"))
    import corpus

    kinds = {"prose": corpus.prose_documents(), "code": corpus.code_documents(max_files=400, max_bytes=60_000)}
    for kind, docs in kinds.items():
        os.makedirs(f"{root}/{kind}_jsonl", exist_ok=True)
        with open(f"{root}/{kind}_jsonl/part-00000.jsonl", "w", encoding="utf-8") as f:
            written, i = 0, 0
            while written < jsonl_mib << 20:
                line = json.dumps({"text": f"{i}\n{docs[i % len(docs)]}"}) + "\n"
                f.write(line)
                written += len(line)
                i += 1
        os.makedirs(f"{root}/{kind}_parquet", exist_ok=True)
        schema = pa.schema([("text", pa.string())])
        with pq.ParquetWriter(f"{root}/{kind}_parquet/part-00000.parquet", schema) as writer:
            i = 0
            for _ in range(row_groups):
                texts, size = [], 0
                while size < row_group_mib << 20:
                    texts.append(f"{i}\n{docs[i % len(docs)]}")
                    size += len(texts[-1])
                    i += 1
                writer.write_table(pa.table({"text": texts}, schema=schema), row_group_size=len(texts))
    train = kinds["prose"] + kinds["code"]
    corpus.train_tokenizer(train, f"{root}/tokenizer", vocab_size=8000)


def child(args: argparse.Namespace) -> None:
    """One configuration in a fresh process."""
    from zephon_titan.config import DataConfig, SourceConfig
    from zephon_titan.engine import build_engine, open_lane_group
    from zephon_titan.titan.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(f"{args.root}/tokenizer", backend=args.backend)
    kinds = ["jsonl"] if args.sources == "jsonl" else ["jsonl", "parquet"]
    names = sorted(f"{kind}_{fmt}" for fmt in kinds for kind in ("prose", "code"))
    sources = [SourceConfig(name=n, paths=[f"{args.root}/{n}/*.{n.split('_')[1]}"], weight=1.0) for n in names]
    import zephon_titan

    assert zephon_titan.__file__.startswith(os.getcwd()), zephon_titan.__file__  # the code asked for
    base = _rss_kb("VmRSS")
    started, started_cpu = time.perf_counter(), time.process_time()
    spec = build_engine(DataConfig(sources=sources, num_lanes=args.num_lanes, seed=1), SEQ_LEN, tokenizer)
    per_lane = args.global_batch // args.num_lanes if args.global_batch else 1
    group = open_lane_group(spec, range(args.num_lanes), per_lane)
    group.next_step_with_states()
    first, first_cpu = time.perf_counter() - started, time.process_time() - started_cpu
    if args.prefetch:  # as the trainer's loader runs the lanes in process: a thread produces the steps ahead
        from zephon_titan.loader.prefetch import PrefetchedSteps

        group = PrefetchedSteps(group, 2)
    rows = 0
    while rows < args.rows:  # warm-up: the fast tokenizer's first documents are checked against the reference
        rows += sum(len(lane) for lane in group.next_step_with_states())
    if args.gc == "torchtitan":
        gc.disable()  # what TorchTitan's trainer does (tools/utils.py GarbageCollection)...
        gc.collect(1)
    rows, steps, started, started_cpu = 0, 0, time.perf_counter(), time.process_time()
    while rows < args.rows:  # what the trainer's loader calls: rows with the lane states it checkpoints
        rows += sum(len(lane) for lane in group.next_step_with_states())
        steps += 1
        if args.gc == "torchtitan" and steps % TITAN_GC_FREQ == 0:
            gc.collect(1)  # ...then a young collection every training.gc_freq steps
    steady, steady_cpu = time.perf_counter() - started, time.process_time() - started_cpu
    print(
        json.dumps(
            {
                "peak_mb": (_rss_kb("VmHWM") - base) / 1024,
                "first_s": first,
                "first_cpu_s": first_cpu,
                "tokens_per_s": rows * SEQ_LEN / max(steady, 1e-9),
                "tokens_per_cpu_s": rows * SEQ_LEN / max(steady_cpu, 1e-9),
                "rows": rows,
            }
        )
    )


def run_case(args: argparse.Namespace, code: str, lanes: int, cpu: int | None = None) -> dict:
    """One configuration in its own process (code: the repository whose zephon_titan is imported); `cpu`: pinned
    to that core, with one tokenizer thread."""
    cmd = [sys.executable, __file__, "--child", "--root", args.root, "--num-lanes", str(lanes)]
    cmd += [
        "--rows",
        str(max(args.rows, args.rows_per_lane * lanes)),
        "--sources",
        args.sources,
        "--backend",
        args.backend,
        "--gc",
        args.gc,
        "--global-batch",
        str(args.global_batch or 0),
        *(["--prefetch"] if args.prefetch else []),
    ]
    env = {**os.environ, "PYTHONPATH": code}
    if cpu is not None:
        cmd = ["taskset", "-c", str(cpu), *cmd]
        env["RAYON_NUM_THREADS"] = "1"
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=code)
    peak = 0
    while proc.poll() is None:
        try:
            peak = max(peak, _rss_kb("VmRSS", proc.pid))
        except OSError:
            pass
        if peak > args.max_rss_gb * (1 << 20):
            proc.kill()
            proc.wait()
            return {"stopped": f"> {args.max_rss_gb:g} GB RSS"}
        time.sleep(0.1)
    out, err = proc.communicate()
    if proc.returncode != 0:
        return {"stopped": (err.strip().splitlines() or ["?"])[-1][:120]}
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lanes", type=int, action="append", help="lanes (repeatable); default 8 64 256 1024 4096")
    p.add_argument("--baseline-ref", help="also run the code of this git revision (before/after)")
    p.add_argument("--sources", choices=["mixed", "jsonl"], default="mixed", help="2 JSONL + 2 Parquet, or 2 JSONL")
    p.add_argument("--jsonl-mib", type=int, default=64, help="MiB per JSONL source")
    p.add_argument("--row-group-mib", type=int, default=128, help="MiB of text per Parquet row group")
    p.add_argument("--row-groups", type=int, default=2, help="row groups per Parquet source")
    p.add_argument("--rows", type=int, default=2048, help="rows of warm-up, then rows timed")
    p.add_argument("--rows-per-lane", type=int, default=8, help="at least this many rows per lane, each phase")
    p.add_argument("--backend", default="auto", help="[dataloader] tokenizer_backend")
    p.add_argument(
        "--gc",
        choices=["python", "torchtitan"],
        default="python",
        help="the timed rows under Python's default garbage collection, or TorchTitan's trainer's (automatic "
        "collection off, a young collection every 50 steps): a rank's lanes run in the trainer's process",
    )
    p.add_argument(
        "--pinned",
        action="store_true",
        help="two --lanes counts run at the same time, one core each, then swapped (this tree only)",
    )
    p.add_argument(
        "--global-batch",
        type=int,
        help="rows per step, G / L rows per lane (the same job at every lane count); default: one row per lane",
    )
    p.add_argument(
        "--prefetch",
        action="store_true",
        help="steps produced by a background thread, 2 ahead (torchdata's Prefetcher), as the trainer's loader does",
    )
    p.add_argument("--repeat", type=int, default=1, help="runs of each (code, L), the codes alternating")
    p.add_argument("--max-rss-gb", type=float, default=8.0, help="stop a configuration above this RSS")
    p.add_argument("--root", help="corpus directory (default: written to a temporary directory)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--num-lanes", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    if args.pinned and (len(args.lanes or []) != 2 or args.baseline_ref):
        p.error("--pinned runs two --lanes counts of this tree side by side: give --lanes twice, no --baseline-ref")
    if args.global_batch and any(args.global_batch % lanes for lanes in args.lanes or [8, 64, 256, 1024, 4096]):
        p.error(f"--global-batch {args.global_batch} must be a multiple of every --lanes count (rows per lane)")
    if not args.root:
        args.root = tempfile.mkdtemp(prefix="lane_cost_")
    if not os.path.exists(f"{args.root}/tokenizer/tokenizer.json"):
        started = time.perf_counter()
        write_corpus(args.root, args.jsonl_mib, args.row_group_mib, args.row_groups)
        print(f"corpus written to {args.root} in {time.perf_counter() - started:.0f} s", flush=True)
    codes = [("this tree", REPO)]
    worktree = None
    if args.baseline_ref:
        worktree = tempfile.mkdtemp(prefix="lane_cost_base_")
        subprocess.run(["git", "-C", REPO, "worktree", "add", "--detach", worktree, args.baseline_ref], check=True)
        codes.insert(0, (args.baseline_ref, worktree))
    try:
        print(
            "| code | lanes | peak RSS above the interpreter | first step, wall (CPU) "
            "| steady tokens per wall s (per CPU s) |\n|---|---|---|---|---|"
        )
        if args.pinned:
            return run_pinned_pairs(args)
        for lanes in args.lanes or [8, 64, 256, 1024, 4096]:
            for _ in range(args.repeat):
                for name, code in codes:
                    print(_row(name, lanes, run_case(args, code, lanes)), flush=True)
    finally:
        if worktree:
            subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", worktree], check=False)


def _row(name: str, lanes: int, r: dict) -> str:
    if "stopped" in r:
        return f"| {name} | {lanes:,} | stopped: {r['stopped']} | | |"
    return (
        f"| {name} | {lanes:,} | {r['peak_mb']:,.0f} MB | {r['first_s']:.2f} s ({r['first_cpu_s']:.2f} s) "
        f"| {r['tokens_per_s'] / 1e6:.2f} M ({r['tokens_per_cpu_s'] / 1e6:.2f} M) |"
    )


def run_pinned_pairs(args: argparse.Namespace) -> None:
    """Two lane counts at the same time, one core each (one tokenizer thread each), then the cores swapped: both
    meet the same load, and a core faster than the other favours neither. Prints each pair's ratio."""
    from concurrent.futures import ThreadPoolExecutor

    first, second = args.lanes
    with ThreadPoolExecutor(2) as pool:
        for _ in range(args.repeat):
            for cpus in ((0, 1), (1, 0)):
                a = pool.submit(run_case, args, REPO, first, cpus[0])
                b = pool.submit(run_case, args, REPO, second, cpus[1])
                ra, rb = a.result(), b.result()
                print(_row(f"core {cpus[0]}", first, ra), flush=True)
                print(_row(f"core {cpus[1]}", second, rb), flush=True)
                if "stopped" not in ra and "stopped" not in rb:
                    ratio = rb["tokens_per_cpu_s"] / ra["tokens_per_cpu_s"]
                    print(f"| {second:,} / {first:,} lanes | | | | {ratio:.0%} per CPU s |", flush=True)


if __name__ == "__main__":
    main()
