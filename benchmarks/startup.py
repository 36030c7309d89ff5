"""Time to first batch against the number of files, with and without a source index, on local disk
and in object storage (a real S3-compatible server, moto, on loopback).

    python benchmarks/startup.py --files 10000 [--files 1000 ...] [--no-s3] [--formats jsonl]

For each (storage, format, index) case a fresh process builds the loader's spec, its fingerprint (what a
rank's checkpoint header holds) and produces the first batch of one rank (lane 0 of 8 lanes, 8 rows of 512
tokens): what every rank of a job pays before its first step, in wall time and in CPU time of the process
(per file, too). The S3 rows also count the requests the server saw. With an index, the run that writes it
(on first use) is timed too: the index build. All cases of one
invocation run side by side on the same files, so the ratios are comparable; absolute times depend
on the machine (and moto is slower per request than a real object store).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FORMATS = ("jsonl", "parquet")


def write_files(root: str, num_files: int, docs: list[str], formats: tuple[str, ...] = FORMATS) -> None:
    """`num_files` small files of each format, the same documents round-robin."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for fmt in formats:
        os.makedirs(os.path.join(root, fmt), exist_ok=True)
    for i in range(num_files):
        part = [docs[(i * 3 + k) % len(docs)] for k in range(3)]
        if "jsonl" in formats:
            with open(os.path.join(root, "jsonl", f"part-{i:06d}.jsonl"), "w", encoding="utf-8") as f:
                f.writelines(json.dumps({"text": t}) + "\n" for t in part)
        if "parquet" in formats:
            pq.write_table(pa.table({"text": part}), os.path.join(root, "parquet", f"part-{i:06d}.parquet"))


def child(args) -> None:
    """One case in a fresh process: startup + the first batch of lane 0."""
    from zephon_titan.config import DataConfig, SourceConfig
    from zephon_titan.engine import LaneStream, build_engine, fingerprint
    from zephon_titan.titan.tokenizer import load_tokenizer

    ext = "jsonl" if args.format == "jsonl" else "parquet"
    source = SourceConfig(
        name="docs",
        paths=[f"{args.root}/{args.format}/*.{ext}"],
        index=f"{args.root}/{args.format}.index.json" if args.index else "",
    )
    tokenizer = load_tokenizer(args.tokenizer)
    started, cpu = time.perf_counter(), time.process_time()
    spec = build_engine(DataConfig(sources=[source], num_lanes=8, seed=1), 512, tokenizer)
    fingerprint(spec)
    startup = time.perf_counter() - started
    LaneStream(spec, 0).take(8)
    print(
        json.dumps(
            {
                "startup_s": startup,
                "first_batch_s": time.perf_counter() - started,
                "first_batch_cpu_s": time.process_time() - cpu,
                "files": len(spec.sources[0].files),
                "blocks": spec.sources[0].num_blocks,
            }
        )
    )


def run_case(args, root: str, fmt: str, index: bool, env: dict, s3=None) -> dict:
    cmd = [sys.executable, __file__, "--child", "--root", root, "--format", fmt, "--tokenizer", args.tokenizer]
    if s3 is not None:
        s3.clear_requests()
    out = subprocess.run(cmd + (["--index"] if index else []), env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(out.stderr[-3000:])
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if s3 is not None:
        result["requests"] = len(s3.requests())
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, action="append", help="number of files (repeatable); default 10000")
    p.add_argument("--no-s3", action="store_true", help="local disk only")
    p.add_argument("--formats", default=",".join(FORMATS), help="comma-separated (default: jsonl,parquet)")
    p.add_argument("--tokenizer", help="directory with tokenizer.json (default: train a small one)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--root", help=argparse.SUPPRESS)
    p.add_argument("--format", help=argparse.SUPPRESS)
    p.add_argument("--index", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)

    sys.path[:0] = [os.path.join(REPO, "examples"), os.path.join(REPO, "tests")]  # corpora; the S3 test server
    import corpus
    from s3server import S3Server

    scratch = tempfile.mkdtemp(prefix="startup_bench_")
    docs = corpus.prose_documents()
    if not args.tokenizer:
        args.tokenizer = corpus.train_tokenizer(docs, os.path.join(scratch, "tokenizer"), vocab_size=2000)
    s3 = None if args.no_s3 else S3Server(scratch)
    rows = []
    try:
        for num_files in args.files or [10000]:
            root = os.path.join(scratch, f"n{num_files}")
            formats = tuple(args.formats.split(","))
            write_files(root, num_files, docs, formats)
            places = [("local", root, dict(os.environ), None)]
            if s3 is not None:
                started = time.perf_counter()
                uri = s3.upload(root, f"n{num_files}")
                print(f"uploaded {2 * num_files:,} files in {time.perf_counter() - started:.0f} s", flush=True)
                places.append(("s3 (moto)", uri, {**os.environ, **s3.env}, s3))
            for place, where, env, server in places:
                for fmt in formats:
                    for index in (False, True):
                        build = None
                        if index:  # written by a first run (on first use), then read by the measured one
                            build = run_case(args, where, fmt, True, env, server)["startup_s"]
                        result = run_case(args, where, fmt, index, env, server)
                        rows.append(
                            {"files": num_files, "storage": place, "format": fmt, "index": index, "index_build_s": build,
                             **result}
                        )  # fmt: skip
                        print(json.dumps(rows[-1]), flush=True)
    finally:
        if s3 is not None:
            s3.stop()
    print(
        "\n| files | storage | format | index | startup | time to first batch | CPU to first batch | CPU per file "
        "| index build | requests |\n|---|---|---|---|---|---|---|---|---|---|"
    )
    for r in rows:
        build = f"{r['index_build_s']:.2f} s" if r["index_build_s"] is not None else "-"
        print(
            f"| {r['files']:,} | {r['storage']} | {r['format']} | {'yes' if r['index'] else 'no'} | "
            f"{r['startup_s']:.2f} s | {r['first_batch_s']:.2f} s | {r['first_batch_cpu_s']:.2f} s | "
            f"{1e6 * r['first_batch_cpu_s'] / r['files']:.1f} us | {build} | {r.get('requests', '-')} |"
        )


if __name__ == "__main__":
    main()
