"""zephon_titan.testing, the checks for authors of formats, packers and transforms: each passes on the engine and
fails, with a message naming the lane and cut or the document, on a deliberately broken variant of it."""

import dataclasses
import subprocess
import sys

import pytest
from helpers import make_spec, registered_packer

from zephon_titan.engine import LaneState
from zephon_titan.engine.feed import DocumentFeed
from zephon_titan.engine.lanes import LaneGroup
from zephon_titan.engine.packing import WrapPacker
from zephon_titan.testing import (
    assert_each_document_once,
    assert_restores_exactly,
    assert_same_rows_for_any_layout,
    epoch_rows,
)


@pytest.fixture(scope="module")
def finite(corpus_dir, tokenizer_dir):
    return make_spec(corpus_dir, tokenizer_dir, seq_len=64, exhaustion="redistribute")


class _Forgetful(WrapPacker):
    """Broken on purpose: its state forgets how far into the open document the rows are."""

    name = "forgetful"

    def unit(self):
        feed, packer = super().unit()
        return feed, dataclasses.replace(packer, unit_offset=0)


def test_restore_check_passes_on_the_engine_and_names_the_first_differing_row(corpus_dir, tokenizer_dir):
    assert_restores_exactly(make_spec(corpus_dir, tokenizer_dir, seq_len=64), 3, [0, 2, 5], rows=3)
    with registered_packer(_Forgetful):
        broken = make_spec(corpus_dir, tokenizer_dir, seq_len=64, packing="forgetful")
        assert_restores_exactly(broken, 3, [0], rows=3)  # at row 0 nothing is open: nothing to forget
        with pytest.raises(
            AssertionError, match=r"^lane 3, cut point 2: the first differing row is row 2 \(0 after the cut\)"
        ):
            assert_restores_exactly(broken, 3, [0, 2, 5], rows=3)


def test_restore_check_fails_on_a_state_that_forgets_a_field(monkeypatch, corpus_dir, tokenizer_dir):
    spec = make_spec(corpus_dir, tokenizer_dir, seq_len=64)
    to_dict = LaneState.to_dict

    def forgetful(self):
        data = to_dict(self)
        return {**data, "packer": {k: v for k, v in data["packer"].items() if k != "unit_offset"}}

    monkeypatch.setattr(LaneState, "to_dict", forgetful)
    with pytest.raises(AssertionError, match=r"lane 0, cut point 4: the saved state does not restore: Resume"):
        assert_restores_exactly(spec, 0, [4])


def test_restore_check_compares_the_state_after_the_rows(monkeypatch, corpus_dir, tokenizer_dir):
    # Rows alike but a state that drifts (a row count off by one) is a failure too: the next save would be wrong.
    spec = make_spec(corpus_dir, tokenizer_dir, seq_len=64)
    from_dict = LaneState.from_dict.__func__

    def drifting(cls, data, where="lane state"):
        return from_dict(cls, {**data, "rows": data["rows"] + 1}, where)

    monkeypatch.setattr(LaneState, "from_dict", classmethod(drifting))
    with pytest.raises(AssertionError, match=r"lane 1, cut point 3: the state after 2 more rows differs"):
        assert_restores_exactly(spec, 1, [3], rows=2)


def test_each_document_once_passes_on_the_engine(finite, prose_docs, code_docs):
    rows = epoch_rows(finite)
    assert assert_each_document_once(finite, rows) == len(prose_docs) + len(code_docs)
    # Broken variants of the same epoch: a row twice, a row lost.
    with pytest.raises(
        AssertionError, match=r"^document .* row \d+ \(source '(code|prose)'\): tokens \d+-\d+ are repeated"
    ):
        assert_each_document_once(finite, rows + [rows[len(rows) // 2]])
    with pytest.raises(AssertionError, match=r"(tokens \d+-\d+ are|document\(s\)) in no row"):
        assert_each_document_once(finite, rows[:-1])


def _second_document(spec, name):
    """(file, row) of the second document of a source, as its pieces name it."""
    block = next(s for s in spec.sources if s.name == name).read_block(0)
    return block.file, block.rows[1]


def test_each_document_once_names_a_document_a_stream_drops(monkeypatch, finite):
    # A feed that loses one document (every piece of prose's second document) on its way into the rows.
    target, row = _second_document(finite, "prose")
    next_document = DocumentFeed.next_document

    def losing(self):
        doc = next_document(self)
        while doc is not None and (doc.file, doc.row) == (target, row):
            doc = next_document(self)
        return doc

    monkeypatch.setattr(DocumentFeed, "next_document", losing)
    with pytest.raises(AssertionError, match=rf"^1 document\(s\) in no row: {target} row {row} \(source 'prose'\)$"):
        assert_each_document_once(finite)


def test_each_document_once_names_a_document_a_stream_repeats(monkeypatch, finite):
    target, row = _second_document(finite, "code")
    next_document = DocumentFeed.next_document
    queued = {}  # feed -> the document it gives once more

    def repeating(self):
        if id(self) in queued:
            return queued.pop(id(self))
        doc = next_document(self)
        if doc is not None and (doc.file, doc.row) == (target, row) and doc.start == 0:
            queued[id(self)] = doc
        return doc

    monkeypatch.setattr(DocumentFeed, "next_document", repeating)
    with pytest.raises(AssertionError, match=rf"document {target} row {row} \(source 'code'\): tokens .* are repeated"):
        assert_each_document_once(finite)


def test_layout_check_passes_on_the_engine_and_names_the_first_differing_row(monkeypatch, corpus_dir, tokenizer_dir):
    spec = make_spec(corpus_dir, tokenizer_dir, seq_len=32, num_lanes=4)
    assert_same_rows_for_any_layout(spec, steps=2)
    # Broken on purpose: a rank numbers its lanes from 0 (its rows then depend on the layout).
    init = LaneGroup.__init__

    def rank_local(self, spec, lane_ids, *args, **kwargs):
        init(self, spec, range(len(lane_ids)), *args, **kwargs)

    monkeypatch.setattr(LaneGroup, "__init__", rank_local)
    with pytest.raises(AssertionError, match=r"^W=2: step 1's global batch differs from one rank's at row 4 \(lane 2,"):
        assert_same_rows_for_any_layout(spec, steps=2)


def test_the_module_imports_no_torch():
    code = "import sys, zephon_titan.testing; print(' '.join(sorted(sys.modules)))"
    loaded = set(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    )
    assert "zephon_titan.testing" in loaded and not loaded & {"torch", "torchtitan"}
