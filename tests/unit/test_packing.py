import numpy as np
import pytest
from helpers import make_spec

from zephon_titan.engine import IGNORE_INDEX, LaneStream
from zephon_titan.engine.packing import Piece, make_row


def _piece(n):
    return Piece(0, "f", 0, 0, n)


def test_make_row_layout_with_literal_tokens():
    row = make_row([(np.array([1, 2, 3]), _piece(3)), (np.array([4, 5]), _piece(2))], row_tokens=8, pad_id=0)
    assert row.inputs.tolist() == [1, 2, 3, 4, 5, 0, 0]
    assert row.labels.tolist() == [2, 3, 4, 5, -100, -100, -100]
    assert row.positions.tolist() == [0, 1, 2, 0, 1, 0, 1]
    assert row.padding == 3


def test_make_row_full_row_has_no_ignored_label():
    row = make_row([(np.array([1, 2, 3, 4]), _piece(4))], row_tokens=4, pad_id=0)
    assert row.inputs.tolist() == [1, 2, 3] and row.labels.tolist() == [2, 3, 4] and row.positions.tolist() == [0, 1, 2]


def _expected_positions(row):
    return np.concatenate([np.arange(p.length) for p in row.pieces] + [np.arange(row.padding)])[:-1]


def test_wrap_rows_are_full_with_per_document_positions(corpus_dir, tokenizer_dir):
    spec = make_spec(corpus_dir, tokenizer_dir, seq_len=96)
    rows = LaneStream(spec, 2).take(60)
    assert any(len(r.pieces) > 1 for r in rows) and any(r.pieces[0].doc_offset > 0 for r in rows)
    for row in rows:
        assert row.padding == 0 and sum(p.length for p in row.pieces) == spec.row_tokens
        assert (row.labels[:-1] == row.inputs[1:]).all()  # labels are inputs shifted by one
        assert (row.positions == _expected_positions(row)).all()
        assert row.positions.max() < spec.seq_len
        starts = np.flatnonzero(row.positions == 0)
        assert len(starts) == len(row.pieces)  # a block-causal mask sees one block per piece


def test_wrap_continues_documents_across_rows(corpus_dir, tokenizer_dir):
    spec = make_spec(corpus_dir, tokenizer_dir, seq_len=96)
    rows = LaneStream(spec, 1).take(30)
    for prev, row in zip(rows, rows[1:]):
        last, first = prev.pieces[-1], row.pieces[0]
        if first.doc_offset:  # a continuation starts where the previous row stopped
            assert (first.file, first.row) == (last.file, last.row)
            assert first.doc_offset == last.doc_offset + last.length


def test_best_fit_keeps_documents_whole_and_ignores_padding(corpus_dir, tokenizer_dir, prose_docs, code_docs):
    spec = make_spec(corpus_dir, tokenizer_dir, seq_len=256, packing="best_fit", best_fit_window_docs=16)
    rows = LaneStream(spec, 3).take(600)
    for row in rows:
        for piece in row.pieces:
            assert piece.doc_offset % spec.row_tokens == 0  # pieces are whole documents or row-sized chunks
        used = spec.row_tokens - row.padding
        assert (row.labels[used - 1 :] == IGNORE_INDEX).all() if row.padding else (row.labels != IGNORE_INDEX).all()
        n = min(used - 1, spec.seq_len - 1)
        assert (row.labels[:n] == row.inputs[1 : n + 1]).all()
        assert (row.positions == _expected_positions(row)).all()
    padding = sum(r.padding for r in rows) / (len(rows) * spec.row_tokens)
    print(f"best_fit padding fraction at seq_len 256, window 16 docs: {padding:.4f}")
    assert 0 < padding < 0.5


@pytest.mark.parametrize("packing", ["wrap", "best_fit"])
def test_finite_lane_pads_only_its_last_row(corpus_dir, tokenizer_dir, packing):
    from zephon_titan.engine import LaneExhausted

    spec = make_spec(corpus_dir, tokenizer_dir, seq_len=128, packing=packing, exhaustion="redistribute")
    stream = LaneStream(spec, 0)
    rows = []
    with pytest.raises(LaneExhausted):
        while True:
            rows.append(stream.next_row())
    assert rows
    if packing == "wrap":
        assert all(r.padding == 0 for r in rows[:-1])
