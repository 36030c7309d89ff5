"""Test helpers: build engines from small configs, compare row streams."""

from __future__ import annotations

import hashlib
import os

from zephon_titan.config import config_from_dict
from zephon_titan.engine import LaneState, LaneStream, build_engine


def data_table(corpus_dir: str, tokenizer_dir: str, **overrides) -> dict:
    """A `[dataloader]` table over the test corpus (prose JSONL + code Parquet)."""
    sources = overrides.pop("sources") if "sources" in overrides else {
        "code": {"paths": [os.path.join(corpus_dir, "code", "*.parquet")], "weight": 0.4},
        "prose": {"paths": [os.path.join(corpus_dir, "prose", "*.jsonl")], "weight": 0.6, "block_bytes": 16384},
    }
    table = {"num_lanes": 8, "seed": 7, "tokenizer_path": tokenizer_dir, "shuffle_window_blocks": 2, "sources": sources}
    table.update(overrides)
    return table


def make_spec(corpus_dir: str, tokenizer_dir: str, seq_len: int = 64, **overrides):
    return build_engine(config_from_dict(data_table(corpus_dir, tokenizer_dir, **overrides)), seq_len=seq_len)


def rows_digest(rows) -> str:
    h = hashlib.sha256()
    for row in rows:
        h.update(row.to_bytes())
    return h.hexdigest()


def assert_restores_exactly(spec_factory, lane_id: int, cut: int, after: int) -> None:
    """Take `cut` rows, snapshot, and check that a fresh engine restored from the JSON state
    continues with the same `after` rows as the uninterrupted stream."""
    reference = LaneStream(spec_factory(), lane_id)
    reference.take(cut)
    saved = reference.state().to_dict()
    expected = reference.take(after)
    restored = LaneStream(spec_factory(), lane_id, LaneState.from_dict(saved))
    got = restored.take(after)
    assert [r.to_bytes() for r in got] == [r.to_bytes() for r in expected], f"lane {lane_id} diverged after cut {cut}"
    assert restored.state() == reference.state()
