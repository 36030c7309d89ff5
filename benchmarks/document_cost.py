"""The cost per document: the in-process loader's tokens per CPU-second against the tokenizer's own bound on the
same documents, short or long (issue 47).

    python benchmarks/document_cost.py [--docs short|long] [--format jsonl|parquet] [--tokenizer DIR] [--steps 300]
                                       [--profile] [--plan]

The corpus is text every Python has, its files split in two: the measured half, and the other half that warms the
tokenizer. `short`: the pydoc topics and the standard library's modules (packages too) cut into paragraphs of
more than 80 characters (~150 tokens each, like short web pages and passages); `long`: the modules of 2-60 KB
whole. One source in 4 files (JSONL; Parquet with `--format parquet`), 8 lanes on one rank, rows of 2,048 tokens,
wrap packing, the fastokens backend; at most one pass over the documents (a document read twice would meet
fastokens' warm cache). The bound is fastokens' `encode_batch_flat` over the same documents in one pass, after it
was loaded and warmed on other text (the same cores, the same process), the median of 3 such instances. Both are
per CPU-second (all threads), beside the loader's wall time: on a noisy machine compare two checkouts by running
this with each on PYTHONPATH, in turn, several times.
`--profile` prints the loader's 25 most expensive functions (their own time); `--plan` times what `plan` computes of
the same lanes (each step's lane digests and tallies) instead of the rows alone. `--format parquet` writes the same
documents as 4 Parquet files (a text column, row groups of 1,000) instead of JSONL.

With JSONL it also prints the JSON floor: the least a CPython reader spends getting the texts out of the lines (one
UTF-8 decode, one scan by the standard library's C decoder and one field lookup per line, nothing else), as a share
of the bound: no loader that decodes JSONL with Python's json can come closer to the bound than that. Beside it,
the same for Arrow's JSON reader (`pyarrow.json`, one thread, 1 MiB reads, the texts as Python strings), the
vectorized reader issue 47 proposed.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))

import corpus  # noqa: E402 (examples/: the offline corpora and a trained BPE)


def stdlib_texts(part: int) -> list[str]:
    """The standard library's modules (packages too, site-packages not), every other file: part 0 is measured, part
    1 warms the tokenizer, so the bound's fastokens has never seen the measured text."""
    root = sysconfig.get_paths()["stdlib"]
    paths = sorted(
        os.path.join(folder, name)
        for folder, subfolders, names in os.walk(root)
        if "site-packages" not in folder
        for name in names
        if name.endswith(".py")
    )
    texts = []
    for path in paths[part::2]:
        with open(path, encoding="utf-8", errors="replace") as f:
            texts.append(f.read())
    return texts


def documents(kind: str, part: int = 0) -> list[str]:
    """`long`: modules of at most 60,000 bytes, whole; `short`: paragraphs of more than 80 characters (and, in part
    0, the pydoc topics')."""
    texts = stdlib_texts(part)
    if kind == "long":
        return [t for t in texts if 2_000 < len(t.encode()) <= 60_000]
    texts = (corpus.prose_documents() if part == 0 else []) + texts
    return [p.strip() for text in texts for p in text.split("\n\n") if len(p.strip()) > 80]


def median_cpu(run: Callable[[], object], passes: int = 3) -> float:
    """The median CPU seconds of `passes` calls of `run` (one pass of a few hundredths of a second swings alone)."""
    times = []
    for _ in range(passes):
        cpu = time.process_time()
        run()
        times.append(time.process_time() - cpu)
    return sorted(times)[passes // 2]


def json_floor(lines: list[bytes]) -> float:
    """CPU seconds to get the text out of every line the cheapest way CPython's json allows (as the loader's own
    inline scan does, without its checks)."""
    scan = json.JSONDecoder().scan_once

    def texts() -> None:
        for raw in lines:
            scan(raw.decode("utf-8", "surrogatepass"), 0)[0].get("text")

    return median_cpu(texts)


def arrow_json_floor(lines: list[bytes], block: int = 1 << 20) -> float:
    """CPU seconds for Arrow's JSON reader (C++, one thread) to get the texts out of the same lines as Python
    strings, in reads of `block` bytes (its fastest size here; a lane's batch of 64 lines costs ~3x as much a line)."""
    import pyarrow as pa
    import pyarrow.json as pj

    options = pj.ReadOptions(use_threads=False, block_size=block)
    parse = pj.ParseOptions(explicit_schema=pa.schema([("text", pa.string())]), unexpected_field_behavior="ignore")
    data = b"\n".join(lines) + b"\n"
    return median_cpu(
        lambda: (
            pj.read_json(pa.BufferReader(data), read_options=options, parse_options=parse).column("text").to_pylist()
        )
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", choices=["short", "long"], default="short")
    p.add_argument("--format", choices=["jsonl", "parquet"], default="jsonl")
    p.add_argument("--tokenizer", help="a tokenizer folder (default: a BPE trained here on the corpus)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--plan", action="store_true", help="what `plan` computes: each step's lane digests and tallies")
    args = p.parse_args()

    from zephon_titan.engine.lanes import LaneGroup
    from zephon_titan.testing import spec_from_table

    root = tempfile.mkdtemp(prefix="document_cost_")
    docs = documents(args.docs)
    lines = [json.dumps({"text": t}) for t in docs]
    for i in range(4):
        if args.format == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.table({"text": docs[i::4]}), os.path.join(root, f"part-{i}.parquet"), row_group_size=1000)
        else:
            with open(os.path.join(root, f"part-{i}.jsonl"), "w", encoding="utf-8") as f:
                f.writelines(line + "\n" for line in lines[i::4])
    tokenizer = args.tokenizer
    if tokenizer is None:
        tokenizer = os.path.join(root, "tokenizer")
        corpus.train_tokenizer(documents(args.docs, part=1)[:20_000], tokenizer, vocab_size=8000)
    table = {
        "num_lanes": 8,
        "seed": 1,
        "tokenizer_path": tokenizer,
        "tokenizer_backend": "fastokens",
        "sources": {"text": {"paths": [os.path.join(root, f"part-*.{args.format}")]}},
    }
    spec = spec_from_table(table, seq_len=2048)
    other = documents(args.docs, part=1)
    spec.tokenizer.encode(other[:2000])  # loads, checks and warms the loader's backend on other text (other files)
    # The bound's own instance, warmed alike: the loader's never meets the measured documents before it reads them.
    # The bound: 3 instances of its own, each warmed alike and timed over one pass, the median (a single pass is a
    # few tenths of a second, too short to time alone on a busy machine). The loader's never meets the measured
    # documents before it reads them.
    passes = []
    for _ in range(3):
        bound_tokenizer = spec_from_table(table, seq_len=2048).tokenizer
        bound_tokenizer.select_backend(announce=False)
        backend = bound_tokenizer._backend
        assert backend is not None
        backend.encode_flat(other[:2000])
        cpu = time.process_time()
        bound_tokens = len(backend.encode_flat(docs)[0])
        passes.append(time.process_time() - cpu)
        del bound_tokenizer, backend
    bound_cpu = sorted(passes)[1]
    bound = bound_tokens / bound_cpu
    floor = arrow_floor = None
    if args.format == "jsonl":
        encoded = [line.encode() for line in lines]
        floor, arrow_floor = json_floor(encoded), arrow_json_floor(encoded)

    # At most one pass over the documents: a document read again would be tokenized from fastokens' warm cache,
    # which the bound (one pass, never seen) does not have.
    steps = min(args.steps, int(0.9 * bound_tokens / (8 * 2048)) - 3)
    group = LaneGroup(spec, range(8), 1, None, 0)
    for _ in range(3):  # each lane's first windows read and tokenized
        group.next_step()
    profile = cProfile.Profile() if args.profile else None
    cpu, wall, tokens = time.process_time(), time.perf_counter(), 0
    if profile:
        profile.enable()
    if args.plan:  # the plan's per-step work on the same lanes (engine/lane_digests.py), no trainer
        from zephon_titan.engine.lane_digests import step_digests

        for _ in step_digests(group, len(spec.sources), 3, 3 + steps):
            tokens += 8 * 2048
    for _ in range(0 if args.plan else steps):
        tokens += sum(len(row.inputs) for lane in group.next_step() for row in lane)
    if profile:
        profile.disable()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    if floor is not None:
        print(
            f"JSON floor: {floor * 1e6 / len(docs):.2f} us of CPU per line = "
            f"{bound_cpu / (bound_cpu + floor):.2f} of the bound at best"
        )
    if arrow_floor is not None:
        print(
            f"Arrow's JSON reader: {arrow_floor * 1e6 / len(docs):.2f} us of CPU per line = "
            f"{bound_cpu / (bound_cpu + arrow_floor):.2f} of the bound at best"
        )
    print(
        f"{'plan, ' if args.plan else ''}{args.format}, {args.docs} documents ({len(docs):,}, "
        f"{bound_tokens / len(docs):,.0f} tokens each): bound "
        f"{bound / 1e6:.2f} M tokens per CPU-second; loader {tokens / cpu / 1e6:.2f} M per CPU-second "
        f"({tokens / wall / 1e6:.2f} M per wall second) = {tokens / cpu / bound:.3f} of the bound ({steps} steps)"
    )
    if profile:
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(25)
        print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
