"""A seq_len change at a resume (issue 29): every step up to the checkpoint is what it was, each lane then goes on
where it stopped with rows of the new length, and every document's tokens are trained exactly once across the
change (both packers, both label rules, with phases, longer and shorter rows). The continuation is the one
`plan --from-checkpoint` predicts (the resume sequence's spec: engine/resume.read_state)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import SEQ_LEN_CHANGE, data_table, engine_checkpoint, make_spec
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_titan.config import config_from_dict
from zephon_titan.engine import LaneGroup, LaneState, LaneStream, fingerprint
from zephon_titan.engine.fingerprint import check_fingerprint
from zephon_titan.engine.ledger import LedgerEntry, step_seq_len
from zephon_titan.engine.portable_spec import portable, spec_from_portable
from zephon_titan.engine.resume import HEADER_KEY, read_state
from zephon_titan.engine.stream import StepClock
from zephon_titan.errors import ResumeError
from zephon_titan.loader.state import Decoded, decode_entry
from zephon_titan.testing import assert_each_document_once, drain

PHASES = [
    {"start_step": 1, "weights": {"code": 0.3, "prose": 0.7}},
    {"start_step": 4, "weights": {"code": 0.7, "prose": 0.3}},
]
_SPECS: dict = {}


def _table(corpus_dir, packing, labels, small=False):
    code, prose = ("part-00002", "part-00001") if small else ("*", "*")
    packing, _, mixing = packing.partition("/")  # "best_fit/per_window": as runs saved before per_step mixed
    return dict(
        **({"best_fit_mixing": mixing} if mixing else {}),
        sources={
            "code": {"paths": [f"{corpus_dir}/code/{code}.parquet"]},
            "prose": {"paths": [f"{corpus_dir}/prose/{prose}.jsonl"], "block_bytes": 16384},
        },
        phases=PHASES,
        packing=packing,
        labels=labels,
        best_fit_window_docs=8,
        num_lanes=2,
        exhaustion="redistribute" if small else "repeat",
    )


def _spec(corpus_dir, tokenizer_dir, seq_len, packing, labels, small=True):
    key = (seq_len, packing, labels, small)
    if key not in _SPECS:
        table = _table(corpus_dir, packing, labels, small)
        _SPECS[key] = make_spec(corpus_dir, tokenizer_dir, seq_len=seq_len, **table)
    return _SPECS[key]


@settings(max_examples=6, deadline=None)  # ~0.4 s each: a finite corpus drained through the change
@given(
    **SEQ_LEN_CHANGE,
    cut=st.integers(1, 6),
    rows=st.sampled_from([(2, 1), (2, 2), (1, 3)]),
    again=st.integers(0, 4),
)
def test_every_document_is_trained_once_across_a_seq_len_change(
    corpus_dir, tokenizer_dir, packing, labels, longer, cut, rows, again
):
    a, b = (48, 160) if longer else (160, 48)
    r, r2 = rows  # rows per lane per step before and after (the global batch size may change with seq_len)
    spec_a = _spec(corpus_dir, tokenizer_dir, a, packing, labels)
    resumed = _spec(corpus_dir, tokenizer_dir, b, packing, labels).continuing_at(spec_a, cut)
    assert [e.start for e in resumed.eras] == [1, cut + 1] and resumed.seq_len == b
    epoch = []
    for lane in range(spec_a.num_lanes):
        before = LaneStream(spec_a, lane, clock=StepClock(r))
        first = before.take(cut * r)  # steps 1..cut: what they were
        state = LaneState.from_dict(before.state().to_dict())
        after = LaneStream(resumed, lane, state, StepClock(r2, state.rows, cut))
        middle = after.take(again * r2)
        # A checkpoint in the new seq_len (an open best_fit window drawn before the change keeps `resized`).
        saved = LaneState.from_dict(after.state().to_dict())
        expected = after.take(2 * r2)
        restored = LaneStream(resumed, lane, saved, StepClock(r2, saved.rows, cut + again))
        assert [x.to_bytes() for x in restored.take(2 * r2)] == [x.to_bytes() for x in expected]
        rest = drain(after)
        assert all(len(x.inputs) == a for x in first) and all(len(x.inputs) == b for x in middle + expected + rest)
        epoch += first + middle + expected + rest
    assert_each_document_once(spec_a, epoch)  # every document's tokens (or pairs) once, none skipped


def test_a_window_open_at_the_change_is_packed_again_and_saved_with_resized(corpus_dir, tokenizer_dir):
    # best_fit, 8-document windows: a window drawn at seq_len 160 is open at the cut; its rows not yet emitted
    # are packed again into rows of 48, and a checkpoint taken while they are emitted keeps the count.
    spec_a = _spec(corpus_dir, tokenizer_dir, 160, "best_fit", "document")
    resumed = _spec(corpus_dir, tokenizer_dir, 48, "best_fit", "document").continuing_at(spec_a, 1)
    before = LaneStream(spec_a, 0, clock=StepClock(1))
    before.take(1)
    state = before.state()
    assert state.packer.unit_open
    after = LaneStream(resumed, 0, state, StepClock(1, 1, 1))
    assert after.state().packer.resized == (state.packer.unit_offset,)
    assert "resized" in after.state().packer.to_dict()
    after.take(1)
    # A second change while that window is open: packed again at each change, each count kept.
    third = _spec(corpus_dir, tokenizer_dir, 96, "best_fit", "document").continuing_at(resumed, 2)
    again = LaneStream(third, 0, after.state(), StepClock(1, 2, 2))
    assert again.state().packer.resized == (state.packer.unit_offset, 1)
    assert [e.seq_len for e in third.eras] == [160, 48, 96]
    assert len(again.next_row().inputs) == 96
    # Negative control: the same state resumed without the run's earlier seq_len (the window replayed at 48) trains
    # pieces twice or never.
    plain = _spec(corpus_dir, tokenizer_dir, 48, "best_fit", "document")
    epoch = []
    for lane in range(2):
        head = LaneStream(spec_a, lane, clock=StepClock(1))
        rows = head.take(1)
        rows += drain(LaneStream(plain, lane, head.state(), StepClock(1, 1, 1)))
        epoch += rows
    with pytest.raises(AssertionError):
        assert_each_document_once(spec_a, epoch)
    # A damaged count is refused in one line.
    saved = after.state()
    bad = LaneState.from_dict({**saved.to_dict(), "packer": {**saved.packer.to_dict(), "resized": [1, 2, 3]}})
    with pytest.raises(ResumeError, match="'packer.resized' has 3 entries for 1 seq_len changes"):
        LaneStream(resumed, 0, bad, StepClock(1, 2, 1))


def _loader(corpus_dir, tokenizer_dir, table, seq_len, batch):
    from zephon_titan.titan.dataloader import ZephonDataLoader

    config = ZephonDataLoader.Config(data=config_from_dict(data_table(corpus_dir, tokenizer_dir, **table)))
    config.global_batch_size = batch
    return config.build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=seq_len, local_batch_size=2)


def _loader_steps(loader, steps, batch):
    batches = iter(loader)
    return [np.concatenate([next(batches)[0]["input"].numpy() for _ in range(batch // 2)]) for _ in range(steps)]


def _engine_steps(spec, rows, steps, first_step=0, states=None):
    group = LaneGroup(spec, range(spec.num_lanes), rows, states, first_step)
    return [np.stack([row.inputs for lane in group.next_step() for row in lane]) for _ in range(steps)]


@pytest.mark.parametrize("packing", ["wrap", "best_fit"])
def test_a_resume_with_another_seq_len_continues_as_planned(corpus_dir, tokenizer_dir, packing, caplog):
    table = _table(corpus_dir, packing, "document")
    old = _loader(corpus_dir, tokenizer_dir, table, 32, 8)  # 2 lanes x 4 rows of 32
    first = _loader_steps(old, 2, 8)
    saved = old.state_dict()
    old.close()
    new = _loader(corpus_dir, tokenizer_dir, table, 128, 4)  # 4x the length, half the rows
    with caplog.at_level("INFO"):
        new.load_state_dict(saved)
    assert "seq_len 32 -> 128 from step 3" in caplog.text
    got = _loader_steps(new, 3, 4)
    saved_new = new.state_dict()
    later = _loader_steps(new, 2, 4)
    new.close()
    assert [s.shape for s in got] == [(4, 128)] * 3
    # plan --from-checkpoint: the resume sequence's spec, from the checkpoint's state.
    spec_128 = _spec(corpus_dir, tokenizer_dir, 128, packing, "document", small=False)
    restored = read_state(Decoded(saved), range(2), fingerprint(spec_128))
    assert restored.seq_len_change == "seq_len 32 -> 128 from step 3"
    states = {lane: entry.state for lane, entry in restored.lanes.items()}
    planned = _engine_steps(restored.spec(spec_128), 2, 5, 2, states)
    assert all((x == y).all() for x, y in zip(got + later, planned))
    # The ledger records each step's seq_len from the change on (plan and the run alike: step_seq_len).
    entry = LedgerEntry.of(3, "0" * 64, 4, ["code", "prose"], [1, 2, 0], None, step_seq_len(restored.spec(spec_128), 3))
    assert json.loads(entry.to_json())["seq_len"] == 128 and step_seq_len(spec_128, 3) is None
    spec_32 = _spec(corpus_dir, tokenizer_dir, 32, packing, "document", small=False)
    assert all((x == y).all() for x, y in zip(first, _engine_steps(spec_32, 4, 2)))  # steps 1-2 as they were
    # Negative control: the same resume without the change differs from step 3 on.
    unchanged = _engine_steps(spec_32, 4, 3, 2, states)
    assert not any(x.shape == y.shape and (x == y).all() for x, y in zip(got, unchanged))
    # A checkpoint after the change records the run's seq_lens and resumes to the same steps.
    header = decode_entry(saved_new[HEADER_KEY], HEADER_KEY)
    assert json.loads(header["fingerprint"]["seq_lens"]) == [[1, 32, 32], [3, 128, 128]]
    again = _loader(corpus_dir, tokenizer_dir, table, 128, 4)
    again.load_state_dict(saved_new)
    assert all((x == y).all() for x, y in zip(_loader_steps(again, 2, 4), later))
    assert spec_from_portable(portable(again.spec)).eras == again.spec.eras  # worker processes have them
    again.close()
    # A reader that knows no seq_lens (an earlier release) refuses that checkpoint, naming it.
    with pytest.raises(ResumeError, match="seq_lens: "):
        check_fingerprint(header["fingerprint"], fingerprint(spec_128))


def test_what_may_change_with_seq_len_and_what_is_refused(corpus_dir, tokenizer_dir):
    spec_32 = _spec(corpus_dir, tokenizer_dir, 32, "wrap", "document", small=False)
    saved = engine_checkpoint(spec_32, 2)
    # The same seq_len: the spec stays the config's (no eras, no seq_lens: checkpoints keep their form).
    restored = read_state(Decoded(saved), range(2), fingerprint(spec_32))
    assert restored.spec(spec_32) is spec_32 and not restored.seq_len_change
    # mix_chunk_tokens set: it stays what it is across the change (no note in the line when it follows seq_len).
    table = _table(corpus_dir, "wrap", "document")
    set_16 = make_spec(corpus_dir, tokenizer_dir, seq_len=32, mix_chunk_tokens=16, **table)
    long_16 = make_spec(corpus_dir, tokenizer_dir, seq_len=128, mix_chunk_tokens=16, **table)
    restored = read_state(Decoded(engine_checkpoint(set_16, 2)), range(2), fingerprint(long_16))
    assert restored.seq_len_change == "seq_len 32 -> 128 from step 3"
    assert [(e.seq_len, e.chunk) for e in restored.eras] == [(32, 16), (128, 16)]
    # mix_chunk_tokens alone is not a change of the future: refused as before, naming it.
    with pytest.raises(ResumeError, match="mix_chunk_tokens: 32 -> 16"):
        read_state(Decoded(saved), range(2), fingerprint(set_16))
    # A damaged record of the run's seq_lens is refused in one line (control: the intact one restores above).
    fp = dict(fingerprint(long_16), seq_lens="[[1,32,16],[9,128,16]]")  # a change after the checkpoint's step
    with pytest.raises(ResumeError, match="fingerprint field 'seq_lens' is damaged"):
        read_state(Decoded(engine_checkpoint(long_16, 2, fp=fp)), range(2), fingerprint(long_16))


@pytest.mark.slow
@pytest.mark.parametrize("packing", ["wrap", "best_fit"])
def test_worker_processes_continue_across_a_seq_len_change_as_in_process(corpus_dir, tokenizer_dir, packing):
    from zephon_titan.engine import open_lane_group

    spec_a = _spec(corpus_dir, tokenizer_dir, 160, packing, "stream", small=False)
    resumed = _spec(corpus_dir, tokenizer_dir, 48, packing, "stream", small=False).continuing_at(spec_a, 2)
    group = LaneGroup(spec_a, range(2), 2, None, 0)
    group.next_step(), group.next_step()
    states = group.state()
    expected = _engine_steps(resumed, 3, 4, 2, states)
    with open_lane_group(resumed, range(2), 3, num_workers=2, states=states, first_step=2) as workers:
        got = [np.stack([row.inputs for lane in workers.next_step() for row in lane]) for _ in range(4)]
    assert all((x == y).all() for x, y in zip(got, expected)) and got[0].shape == (6, 48)
    # Negative control: the worker processes' rows are not those of the same resume without the change.
    unchanged = _engine_steps(spec_a.continuing(spec_a), 3, 1, 2, states)[0]
    assert unchanged.shape != got[0].shape
