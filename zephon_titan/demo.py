"""Elastic-resume demo on bundled offline text (engine level, no GPU, no torchrun).

Builds a corpus from text every Python install has (the standard library's source
as a `code` source in Parquet, the pydoc topics as a `prose` source in JSONL),
trains a small BPE tokenizer on it, then:

  1. runs 2 data-parallel "ranks" for N steps without interruption;
  2. runs 2 ranks to step K, saves every lane's state as JSON (a checkpoint);
  3. resumes that checkpoint on 4 ranks and on 1 rank;
and prints every step's global-batch SHA-256 side by side.

    python -m zephon_titan.demo [--out demo_out] [--steps 8] [--save-at 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from zephon_titan.config import DataConfig, SourceConfig
from zephon_titan.engine import (
    LaneGroup, LaneState, batch_digest, build_engine, fingerprint, lane_digest, lanes_of_rank, rows_per_lane,
)
from zephon_titan.testing import corpus

NUM_LANES, GLOBAL_BATCH, SEQ_LEN = 8, 16, 128


def build_corpus(out: str) -> DataConfig:
    prose, code = corpus.prose_documents(), corpus.code_documents(max_files=60)
    tokenizer = os.path.join(out, "tokenizer")
    if not os.path.exists(os.path.join(tokenizer, "tokenizer.json")):
        corpus.train_tokenizer(prose + code, tokenizer, vocab_size=2000)  # <= llama3 debugmodel's 2048
        corpus.write_jsonl(prose, os.path.join(out, "prose"), num_files=4)
        corpus.write_parquet(code, os.path.join(out, "code"), num_files=3, row_group_size=5)
    return DataConfig(
        sources=[
            SourceConfig(name="code", paths=[os.path.join(out, "code", "*.parquet")], weight=0.3),
            SourceConfig(name="prose", paths=[os.path.join(out, "prose", "*.jsonl")], weight=0.7, block_bytes=32768),
        ],
        num_lanes=NUM_LANES,
        seed=2026,
        tokenizer_path=tokenizer,
    )


def run(spec, world_size: int, first_step: int, last_step: int, states: dict | None = None):
    """Global-batch digests of steps [first_step, last_step) and the lane states after them."""
    groups = [
        LaneGroup(spec, lanes_of_rank(spec.num_lanes, world_size, r), rows_per_lane(GLOBAL_BATCH, spec.num_lanes),
                  states=states)
        for r in range(world_size)
    ]
    digests = {}
    for step in range(first_step, last_step):
        # Each rank hashes its own lanes; only the 32-byte lane digests would cross ranks.
        lane_digests = [lane_digest(rows) for g in groups for rows in g.next_step()]
        digests[step] = batch_digest(lane_digests)
    saved = {lane: s.to_dict() for g in groups for lane, s in g.state().items()}
    return digests, saved


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="demo_out")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--save-at", type=int, default=3)
    p.add_argument("--build-only", action="store_true", help="only write the corpus and tokenizer")
    args = p.parse_args(argv)
    if args.build_only:
        build_corpus(args.out)
        print(f"corpus and tokenizer written to {args.out}/")
        return 0

    print(f"building the corpus and tokenizer in {args.out}/ ...", flush=True)
    spec = build_engine(build_corpus(args.out), seq_len=SEQ_LEN)
    print(f"sources: {', '.join(f'{s.name} ({s.num_blocks} blocks)' for s in spec.sources)}; "
          f"{NUM_LANES} lanes, global batch {GLOBAL_BATCH} rows of {SEQ_LEN} tokens")
    print(f"fingerprint: {json.dumps(fingerprint(spec))}\n")

    reference, _ = run(spec, 2, 0, args.steps)
    _, checkpoint = run(spec, 2, 0, args.save_at)
    path = os.path.join(args.out, f"lanes_step{args.save_at}.json")
    with open(path, "w") as f:
        json.dump(checkpoint, f)
    print(f"saved the 2-rank state at step {args.save_at}: {path} ({os.path.getsize(path)} bytes for {NUM_LANES} lanes)")
    with open(path) as f:
        states = {int(lane): LaneState.from_dict(s) for lane, s in json.load(f).items()}
    resumed = {w: run(spec, w, args.save_at, args.steps, states)[0] for w in (4, 1)}

    print(f"\n{'step':>4}  {'2 ranks, uninterrupted':<24} {'resumed on 4':<14} {'resumed on 1':<14}")
    ok = True
    for step in range(args.steps):
        cells = []
        for w in (4, 1):
            if step < args.save_at:
                cells.append("(before save)")
            else:
                same = resumed[w][step] == reference[step]
                ok &= same
                cells.append("same" if same else "DIFFERENT")
        print(f"{step:>4}  {reference[step][:20]}...  {cells[0]:<14} {cells[1]:<14}")
    print("\nevery resumed global batch is SHA-256-identical" if ok else "\nMISMATCH: resumed batches differ")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
