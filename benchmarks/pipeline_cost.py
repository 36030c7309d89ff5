"""What a source's keep and repeat cost: the same Parquet documents read by lanes with and without them.

    python benchmarks/pipeline_cost.py [--docs 20000] [--rows 3000] [--pairs 5] [--root DIR] [--only CASE]

The Python documentation topics (examples/corpus.py), repeated to `--docs` documents, written as Parquet (256 rows
a row group) with a quality, a language and a nested meta column, tokenized by a byte-level BPE trained on them.
Each case runs 8 lanes in this process (LaneGroup, wrap packing, 2,048-token rows) for `--rows` rows and counts
the tokens of the rows: CPU seconds of this process (time.process_time) beside wall seconds, the cases
alternating `--pairs` times so that they meet the same load. Cases:

- none: no keep, no repeat (the loader's path without a pipeline);
- keep all: `keep = "quality >= 0 and lang is not null"`, true for every document (the predicate's cost alone);
- keep half: `keep = "quality >= 0.5"`;
- repeat: `repeat = "min(quality * 2, 1.5)"` (copies, and slots skipped where a pass trains fewer);
- transform: a pure-Python cleanup per record (regular expressions over the text), in process;
- transform, 2 workers: the same in 2 worker processes (`num_workers = 2`): whole-process CPU includes the
  workers' (time.process_time does not, so that case reports the children's CPU too).

`--root DIR` keeps the corpus there (written once) and `--only none` runs one case once: the path without a
pipeline timed from outside against an older checkout (farm-bench, PYTHONPATH naming each checkout).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "examples")]

import corpus  # noqa: E402

from zephon_titan.testing import spec_from_table  # noqa: E402

CASES = {
    "none": {},
    "keep all": {"keep": "quality >= 0 and lang is not null"},
    "keep half": {"keep": "quality >= 0.5"},
    "repeat": {"repeat": "min(quality * 2, 1.5)"},
    "transform": {"transform": ["bench_cleanup:clean"]},
    "transform, 2 workers": {"transform": ["bench_cleanup:clean"]},
}
WORKERS = {"transform, 2 workers": 2}
CLEANUP = """
import re

_SPACES = re.compile(r"[ \\t]+")
_BLANKS = re.compile(r"\\n{3,}")


def clean(record):
    lines = [_SPACES.sub(" ", line).strip() for line in record["text"].splitlines()]
    text = _BLANKS.sub("\\n\\n", "\\n".join(line for line in lines if not line.startswith("***")))
    return text if len(text) > 20 else None
"""


def write_corpus(root: str, docs: int) -> str:
    texts = corpus.prose_documents()
    texts = (texts * (docs // len(texts) + 1))[:docs]
    table = pa.table(
        {
            "text": texts,
            "quality": [((i * 7919) % 1000) / 1000 for i in range(docs)],
            "lang": [["en", "de", "fr"][i % 3] for i in range(docs)],
            "meta": [{"site": f"s{i % 7}", "score": i % 5} for i in range(docs)],
        }
    )
    os.makedirs(f"{root}/data", exist_ok=True)
    for f in range(4):
        pq.write_table(table.slice(f * docs // 4, docs // 4), f"{root}/data/part-{f}.parquet", row_group_size=256)
    corpus.train_tokenizer(texts[:2000], f"{root}/tok", vocab_size=4000)
    with open(f"{root}/bench_cleanup.py", "w") as f:
        f.write(CLEANUP)
    return root


def run(root: str, case: dict, rows: int, workers: int = 0) -> tuple[float, float, int]:
    """(CPU seconds, wall seconds, tokens) for `rows` rows of 8 lanes (CPU: this process and its children)."""
    from zephon_titan.engine import open_lane_group

    table = {
        "num_lanes": 8,
        "seed": 1,
        "tokenizer_path": f"{root}/tok",
        "tokenizer_backend": "tokenizers",
        "sources": {"web": {"paths": [f"{root}/data/*.parquet"], **case}},
    }
    c0, w0 = _cpu(), time.perf_counter()
    spec = spec_from_table(table, seq_len=2048)
    tokens = 0
    with open_lane_group(spec, range(8), 1, num_workers=workers) as group:
        for _ in range(rows // 8):
            for lane in group.next_step():
                for row in lane:
                    tokens += len(row.inputs) - row.padding
    return _cpu() - c0, time.perf_counter() - w0, tokens


def _cpu() -> float:
    """CPU seconds of this process and of its children that ended (worker processes)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=20000)
    parser.add_argument("--rows", type=int, default=3000)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--root", help="the corpus folder (written if it has none)")
    parser.add_argument("--only", choices=sorted(CASES), help="run this case once, print nothing")
    args = parser.parse_args()
    root = args.root or tempfile.mkdtemp(prefix="zephon_pipeline_")
    if not os.path.exists(f"{root}/bench_cleanup.py"):
        write_corpus(root, args.docs)
    sys.path.insert(0, root)  # the transform's module, imported by name (workers inherit the path)
    if args.only:
        run(root, CASES[args.only], args.rows)
        return
    run(root, {}, 64)  # warm: imports, the page cache
    cpu: dict[str, list[float]] = {name: [] for name in CASES}
    wall: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.pairs):
        for name, case in CASES.items():
            c, w, tokens = run(root, case, args.rows, WORKERS.get(name, 0))
            cpu[name].append(tokens / c)
            wall[name].append(tokens / w)
    base_cpu, base_wall = statistics.median(cpu["none"]), statistics.median(wall["none"])
    print(f"{args.docs:,} documents, {args.rows:,} rows of 2,048 tokens, 8 lanes in process, {args.pairs} rounds")
    print(f"{'case':<20} {'tokens/CPU-s':>13} {'vs none':>8} {'tokens/s':>12} {'vs none':>8}")
    for name in CASES:
        c, w = statistics.median(cpu[name]), statistics.median(wall[name])
        print(f"{name:<20} {c:>13,.0f} {c / base_cpu:>8.3f} {w:>12,.0f} {w / base_wall:>8.3f}")


if __name__ == "__main__":
    main()
