"""Requests, bytes and time to first batch of the ranks of one node reading compressed JSONL from object storage,
with and without the node cache ([dataloader] cache_dir).

    python benchmarks/node_cache.py [--ranks 2] [--latency-ms 25] [--files 16] [--steps 8]

The C4, Wikipedia and Gutenberg samples of ../shared/data are cut into `--files` gzip JSONL files (one block
each) in moto's S3 server on loopback, which adds `--latency-ms` before every response. Each case starts
`--ranks` processes at once, as the ranks of one node: each builds the loader (8 lanes; rank r produces lanes
r, r + ranks, ...) and produces `--steps` steps. Cases: no cache; a cold cache (a fresh folder); the same folder
again (warm: a restarted job on the node). Requests and bytes are the server's log (all ranks: one node); every
case must give each rank the same rows (checked by digest).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.normpath(os.path.join(REPO, "..", "shared", "data"))
SAMPLES = ("c4_en_sample", "wikipedia_en_sample", "gutenberg_pd_books")


def child(args) -> None:
    started = time.perf_counter()
    from zephon_titan.config import DataConfig, SourceConfig
    from zephon_titan.engine import build_engine
    from zephon_titan.engine.lanes import LaneGroup
    from zephon_titan.engine.sources import node_cache
    from zephon_titan.engine.sources.storage import StorageOptions as spec_options
    from zephon_titan.titan.tokenizer import load_tokenizer

    source = SourceConfig(name="web", paths=[f"{args.root}/*.jsonl.gz"])
    config = DataConfig(sources=[source], num_lanes=8, seed=1, cache_dir=args.cache_dir)
    tokenizer = load_tokenizer(args.tokenizer)
    built = time.perf_counter()  # from here: the loader's own time (listing, first windows), not Python's start
    spec = build_engine(config, 2048, tokenizer)
    group = LaneGroup(spec, list(range(args.rank, 8, args.ranks)), 1)
    digest, first, loader = hashlib.sha256(), 0.0, 0.0
    for step in range(args.steps):
        for lane_rows in group.next_step():
            for row in lane_rows:
                digest.update(row.to_bytes())
        if step == 0:
            first, loader = time.perf_counter() - started, time.perf_counter() - built
    cache = node_cache.for_path(args.root, spec_options.of(config)) if args.cache_dir else None
    stats = dict(cache.stats) if cache else {}
    result = {
        "first_batch_s": first,
        "loader_s": loader,
        "seconds": time.perf_counter() - started,
        "digest": digest.hexdigest()[:16],
    }
    print(json.dumps({**result, "cache": stats}))


def write_files(folder: str, num_files: int) -> int:
    lines: list[bytes] = []
    for name in SAMPLES:
        with open(os.path.join(SHARED, "corpus", name, "part-00000.jsonl"), "rb") as f:
            lines += [line for line in f if line.strip()]
    total = 0
    for i in range(num_files):
        data = gzip.compress(b"".join(lines[i::num_files]), mtime=0)
        with open(os.path.join(folder, f"part-{i:03d}.jsonl.gz"), "wb") as f:
            f.write(data)
        total += len(data)
    return total


def run_case(args, uri: str, env: dict, cache_dir: str, server) -> dict:
    server.clear_requests()
    cmd = [
        sys.executable,
        __file__,
        "--child",
        "--root",
        uri,
        "--tokenizer",
        args.tokenizer,
        "--steps",
        str(args.steps),
    ]
    ranks = [
        subprocess.Popen(
            cmd + ["--rank", str(r), "--ranks", str(args.ranks), "--cache-dir", cache_dir],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(args.ranks)
    ]
    results = []
    for rank in ranks:
        out, err = rank.communicate()
        if rank.returncode != 0:
            raise SystemExit(err[-3000:])
        results.append(json.loads(out.strip().splitlines()[-1]))
    data = [r for r in server.requests() if r["method"] == "GET" and r["range"]]
    return {
        "gets": len(data),
        "requests": len(server.requests()),
        "bytes": sum(r["bytes"] for r in server.requests()),
        "first_batch_s": max(r["first_batch_s"] for r in results),
        "loader_s": max(r["loader_s"] for r in results),
        "seconds": max(r["seconds"] for r in results),
        "digests": [r["digest"] for r in results],
        "cache": [r["cache"] for r in results],
    }


def _median(results: list[dict]) -> dict:
    """The run with the median time to first batch (its requests and bytes are every run's: checked)."""
    if len({(r["gets"], r["bytes"]) for r in results}) != 1:
        print("note: runs of one case made different requests:", [(r["gets"], r["bytes"]) for r in results])
    return sorted(results, key=lambda r: r["first_batch_s"])[len(results) // 2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", default=os.path.join(SHARED, "tokenizers", "gpt2"))
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--latency-ms", type=float, default=25.0)
    p.add_argument("--files", type=int, default=16)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3, help="runs of each case (times: the median)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--root", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--cache-dir", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)

    sys.path.insert(0, os.path.join(REPO, "tests"))  # the S3 test server
    from s3server import S3Server

    scratch = tempfile.mkdtemp(prefix="node_cache_bench_")
    os.makedirs(os.path.join(scratch, "data"))
    size = write_files(os.path.join(scratch, "data"), args.files)
    server = S3Server(scratch, latency_ms=args.latency_ms)
    try:
        uri = server.upload(os.path.join(scratch, "data"), "data")
        env = {**os.environ, **server.env, "PYTHONPATH": REPO}
        runs: dict[str, list[dict]] = {}
        for repeat in range(args.repeat):  # cases in turn, so that a busy spell of the machine hits them alike
            cache = os.path.join(scratch, f"cache{repeat}")
            for name, folder in (("no cache", ""), ("cache, cold", cache), ("cache, warm", cache)):
                runs.setdefault(name, []).append(run_case(args, uri, env, folder, server))
        rows = [(name, _median(results)) for name, results in runs.items()]
    finally:
        server.stop()
    print(
        f"\n{args.ranks} ranks of one node, {args.files} gzip JSONL objects ({size:,} bytes), {args.latency_ms:g} ms "
        f"per request, {args.steps} steps of 8 lanes x 2048 tokens, median of {args.repeat} runs\n\n"
        "| case | GETs with data | all requests | bytes from the store | first batch (slowest rank) | of it, the loader's "
        "| all steps |\n|---|---|---|---|---|---|---|"
    )
    for name, r in rows:
        print(
            f"| {name} | {r['gets']} | {r['requests']} | {r['bytes']:,} | {r['first_batch_s']:.2f} s | {r['loader_s']:.2f} s | "
            f"{r['seconds']:.2f} s |"
        )
    for name, r in rows:
        print(name, "cache counters per rank:", r["cache"])
    if len({tuple(r["digests"]) for results in runs.values() for r in results}) != 1:
        raise SystemExit("the cases produced different rows")


if __name__ == "__main__":
    main()
