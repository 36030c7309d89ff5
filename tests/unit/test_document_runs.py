"""The short-document paths of issue 47 change no byte: runs of whole documents drawn in one go
(DocumentFeed.following, WrapPacker.draws_runs) give the rows, pieces, document counts and lane states of drawing them
one by one, and a JSONL block's documents read together (LazyTexts.many) are its documents read one by one, errors
included. Negative control: a run that goes on past the mixer's choice changes the rows."""

from __future__ import annotations

import json
import os

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from zephon_titan.engine.feed import DocumentFeed
from zephon_titan.engine.lanes import open_lane_group
from zephon_titan.engine.packing import WrapPacker
from zephon_titan.errors import DataError
from zephon_titan.testing import spec_from_table


@pytest.fixture(scope="module")
def short_corpus(tmp_path_factory, prose_docs, code_docs) -> str:
    """Paragraphs (tens of tokens) and whole modules (thousands), with a score for repeat; and empty, one-character
    and two-character texts, which place nothing without BOS/EOS or under labels = "document"."""
    root = str(tmp_path_factory.mktemp("runs"))
    paragraphs = [p for text in prose_docs + code_docs for p in text.split("\n\n") if p.strip()]
    odd = ["", "x", "ab"] * 20
    kinds = {
        "short": paragraphs[:1500],
        "long": code_docs[:30],
        "mixed": paragraphs[1500:2200] + code_docs[30:40] + odd,
    }
    for kind, texts in kinds.items():
        os.makedirs(os.path.join(root, kind))
        for f in range(2):
            with open(os.path.join(root, kind, f"part-{f}.jsonl"), "w", encoding="utf-8") as out:
                out.writelines(json.dumps({"text": t, "score": i % 5}) + "\n" for i, t in enumerate(texts[f::2]))
    return root


def _steps(spec, lanes: int, rows: int, steps: int, states=None, first_step: int = 0) -> list:
    """Every row's bytes, pieces and document counts, with the lane's state after it, for `steps` steps."""
    out = []
    with open_lane_group(spec, range(lanes), rows, states=states, first_step=first_step) as group:
        for _ in range(steps):
            out.append(
                [
                    (row.to_bytes(), row.pieces, row.documents, state.to_dict())
                    for lane in group.next_step_with_states()
                    for row, state in lane
                ]
            )
    return out


def _states_after(step_rows: list, spec) -> dict:
    from zephon_titan.engine.state import LaneState

    return {s["lane_id"]: LaneState.from_dict(s) for _, _, _, s in step_rows}


def _table(short_corpus, tokenizer_dir, sources, **settings_) -> dict:
    paths = {name: {"paths": [os.path.join(short_corpus, kind, "*.jsonl")], "block_bytes": 6000, **extra}
             for name, (kind, extra) in sources.items()}  # fmt: skip
    return {"tokenizer_path": tokenizer_dir, "seed": 3, "sources": paths, **settings_}


layouts = st.fixed_dictionaries(
    {
        "sources": st.lists(
            st.tuples(
                st.sampled_from(["short", "long", "mixed"]),
                st.floats(0.1, 1.0),
                st.sampled_from([None, "if(score > 2, 2, 1)", "if(score > 3, 3, 0.5)"]),
            ),
            min_size=1,
            max_size=3,
        ),
        "seq_len": st.sampled_from([32, 128, 300, 600]),
        "labels": st.sampled_from(["document", "stream"]),
        "chunk": st.sampled_from([None, 24, 100]),
        "specials": st.sampled_from([(True, True), (False, False), (False, True)]),
        "lanes": st.integers(1, 4),
        "rows": st.integers(1, 4),
        "shuffle": st.booleans(),
    }
)


@settings(max_examples=12, deadline=None)
@given(layout=layouts)
def test_runs_of_documents_give_the_rows_and_states_of_one_by_one(short_corpus, tokenizer_dir, layout):
    sources = {
        f"s{i}": (kind, {"weight": weight, **({"repeat": repeat} if repeat else {})})
        for i, (kind, weight, repeat) in enumerate(layout["sources"])
    }
    add_bos, add_eos = layout["specials"]
    extra = {"mix_chunk_tokens": layout["chunk"]} if layout["chunk"] else {}
    table = _table(short_corpus, tokenizer_dir, sources, num_lanes=layout["lanes"], labels=layout["labels"],
                   add_bos=add_bos, add_eos=add_eos, shuffle=layout["shuffle"], **extra)  # fmt: skip
    spec = spec_from_table(table, seq_len=layout["seq_len"])
    lanes, rows = layout["lanes"], layout["rows"]
    with_runs = _steps(spec, lanes, rows, 12)
    WrapPacker.draws_runs = False
    try:
        one_by_one = _steps(spec, lanes, rows, 12)
        resumed_one_by_one = _steps(spec, lanes, rows, 4, _states_after(one_by_one[7], spec), first_step=8)
    finally:
        WrapPacker.draws_runs = True
    assert with_runs == one_by_one
    assert _steps(spec, lanes, rows, 4, _states_after(with_runs[7], spec), first_step=8) == resumed_one_by_one
    assert resumed_one_by_one == one_by_one[8:]


def test_a_run_that_ignores_the_mixer_is_caught(short_corpus, tokenizer_dir, monkeypatch):
    """The control: the same comparison fails when a run goes on past where the mixer takes another source."""
    table = _table(short_corpus, tokenizer_dir, {"a": ("short", {"weight": 0.5}), "b": ("mixed", {"weight": 0.5})})
    spec = spec_from_table(table, seq_len=300)
    one_by_one = _steps(spec, 2, 2, 6)
    assert _steps(spec, 2, 2, 6) == one_by_one
    following = DocumentFeed.following

    def blind(self, slots, pairs):  # the other sources look exhausted to the run
        has, self._has_document = self._has_document, [False] * len(self._has_document)
        try:
            return following(self, slots, pairs)
        finally:
            self._has_document = has

    monkeypatch.setattr(DocumentFeed, "following", blind)
    assert _steps(spec, 2, 2, 6) != one_by_one


HOSTILE_LINES = [
    '{"text": "plain"}',
    '  {"text": "leading and trailing space"}  ',
    '{"text": "a\\ud800lone surrogate"}',
    '{"text": "x", "text": "duplicate key: the last wins"}',
    '{"other": 1}',
    '{"text": 5}',
    '{"text": null}',
    '["not an object"]',
    '{"text": "unterminated',
    '{"text": "one"}, {"text": "two"}',
    '{"a": 1}],[{"text": "forged"}',
    '{"text": "x',
    'y"}',
    '{"text": "' + "long " * 30 + '"}',
    '{"text": "caf\\u00e9 \\u2603", "meta": {"n": [1, 2, {"k": "v"}]}}',
    "\x00{}",
]


@settings(max_examples=40, deadline=None)
@given(lines=st.lists(st.sampled_from(HOSTILE_LINES + ["BAD_UTF8"]), min_size=1, max_size=12))
def test_a_blocks_documents_read_together_are_those_read_one_by_one(tmp_path_factory, tokenizer_dir, lines):
    folder = tmp_path_factory.mktemp("hostile")
    with open(folder / "a.jsonl", "wb") as f:
        for line in lines:
            f.write((b'{"text": "\xff\xfe"}' if line == "BAD_UTF8" else line.encode()) + b"\n")
    table = {"tokenizer_path": tokenizer_dir, "max_document_chars": 100,
             "sources": {"a": {"paths": [str(folder / "a.jsonl")]}}}  # fmt: skip
    source = spec_from_table(table).sources[0]
    texts = source.read_block(0).texts

    def one(i: int) -> str:
        try:
            return texts[i]
        except DataError as e:
            return f"error: {e}"

    expected = [one(i) for i in range(len(texts))]
    for i in range(len(texts)):
        try:
            assert texts.many([i]) == [expected[i]]
        except DataError as e:
            assert f"error: {e}" == expected[i]
    order = list(range(len(texts)))[::-1]
    try:
        together = texts.many(order)
    except DataError as e:  # the first bad document in the order asked raises, in its words
        first_bad = next(expected[i] for i in order if expected[i].startswith("error: "))
        assert f"error: {e}" == first_bad
    else:
        assert together == [expected[i] for i in order]


def _lines_by_split(data: bytes, offset: int, most: int) -> tuple[int | None, list[int], list[int]]:
    """_document_lines' contract written out: data.split(b"\\n"), a line of only white space is no document."""
    rows, lengths, at = [], [], offset
    for line in data.split(b"\n"):
        if len(line) > most:
            return at, [], []
        if line.strip():
            rows.append(at)
            lengths.append(len(line))
        at += len(line) + 1
    return None, rows, lengths


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(st.sampled_from([b"", b" ", b"\t \r", b"\x0b", b"{}", b' {"a": 1}', b"x" * 9, b"\xff\x00", b"\r"])),
    offset=st.integers(0, 1 << 40),
    most=st.integers(0, 10),
)
def test_a_blocks_lines_are_found_as_split_finds_them(lines, offset, most):
    from zephon_titan.engine.sources.jsonl import _document_lines

    data = b"\n".join(lines)
    assert _document_lines(data, offset, most) == _lines_by_split(data, offset, most)
    if any(line.strip() and b" " in line for line in lines) and all(len(line) <= most for line in lines):
        # Control: a rule that takes white space for blank wherever it starts a line finds fewer documents.
        found = _document_lines(data, offset, most)[1]
        assert len(found) > len([line for line in lines if line and line[:1] not in b" \t\r\x0b\x0c"])
