"""Single-process engine throughput on real text, side by side with the raw tokenizer.

    python scripts/bench_engine.py --tokenizer ../shared/data/tokenizers/gpt2 \
        --source c4=../shared/data/corpus/c4_en_sample/*.jsonl \
        --source wiki=../shared/data/corpus/wikipedia_en_sample/*.jsonl --seq-len 2048 --lanes 8

Reports, measured in one run on the same texts: the raw tokenizer's encode_batch
tokens/s (the upper bound on these cores), the engine's packed tokens/s for one
lane and for all lanes of one rank, their ratio, and the checkpoint state size.
"""

from __future__ import annotations

import argparse
import json
import time

from zephon_titan.config import SourceConfig, DataConfig
from zephon_titan.engine import LaneGroup, LaneStream, build_engine


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--source", action="append", required=True, help="name=glob[:weight]")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--lanes", type=int, default=8)
    p.add_argument("--rows", type=int, default=400, help="rows per measurement")
    p.add_argument("--packing", default="wrap")
    args = p.parse_args()

    sources = []
    for spec in args.source:
        name, rest = spec.split("=", 1)
        path, _, weight = rest.partition(":")
        sources.append(SourceConfig(name=name, paths=[path], weight=float(weight or 1), block_bytes=1 << 18))
    config = DataConfig(sources=sorted(sources, key=lambda s: s.name), num_lanes=args.lanes,
                        tokenizer_path=args.tokenizer, packing=args.packing)
    spec = build_engine(config, seq_len=args.seq_len)

    texts = []
    for source in spec.sources:
        for b in range(min(source.num_blocks, 8)):
            texts.extend(source.read_block(b).texts)
    t0 = time.perf_counter()
    raw_tokens = sum(len(e.ids) for e in spec.tokenizer.tokenizer.encode_batch_fast(texts, add_special_tokens=False))
    raw_rate = raw_tokens / (time.perf_counter() - t0)

    stream = LaneStream(spec, 0)
    t0 = time.perf_counter()
    stream.take(args.rows)
    lane_rate = args.rows * spec.row_tokens / (time.perf_counter() - t0)

    per_lane = max(1, args.rows // args.lanes)
    with LaneGroup(spec, range(args.lanes), rows_per_step=per_lane) as group:
        t0 = time.perf_counter()
        group.next_step()
        group_rate = per_lane * args.lanes * spec.row_tokens / (time.perf_counter() - t0)
        states = group.state()
    state_bytes = [len(json.dumps(s.to_dict()).encode()) for s in states.values()]

    print(f"texts: {len(texts)} documents, {raw_tokens:,} tokens; seq_len {args.seq_len}, {args.lanes} lanes")
    print(f"raw tokenizer encode_batch      : {raw_rate / 1e6:6.3f} M tokens/s")
    print(f"engine, one lane                : {lane_rate / 1e6:6.3f} M tokens/s ({lane_rate / raw_rate:.0%} of raw)")
    print(f"engine, {args.lanes} lanes of one rank      : {group_rate / 1e6:6.3f} M tokens/s ({group_rate / raw_rate:.0%} of raw)")
    print(f"state per lane (JSON)           : {min(state_bytes)}-{max(state_bytes)} bytes")


if __name__ == "__main__":
    main()
