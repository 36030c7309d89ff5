"""What a lane holds (issue 28, "lanes that cost little"): where its documents are, not their bytes;
blocks shared by the lanes of a process. benchmarks/lane_cost.py measures it; the rows are unchanged
(test_stream.py, test_step_hashes.py, test_old_checkpoint.py)."""

from __future__ import annotations

import gc
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import make_spec, rows_digest

from zephon_titan.config import SourceConfig
from zephon_titan.engine import LaneStream, feed
from zephon_titan.engine.sources import jsonl, open_source
from zephon_titan.errors import DataError


def _jsonl(tmp_path, texts, name="a"):
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path, open_source(SourceConfig(name="web", paths=[str(path)]))


def _held_bytes_of(block):
    """The raw bytes a JSONL block keeps (white box: its loader's closure), or None."""
    load = block.texts._load
    return dict(zip(load.__code__.co_freevars, (c.cell_contents for c in load.__closure__)))["held"]


def test_past_the_process_budget_a_local_jsonl_block_reads_each_document_when_it_is_due(tmp_path, monkeypatch):
    monkeypatch.setattr(jsonl, "_held_bytes", jsonl._ByteBudget(0))  # the budget is spent (thousands of lanes)
    path, source = _jsonl(tmp_path, ["one", "two", "three"])
    block = source.read_block(0)
    assert list(block.texts) == ["one", "two", "three"] and block.rows == [0, 16, 32]
    assert _held_bytes_of(block) is None
    path.write_text(path.read_text().replace("three", "THREE"))  # same size, new mtime
    with pytest.raises(DataError, match="modified"):
        block.texts[2]  # read from the file now: refused, never the new bytes


def test_within_the_budget_a_block_keeps_its_bytes_and_gives_them_back(tmp_path, monkeypatch):
    budget = jsonl._ByteBudget(60)
    monkeypatch.setattr(jsonl, "_held_bytes", budget)
    _, source = _jsonl(tmp_path, ["one", "two", "three"])  # 50 bytes
    block = source.read_block(0)
    assert _held_bytes_of(block) is not None and budget.used == 50
    _, other = _jsonl(tmp_path, ["four", "five", "six"], name="b")
    over = other.read_block(0)  # 50 more bytes do not fit
    assert _held_bytes_of(over) is None and list(over.texts) == ["four", "five", "six"]
    assert list(block.texts) == ["one", "two", "three"]  # the same texts either way
    del block
    gc.collect()
    assert budget.used == 0  # released with the last window holding the block


def test_lanes_of_a_process_share_a_block_while_one_holds_it(tmp_path):
    _, source = _jsonl(tmp_path, ["one", "two"])
    held = source.read_block(0)
    assert source.read_block(0) is held
    del held
    gc.collect()
    assert not source._held  # released with the last window holding it


def test_a_parquet_block_holds_its_column_not_a_python_object_per_row(tmp_path):
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"text": [f"doc {i}" for i in range(1000)]}), path, row_group_size=500)
    source = open_source(SourceConfig(name="pq", paths=[str(path)]))
    block = source.read_block(1)
    assert block.rows == range(500, 1000) and block.texts[7] == "doc 507" and len(block.texts) == 500
    assert block.texts[-1] == "doc 999" and block.texts[:2] == ["doc 500", "doc 501"]


def test_rows_do_not_depend_on_the_process_budgets(corpus_dir, tokenizer_dir, monkeypatch):
    """The batch of documents tokenized together and whether a block keeps its bytes follow how many lanes
    a process holds; rows must not. Both budgets at their extremes give the same rows; negative control:
    another seed differs."""

    def rows(seed=7):
        spec = make_spec(corpus_dir, tokenizer_dir, num_lanes=2, seed=seed)
        return [rows_digest(LaneStream(spec, lane).take(12)) for lane in range(2)]

    expected = rows()
    monkeypatch.setattr(feed, "TOKENIZE_BATCH_CHARS", (1, 1))  # every document tokenized alone
    monkeypatch.setattr(jsonl, "_held_bytes", jsonl._ByteBudget(0))  # every line read when it is due
    assert rows() == expected
    monkeypatch.setattr(feed, "TOKENIZE_BATCH_CHARS", (1 << 30, 1 << 30))  # batches end at TOKENIZE_BATCH docs
    monkeypatch.setattr(jsonl, "_held_bytes", jsonl._ByteBudget(1 << 40))
    assert rows() == expected
    assert rows(seed=8) != expected
