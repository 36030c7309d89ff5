import hypothesis.strategies as st
import numpy as np
import pytest
from helpers import make_spec, registered_packer
from hypothesis import given, settings

from zephon_titan.engine import IGNORE_INDEX, ConfigError, LaneExhausted, LaneStream, fingerprint
from zephon_titan.engine.feed import Document
from zephon_titan.engine.packing import WrapPacker
from zephon_titan.engine.rows import Piece, RowShape
from zephon_titan.testing import assert_each_document_once, assert_restores_exactly


def _piece(offset, n):
    return Piece(0, "f", 0, offset, n)


def test_stream_rule_row_layout_with_literal_tokens():
    shape = RowShape(slots=8, within_document=False, pad_id=0)
    row = shape.make_row([(np.array([9, 1, 2, 3]), _piece(1, 3)), (np.array([4, 5]), _piece(0, 2))])
    assert row.inputs.tolist() == [1, 2, 3, 4, 5, 0, 0]
    assert row.labels.tolist() == [2, 3, 4, 5, -100, -100, -100]
    assert row.positions.tolist() == [0, 1, 2, 0, 1, 0, 1]
    assert row.padding == 3


def test_document_rule_row_layout_with_literal_tokens():
    # Pairs 1-2 of document [9, 1, 2, 3] (inputs 1, 2; labels 2, 3), then document [4, 5, 6] whole.
    shape = RowShape(slots=6, within_document=True, pad_id=0)
    row = shape.make_row([(np.array([9, 1, 2, 3]), _piece(1, 2)), (np.array([4, 5, 6]), _piece(0, 2))])
    assert row.inputs.tolist() == [1, 2, 4, 5, 0, 0]
    assert row.labels.tolist() == [2, 3, 5, 6, -100, -100]  # 3 never predicts 4: no cross-document target
    assert row.positions.tolist() == [0, 1, 0, 1, 0, 1]
    assert row.padding == 2
    for tokens in (np.array([7]), np.array([], dtype=np.int32)):  # a one-token or empty document: no pair
        assert shape.piece_slots(Document(0, tokens, "f", 0, 0, len(tokens))) == 0


def test_full_stream_row_has_no_ignored_label():
    row = RowShape(slots=4, within_document=False, pad_id=0).make_row([(np.array([1, 2, 3, 4]), _piece(0, 4))])
    assert row.inputs.tolist() == [1, 2, 3] and row.labels.tolist() == [2, 3, 4] and row.positions.tolist() == [0, 1, 2]


def _reference_row(parts, slots, within_document, pad_id):
    """make_row's layout, written out with lists: inputs, labels, positions (the contract, independently)."""
    inputs, labels, positions = [], [], []
    for tokens, p in parts:
        inputs += tokens[p.doc_offset : p.doc_offset + p.length].tolist()
        labels += tokens[p.doc_offset + 1 : p.doc_offset + p.length + 1].tolist()
        positions += list(range(p.length))
    used = len(inputs)
    inputs += [pad_id] * (slots - used)
    positions += list(range(slots - used))
    if within_document:
        return inputs, labels + [IGNORE_INDEX] * (slots - used), positions
    stream_labels = (inputs[1:used] + [IGNORE_INDEX] * (slots - used))[: slots - 1]
    return inputs[:-1], stream_labels, positions[:-1]


@settings(max_examples=150, deadline=None)
@given(
    within_document=st.booleans(),
    slots=st.integers(2, 40),
    docs=st.lists(st.tuples(st.integers(1, 30), st.integers(0, 30), st.integers(0, 30)), min_size=1, max_size=6),
    pad_id=st.integers(0, 9),
    data=st.data(),
)
def test_make_row_matches_the_layout_written_out(within_document, slots, docs, pad_id, data):
    # Random pieces (any offsets, lengths summing to at most `slots`, padding or none) in both label rules: the
    # row's three arrays (views of one buffer) hold exactly the reference's values, and the rows made one after
    # another share no memory (a row never sees the next one's writes).
    parts, room, base = [], slots, 1000
    for n, offset, want in docs:
        tokens = np.arange(base, base + n + 1, dtype=np.int32)
        base += 1000
        offset = min(offset, n - 1)
        length = min(want, n - offset - (1 if within_document else 0), room)
        if length <= 0:
            continue
        parts.append((tokens, Piece(0, "f", 0, offset, length)))
        room -= length
    shape = RowShape(slots=slots, within_document=within_document, pad_id=pad_id)
    row = shape.make_row(parts)
    again = shape.make_row(parts[::-1])
    expected = _reference_row(parts, slots, within_document, pad_id)
    got = (row.inputs.tolist(), row.labels.tolist(), row.positions.tolist())
    assert got == expected
    assert row.padding == room and row.inputs.dtype == np.int32
    assert not any(
        np.shares_memory(a, b)
        for a in (row.inputs, row.labels, row.positions)
        for b in (again.inputs, again.labels, again.positions)
    )
    if parts and data.draw(st.booleans()):  # negative control: one token changed is seen
        parts[0][0][parts[0][1].doc_offset] += 1
        assert _reference_row(parts, slots, within_document, pad_id) != got


def _expected_positions(row, within_document):
    positions = np.concatenate([np.arange(p.length) for p in row.pieces] + [np.arange(row.padding)])
    return positions if within_document else positions[:-1]


@pytest.mark.parametrize("labels", ["document", "stream"])
def test_wrap_rows_are_full_with_per_document_positions(corpus_dir, tokenizer_dir, labels):
    spec = make_spec(corpus_dir, tokenizer_dir, seq_len=96, labels=labels)
    shape = RowShape.of(spec)
    assert shape.slots == (96 if labels == "document" else 97)
    rows = LaneStream(spec, 2).take(60)
    assert any(len(r.pieces) > 1 for r in rows) and any(r.pieces[0].doc_offset > 0 for r in rows)
    for row in rows:
        assert len(row.inputs) == len(row.labels) == len(row.positions) == spec.seq_len
        assert row.padding == 0 and sum(p.length for p in row.pieces) == shape.slots
        assert (row.positions == _expected_positions(row, shape.within_document)).all()
        assert row.positions.max() < spec.seq_len
        starts = np.flatnonzero(row.positions == 0)
        begins = np.cumsum([0] + [p.length for p in row.pieces[:-1]])
        # A block-causal mask sees one block per piece (under "stream", a last piece of one token is a label only).
        assert len(starts) == sum(b < spec.seq_len for b in begins)
        if shape.within_document:  # labels are inputs shifted by one inside each piece, never across
            cross = set(starts[1:] - 1)
            inner = [i for i in range(spec.seq_len - 1) if i not in cross]
            assert (row.labels[inner] == row.inputs[np.array(inner) + 1]).all()
        else:  # labels are inputs shifted by one across the whole row
            assert (row.labels[:-1] == row.inputs[1:]).all()


@pytest.mark.parametrize("labels", ["document", "stream"])
def test_wrap_continues_documents_across_rows(corpus_dir, tokenizer_dir, labels):
    spec = make_spec(corpus_dir, tokenizer_dir, seq_len=96, labels=labels)
    rows = LaneStream(spec, 1).take(30)
    expected = {}  # (file, row) -> the document offset its next piece must start at
    continued = 0
    for prev, row in zip([None, *rows], rows):
        for piece in row.pieces:  # a document continues where it stopped, whatever came between
            assert piece.doc_offset == expected.get((piece.file, piece.row), 0)
            expected[(piece.file, piece.row)] = piece.doc_offset + piece.length
        first = row.pieces[0]
        last = prev.pieces[-1] if prev is not None else None
        if last is not None and (first.file, first.row) == (last.file, last.row):
            continued += 1  # split at the row boundary
            if labels == "document":  # the label of the last pair is the continuation's first input
                assert prev.labels[-1] == row.inputs[0]
    assert continued


def test_document_rule_ends_each_document_with_its_own_eos(corpus_dir, tokenizer_dir):
    spec = make_spec(corpus_dir, tokenizer_dir, seq_len=96, labels="document", add_bos=True, add_eos=True)
    eos, bos = spec.tokenizer.eos_id, spec.tokenizer.bos_id
    for row in LaneStream(spec, 0).take(40):
        starts = [i for i, p in enumerate(row.positions) if p == 0]
        for piece, at in zip(row.pieces, starts):
            if piece.doc_offset == 0:
                assert row.inputs[at] == bos  # a document's first input is its BOS...
            if at > 0 and piece.doc_offset == 0:
                assert row.labels[at - 1] == eos  # ...and the target before it is the previous document's EOS


def test_best_fit_keeps_documents_whole_and_ignores_padding(corpus_dir, tokenizer_dir, prose_docs, code_docs):
    spec = make_spec(corpus_dir, tokenizer_dir, seq_len=256, packing="best_fit", best_fit_window_docs=16)
    shape = RowShape.of(spec)
    rows = LaneStream(spec, 3).take(600)
    for row in rows:
        for piece in row.pieces:
            assert piece.doc_offset % shape.slots == 0  # pieces are whole documents or row-sized chunks
        used = shape.slots - row.padding
        assert (row.labels[used:] == IGNORE_INDEX).all() and (row.labels[:used] != IGNORE_INDEX).all()
        assert (row.inputs[used:] == spec.pad_id).all()
        assert (row.positions == _expected_positions(row, True)).all()
    padding = sum(r.padding for r in rows) / (len(rows) * shape.slots)
    print(f"best_fit padding fraction at seq_len 256, window 16 docs: {padding:.4f}")
    assert 0 < padding < 0.5


@pytest.mark.parametrize("labels", ["document", "stream"])
@pytest.mark.parametrize("packing", ["wrap", "best_fit"])
def test_finite_lane_pads_only_its_last_row(corpus_dir, tokenizer_dir, packing, labels):
    from zephon_titan.engine import LaneExhausted

    spec = make_spec(corpus_dir, tokenizer_dir, seq_len=128, packing=packing, exhaustion="redistribute", labels=labels)
    stream = LaneStream(spec, 0)
    rows = []
    with pytest.raises(LaneExhausted):
        while True:
            rows.append(stream.next_row())
    assert rows
    if packing == "wrap":
        assert all(r.padding == 0 for r in rows[:-1])


@pytest.mark.parametrize("packing", ["wrap", "best_fit"])
def test_one_token_documents_do_not_end_a_lane(tmp_path, tokenizer_dir, packing):
    # Under labels = "document" a one-token document ([EOS] of an empty text) has no pair; a best-fit
    # window of only such documents has no row, and the lane must go on to the next window, not end.
    import json

    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in ["", "", "", "", "", "0"]))
    sources = {"a": {"paths": [str(tmp_path / "a.jsonl")]}}
    spec = make_spec(
        str(tmp_path), tokenizer_dir, seq_len=4, sources=sources, num_lanes=1, packing=packing, add_bos=False,
        exhaustion="redistribute", best_fit_window_docs=4, shuffle=False,
    )  # fmt: skip
    stream, rows = LaneStream(spec, 0), []
    with pytest.raises(LaneExhausted):
        while True:
            rows.append(stream.next_row())
    assert [r.inputs[0] for r in rows] == [spec.tokenizer.encode(["0"])[0][0]]


class _WrapAgain(WrapPacker):
    """A packer added through the registry (one class, one `register_packer` line): wrap's rows, its own name."""

    name = "wrap_again"

    @staticmethod
    def fingerprint(config):
        return "wrap_again"


def test_a_registered_packer_keeps_the_loader_promises(corpus_dir, tokenizer_dir):
    # What a packer author runs (zephon_titan.testing): exact restore at any row, every document once per epoch.
    with registered_packer(_WrapAgain):
        spec = make_spec(corpus_dir, tokenizer_dir, seq_len=64, packing="wrap_again", exhaustion="redistribute")
        assert isinstance(LaneStream(spec, 0).packer, _WrapAgain)
        assert_restores_exactly(spec, 1, [0, 1, 2, 7, 20], rows=3)
        assert assert_each_document_once(spec) > 0
        assert fingerprint(spec)["packing"] == "wrap_again"
    with pytest.raises(ConfigError, match="packing must be one of wrap, best_fit, got 'wrap_again'"):
        LaneStream(spec, 0)  # negative control: unregistered, the name is unknown
