"""What a lane holds (issue 28, "lanes that cost little"): where its documents are, not their bytes;
blocks shared by the lanes of a process. benchmarks/lane_cost.py measures it; the rows are unchanged
(test_stream.py, test_step_hashes.py, test_old_checkpoint.py)."""

from __future__ import annotations

import gc
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import make_spec, rows_digest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_titan.config import SourceConfig
from zephon_titan.engine import LaneGroup, LaneStream, encode_calls, feed, open_lane_group
from zephon_titan.engine.lanes import TOKENS_PER_VISIT, steps_per_visit
from zephon_titan.engine.sources import jsonl, open_source
from zephon_titan.engine.sources.parquet import ParquetSource
from zephon_titan.engine.state import SourceCursor
from zephon_titan.errors import DataError, LaneExhausted


def _jsonl(tmp_path, texts, name="a"):
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path, open_source(SourceConfig(name="web", paths=[str(path)]))


def _held_bytes_of(block):
    """The raw bytes a JSONL block keeps (white box: its loader's closure), or None."""

    def closure(f):
        return dict(zip(f.__code__.co_freevars, (c.cell_contents for c in f.__closure__)))

    return closure(closure(block.texts._load)["line"])["held"]


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
    monkeypatch.setattr(encode_calls, "TOKENIZE_BATCH_CHARS", (1, 1))  # every document tokenized alone
    monkeypatch.setattr(jsonl, "_held_bytes", jsonl._ByteBudget(0))  # every line read when it is due
    assert rows() == expected
    monkeypatch.setattr(encode_calls, "TOKENIZE_BATCH_CHARS", (1 << 30, 1 << 30))  # batches end at TOKENIZE_BATCH docs
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
    both_asked = threading.Event()

    def unreadable(file_index, local_block):
        counted(file_index, local_block)
        both_asked.wait(10)  # the second lane asks while this read is under way (not after it failed)
        raise DataError("unreadable")

    monkeypatch.setattr(source, "_read", unreadable)
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [source.read_block_soon(0, pool) for _ in range(2)]
        both_asked.set()
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


def _counting_encode_calls(monkeypatch, spec) -> list[int]:
    """The texts of each of the spec's encode calls (the real encode runs)."""
    calls: list[int] = []
    real = spec.tokenizer.encode

    def encode(texts, *args):
        calls.append(len(texts))
        return real(texts, *args)

    monkeypatch.setattr(spec.tokenizer, "encode", encode)
    return calls


@pytest.fixture(scope="module")
def short_documents(tmp_path_factory):
    """Two JSONL sources of 3,000 short documents each: a row of 256 tokens takes several, so lanes encode often."""
    root = tmp_path_factory.mktemp("short_documents")
    words = "data loader lanes rows tokens batch shuffle window mixture packing resume checkpoint".split()
    sources = {}
    for name, stride in (("a", 3), ("b", 5)):
        texts = [" ".join(words[(i * stride + k) % len(words)] for k in range(3 + i % 9)) for i in range(3000)]
        (root / f"{name}.jsonl").write_text(
            "".join(json.dumps({"text": f"{i} {t}"}) + "\n" for i, t in enumerate(texts))
        )
        sources[name] = {"paths": [str(root / f"{name}.jsonl")], "block_bytes": 1 << 20}
    return sources


def _group_rows(spec, num_lanes: int, steps: int) -> list[str]:
    with open_lane_group(spec, range(num_lanes), 2) as group:
        produced = [group.next_step() for _ in range(steps)]
    return [rows_digest(row for step in produced for row in step[lane]) for lane in range(num_lanes)]


@settings(max_examples=8, deadline=None)
@given(
    num_lanes=st.sampled_from([1, 3, 8, 16]),
    batch_chars=st.sampled_from([1, 300, 1 << 30]),
    call_chars=st.sampled_from([0, 2_000, 1 << 20]),
)
def test_lanes_of_a_group_encode_in_shared_calls_and_the_rows_stay_each_lanes_own(
    corpus_dir, tokenizer_dir, short_documents, num_lanes, batch_chars, call_chars
):
    """The readers of a lane group whose batch runs out encode together (EncodeBatcher): a reader's next batch
    rides along in another reader's call, so thousands of lanes still make calls of ~1 MiB. Rows must be what
    each lane gives alone, in any group, with any budgets. Negative control: another seed differs."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(encode_calls, "TOKENIZE_BATCH_CHARS", (batch_chars, batch_chars))
        patch.setattr(encode_calls, "ENCODE_CALL_CHARS", call_chars)
        spec = make_spec(corpus_dir, tokenizer_dir, seq_len=256, num_lanes=num_lanes, sources=short_documents)
        together = _group_rows(spec, num_lanes, 3)
        patch.setattr(encode_calls, "ENCODE_CALL_CHARS", 0)  # each reader's own calls
        alone = [rows_digest(LaneStream(spec, lane).take(6)) for lane in range(num_lanes)]
        assert together == alone
        other = make_spec(corpus_dir, tokenizer_dir, seq_len=256, num_lanes=num_lanes, sources=short_documents, seed=8)
        assert rows_digest(LaneStream(other, 0).take(6)) != alone[0]


def test_thousands_of_lanes_make_few_large_encode_calls(corpus_dir, tokenizer_dir, short_documents, monkeypatch):
    """What the shared calls are for: with many lanes, each reader's batch (its share of the process's budget)
    lasts it several rows, and a call of its own per batch would be a call of a few documents. 64 lanes encode in
    a fraction of the calls, each about a reader's batch or more (and the same rows: the test above)."""
    # ~10 short documents: a few rows of 64 tokens
    monkeypatch.setattr(encode_calls, "TOKENIZE_BATCH_CHARS", (400, 400))
    calls = {}
    for call_chars in (0, 1 << 20):
        monkeypatch.setattr(encode_calls, "ENCODE_CALL_CHARS", call_chars)
        spec = make_spec(corpus_dir, tokenizer_dir, seq_len=64, num_lanes=64, sources=short_documents)
        calls[call_chars] = _counting_encode_calls(monkeypatch, spec)
        with open_lane_group(spec, range(64), 1) as group:
            for _ in range(48):
                group.next_step()
    alone, shared = calls[0], calls[1 << 20]
    assert len(shared) < len(alone) / 4, (len(shared), len(alone))
    assert sum(shared) / len(shared) > 4 * sum(alone) / len(alone)


def test_a_document_read_ahead_for_a_shared_call_fails_only_when_its_lane_reaches_it(
    tmp_path, corpus_dir, tokenizer_dir
):
    """Reading a reader's next batch for another reader's call must not raise that batch's bad line early (a run
    whose last step comes before it would fail for a line it never uses): the lane raises it when it reads that
    batch itself."""
    path = tmp_path / "web.jsonl"
    lines = [json.dumps({"text": f"document {i}"}) for i in range(6)]
    lines[4] = json.dumps({"text": 5})
    path.write_text("\n".join(lines) + "\n")
    spec = make_spec(corpus_dir, tokenizer_dir, sources={"web": {"paths": [str(path)]}}, num_lanes=1, shuffle=False)
    offsets = [sum(len(line) + 1 for line in lines[:i]) for i in range(len(lines))]
    reader = feed.DocumentFeed(spec, 0).readers[0]
    at = [SourceCursor(window=0, position=p, tokens=0) for p in range(len(lines))]
    assert reader.normalize(at[0]) == (at[0], True)
    assert [reader.document(at[p]).row for p in range(3)] == offsets[:3]  # batches of 1 and 2 documents
    assert reader.next_batch_texts() is None  # its next batch holds the bad line: not read ahead, no error
    with pytest.raises(DataError, match=r"web.jsonl line 5 .*field 'text' is int"):
        reader.document(at[3])  # the lane's own batch from there (documents 3-6), as without shared calls


def test_a_visit_makes_a_few_rows_of_a_lane_and_fewer_when_they_are_long():
    # Rows of 2,048 tokens: 4 per visit (4 steps at R = 1, 2 at R = 2 or 3); long rows: one step per visit, so
    # the rows held ahead stay ~TOKENS_PER_VISIT tokens per lane whatever the seq_len.
    assert [steps_per_visit(r, 2048) for r in (1, 2, 3, 4, 64)] == [4, 2, 2, 1, 1]
    assert [steps_per_visit(1, n) for n in (1, 512, 4096, 8192, 131072)] == [4, 4, 2, 1, 1]
    assert all(r * (steps_per_visit(r, n) - 1) * n < TOKENS_PER_VISIT for r in (1, 2, 3) for n in (128, 2048, 8192))


def _alone_with_states(spec, lane: int, rows_per_step: int, steps: int) -> list[list[tuple[str, object]]]:
    stream = LaneStream(spec, lane)
    return [[(row.to_bytes(), state) for row, state in stream.take_with_states(rows_per_step)] for _ in range(steps)]


@settings(max_examples=10, deadline=None)
@given(
    num_lanes=st.integers(1, 5),
    rows_per_step=st.integers(1, 3),
    steps=st.integers(1, 5),
    packing=st.sampled_from(["wrap", "best_fit"]),
)
def test_a_group_producing_steps_ahead_hands_out_each_lanes_rows_and_states(
    corpus_dir, tokenizer_dir, num_lanes, rows_per_step, steps, packing
):
    """A group of lanes with fewer than ROWS_PER_VISIT rows per step produces each lane's rows of several steps in
    one visit and holds them. Every step handed out must be each lane's own rows with the state after each row,
    state() must say where the last step handed out left the lanes (not where production stands), and a group
    resumed from it goes on with the same rows. Negative control: another seed differs."""
    spec = make_spec(corpus_dir, tokenizer_dir, num_lanes=num_lanes, packing=packing, best_fit_window_docs=8)
    alone = [_alone_with_states(spec, lane, rows_per_step, steps + 1) for lane in range(num_lanes)]
    group = LaneGroup(spec, range(num_lanes), rows_per_step)
    for t in range(steps):
        step = group.next_step_with_states()
        assert [[(row.to_bytes(), state) for row, state in rows] for rows in step] == [a[t] for a in alone]
        assert group.state() == {lane: alone[lane][t][-1][1] for lane in range(num_lanes)}
    resumed = LaneGroup(spec, range(num_lanes), rows_per_step, group.state(), steps)
    assert [[row.to_bytes() for row in rows] for rows in resumed.next_step()] == [
        [row for row, _ in a[steps]] for a in alone
    ]
    assert [[row.to_bytes() for row in rows] for rows in group.next_step()] == [
        [row for row, _ in a[steps]] for a in alone
    ]
    other = make_spec(corpus_dir, tokenizer_dir, num_lanes=num_lanes, packing=packing, best_fit_window_docs=8, seed=9)
    assert _alone_with_states(other, 0, rows_per_step, 1)[0][0][0] != alone[0][0][0][0]


@pytest.mark.parametrize("rows_per_step", [1, 2])
def test_a_finite_group_producing_steps_ahead_ends_at_the_same_step(corpus_dir, tokenizer_dir, rows_per_step):
    """Lanes run out (exhaustion = redistribute) at different rows; a step that one lane cannot fill ends the run.
    Produced ahead, the group hands out the same full steps as stepping every lane once per step, then raises
    LaneExhausted, and again after that."""
    spec = make_spec(corpus_dir, tokenizer_dir, num_lanes=3, exhaustion="redistribute")
    direct = LaneGroup(spec, range(3), rows_per_step)
    expected = []
    with pytest.raises(LaneExhausted):
        while True:
            expected.append([[row.to_bytes() for row in rows] for rows in direct.next_step()])
    ahead = LaneGroup(spec, range(3), rows_per_step)
    handed = []
    with pytest.raises(LaneExhausted):
        while True:
            handed.append([[row.to_bytes() for row, _ in rows] for rows in ahead.next_step_with_states()])
    assert expected and handed == expected
    with pytest.raises(LaneExhausted):
        ahead.next_step_with_states()
