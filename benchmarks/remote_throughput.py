"""Packed tokens/s of one rank reading from object storage vs. local disk, with and without read-ahead.

    python benchmarks/remote_throughput.py [--latency-ms 0 --latency-ms 25] [--rows 96]

The same JSONL files (default: the C4 and Wikipedia samples of ../shared/data) are read from local disk and
from moto's S3 server on loopback, which adds `--latency-ms` before every response (an object store's time to
first byte; real S3 is typically 10-50 ms). Each case is a fresh process producing `--rows` rows of 2048 tokens
for each of the 8 lanes of one rank, in process; every case must produce the same rows (checked by digest).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "data"))


def child(args) -> None:
    from zephon_titan.config import DataConfig, SourceConfig
    from zephon_titan.engine import build_engine, source_reader
    from zephon_titan.engine.lanes import LaneGroup
    from zephon_titan.titan.tokenizer import load_tokenizer

    source_reader.READ_AHEAD_REMOTE = args.read_ahead
    sources = [
        SourceConfig(name=name, paths=[f"{args.root}/{name}/*.jsonl"], block_bytes=128 << 10, weight=w)
        for name, w in (("c4", 0.6), ("wiki", 0.4))
    ]
    spec = build_engine(DataConfig(sources=sources, num_lanes=8, seed=1), 2048, load_tokenizer(args.tokenizer))
    group = LaneGroup(spec, range(8), 1)
    digest = hashlib.sha256()
    started = time.perf_counter()
    tokens = 0
    for _ in range(args.rows):
        for lane_rows in group.next_step():
            for row in lane_rows:
                tokens += spec.seq_len
                digest.update(row.to_bytes())
    seconds = time.perf_counter() - started
    print(json.dumps({"tokens_per_s": tokens / seconds, "seconds": seconds, "digest": digest.hexdigest()[:16]}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", default=os.path.join(SHARED, "tokenizers", "gpt2"))
    p.add_argument("--c4", default=os.path.join(SHARED, "corpus", "c4_en_sample", "part-00000.jsonl"))
    p.add_argument("--wiki", default=os.path.join(SHARED, "corpus", "wikipedia_en_sample", "part-00000.jsonl"))
    p.add_argument("--latency-ms", type=float, action="append", help="S3 latency cases (default 0 and 25)")
    p.add_argument("--rows", type=int, default=96, help="rows per lane")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--root", help=argparse.SUPPRESS)
    p.add_argument("--read-ahead", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)

    sys.path.insert(0, os.path.join(REPO, "tests"))  # the S3 test server
    from s3server import S3Server

    scratch = tempfile.mkdtemp(prefix="remote_bench_")
    for name in ("c4", "wiki"):
        os.makedirs(os.path.join(scratch, "data", name))
        os.symlink(os.path.abspath(getattr(args, name)), os.path.join(scratch, "data", name, "part-00000.jsonl"))
    places = [("local", os.path.join(scratch, "data"), dict(os.environ), None)]
    servers = []
    for latency in args.latency_ms or [0.0, 25.0]:
        server = S3Server(scratch, latency_ms=latency)
        servers.append(server)
        uri = server.upload(os.path.join(scratch, "data"), "data")
        places.append((f"s3, {latency:g} ms per request", uri, {**os.environ, **server.env}, server))
    rows = []
    try:
        for place, root, env, server in places:
            for ahead in (False,) if place == "local" else (False, True):
                cmd = [
                    sys.executable,
                    __file__,
                    "--child",
                    "--root",
                    root,
                    "--tokenizer",
                    args.tokenizer,
                    "--rows",
                    str(args.rows),
                ] + (["--read-ahead"] if ahead else [])
                server_cpu = _cpu_seconds(server.proc.pid) if server else 0.0
                out = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if out.returncode != 0:
                    raise SystemExit(out.stderr[-3000:])
                result = json.loads(out.stdout.strip().splitlines()[-1])
                result["server_cpu_s"] = (_cpu_seconds(server.proc.pid) - server_cpu) if server else 0.0
                rows.append({"place": place, "read_ahead": ahead, **result})
                print(json.dumps(rows[-1]), flush=True)
    finally:
        for server in servers:
            server.stop()
    base = rows[0]["tokens_per_s"]
    print(
        "\n| data | read-ahead | packed tokens/s | vs local | S3 server CPU (same 2 cores) | rows digest |\n"
        "|---|---|---|---|---|---|"
    )
    for r in rows:
        print(
            f"| {r['place']} | {'yes' if r['read_ahead'] else 'no'} | {r['tokens_per_s'] / 1e6:.3f} M | "
            f"{r['tokens_per_s'] / base:.0%} | {r['server_cpu_s']:.2f} s of {r['seconds']:.2f} s | {r['digest']} |"
        )
    if len({r["digest"] for r in rows}) != 1:
        raise SystemExit("the cases produced different rows")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main()
