"""What a lane holds (issue 28, "lanes that cost little"): where its documents are, not their bytes;
blocks shared by the lanes of a process. benchmarks/lane_cost.py measures it; the rows are unchanged
(test_stream.py, test_step_hashes.py, test_old_checkpoint.py)."""

from __future__ import annotations

import gc
import json
import time
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import make_spec, rows_digest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_titan.config import SourceConfig
from zephon_titan.engine import LaneStream, feed, open_lane_group
from zephon_titan.engine.sources import jsonl, open_source
from zephon_titan.engine.sources.parquet import ParquetSource
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


def _counting_reads(monkeypatch, source, pause: float = 0.0):
    """Count the source's block reads (the real read runs, after `pause`: reads of several threads overlap)."""
    reads: list[int] = []
    real = source._read

    def read(file_index, local_block):
        reads.append(local_block)
        time.sleep(pause)
        return real(file_index, local_block)

    monkeypatch.setattr(source, "_read", read)
    return reads


def test_lanes_asking_for_a_block_being_read_wait_for_that_read(tmp_path, monkeypatch):
    """Lanes started together read their first Parquet windows in threads (feed.py): a row group is
    decoded once however many lanes (threads) ask for it at once. Negative control: once no lane holds
    it, the next request reads it again."""
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"text": [f"doc {i}" for i in range(100)]}), path, row_group_size=50)
    source = open_source(SourceConfig(name="pq", paths=[str(path)]))
    assert source.decodes_in_threads
    reads = _counting_reads(monkeypatch, source, pause=0.05)
    with ThreadPoolExecutor(max_workers=4) as pool:
        soon = [source.read_block_soon(1, pool) for _ in range(3)]
        now = list(pool.map(source.read_block, [1] * 4))
        blocks = [f.result() for f in soon] + now
    assert reads == [1] and all(b is blocks[0] for b in blocks) and blocks[0].texts[0] == "doc 50"
    del blocks, soon, now
    gc.collect()
    assert source.read_block(1).texts[0] == "doc 50" and reads == [1, 1]


def test_a_failed_read_reaches_every_lane_waiting_for_it_and_the_next_request_reads_again(tmp_path, monkeypatch):
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"text": ["a", "b"]}), path)
    source = open_source(SourceConfig(name="pq", paths=[str(path)]))
    reads = _counting_reads(monkeypatch, source)
    counted = source._read

    def unreadable(file_index, local_block):
        counted(file_index, local_block)
        raise DataError("unreadable")

    monkeypatch.setattr(source, "_read", unreadable)
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [source.read_block_soon(0, pool) for _ in range(2)]
        for future in futures:
            with pytest.raises(DataError, match="unreadable"):
                future.result()
    monkeypatch.setattr(source, "_read", counted)
    assert list(source.read_block(0).texts) == ["a", "b"] and reads == [0, 0]


def test_rows_do_not_depend_on_reading_the_first_windows_in_threads(corpus_dir, tokenizer_dir, monkeypatch):
    """Negative control: another seed differs."""

    def rows(seed=7):
        spec = make_spec(corpus_dir, tokenizer_dir, num_lanes=3, seed=seed)
        group = open_lane_group(spec, range(3), 1)
        return rows_digest([row for _ in range(8) for lane in group.next_step() for row in lane])

    expected = rows()
    monkeypatch.setattr(ParquetSource, "decodes_in_threads", False)
    assert rows() == expected
    assert rows(seed=8) != expected


_LINES = st.one_of(
    st.text(max_size=300).map(lambda t: json.dumps({"text": t})),
    st.text(" \t\r\x0b\x0c", max_size=3),  # blank: not a document
    st.text(" \t", min_size=1, max_size=2).map(lambda pad: pad + json.dumps({"text": "padded"}) + pad),
)


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(_LINES, max_size=12), newline_at_end=st.booleans(), block_bytes=st.sampled_from([1024, 1 << 20]))
def test_a_jsonl_block_finds_the_lines_split_finds(tmp_path_factory, lines, newline_at_end, block_bytes):
    """A block's documents are found without copying each line out; they must be exactly the non-blank
    lines that bytes.split(b"\\n") gives (byte offsets and texts), whatever the blocks' size. Negative
    control: the blank lines are there to be skipped (counting every line would differ when one is)."""
    data = ("\n".join(lines) + ("\n" if newline_at_end else "")).encode()
    path = tmp_path_factory.mktemp("lines") / "a.jsonl"
    path.write_bytes(data)
    expected, offset = [], 0
    for line in data.split(b"\n"):
        if line.strip():
            expected.append((offset, json.loads(line)["text"]))
        offset += len(line) + 1
    if not expected:
        return  # an empty source is refused elsewhere (test_sources.py)
    source = open_source(SourceConfig(name="web", paths=[str(path)], block_bytes=block_bytes))
    found = [(row, text) for b in range(source.num_blocks) for row, text in zip(*_rows_and_texts(source, b))]
    assert found == expected
    if any(not line.strip() for line in lines):
        assert len(found) < len(data.split(b"\n"))


def _rows_and_texts(source, block):
    docs = source.read_block(block)
    return docs.rows, list(docs.texts)
