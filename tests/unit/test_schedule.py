"""Mixture schedules (engine/schedule.py): phases by optimizer step, ramps, exact restores, the same
rows for every W, and a resume that may change the schedule's future but never its past."""

from __future__ import annotations

import pytest
from helpers import data_table, make_spec, rows_digest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_titan.config import config_from_dict
from zephon_titan.engine import (
    LaneGroup,
    LaneState,
    LaneStream,
    check_fingerprint,
    check_mixture,
    fingerprint,
    tally,
)
from zephon_titan.engine.schedule import Phase, Schedule
from zephon_titan.engine.stream import StepClock
from zephon_titan.errors import ConfigError, ResumeError
from zephon_titan.testing import assert_restores_exactly, assert_same_rows_for_any_layout

R = 2  # rows per lane per step


def _sources(corpus_dir, **extra):
    return {
        "code": {"paths": [f"{corpus_dir}/code/*.parquet"]},
        "prose": {"paths": [f"{corpus_dir}/prose/*.jsonl"], "block_bytes": 16384},
        **extra,
    }


TWO_PHASES = [
    {"start_step": 1, "weights": {"code": 0.2, "prose": 0.8}},
    {"start_step": 4, "weights": {"code": 0.8, "prose": 0.2}},
]


def _spec(corpus_dir, tokenizer_dir, phases=TWO_PHASES, **overrides):
    return make_spec(corpus_dir, tokenizer_dir, sources=_sources(corpus_dir), phases=phases, **overrides)


def test_segments_of_phases_and_ramps():
    schedule = Schedule(["a", "b"], [Phase(1, (1.0, 0.0)), Phase(5, (0.0, 1.0), ramp_steps=3), Phase(20, (0.5, 0.5))])
    assert schedule.scheduled
    assert [schedule.segment(s).start for s in (1, 4, 5, 6, 7, 8, 19, 20, 99)] == [1, 1, 5, 6, 7, 8, 8, 20, 20]
    assert schedule.segment(4).weights == (1.0, 0.0)
    assert schedule.segment(5).weights == pytest.approx((0.75, 0.25))  # a quarter of the way
    assert schedule.segment(7).weights == pytest.approx((0.25, 0.75))
    assert schedule.segment(8).weights == (0.0, 1.0)
    assert Schedule.from_description(schedule.describe()).describe() == schedule.describe()
    assert not Schedule(["a"], [Phase(1, (1.0,))]).scheduled


def test_first_difference_is_the_first_step_that_mixes_otherwise():
    base = Schedule(["a", "b"], [Phase(1, (0.5, 0.5)), Phase(10, (0.9, 0.1), ramp_steps=4)])
    later = Schedule(["a", "b"], [Phase(1, (0.5, 0.5)), Phase(12, (0.9, 0.1))])
    assert base.first_difference(later, 9) is None
    assert base.first_difference(later, 100) == 10
    steeper = Schedule(["a", "b"], [Phase(1, (0.5, 0.5)), Phase(10, (0.9, 0.1), ramp_steps=2)])
    assert base.first_difference(steeper, 10) == 10  # inside the ramp


@pytest.mark.parametrize(
    "phases, message",
    [
        ([{"start_step": 2, "weights": {"code": 1}}], "the first phase must start at step 1"),
        (TWO_PHASES[::-1], "the first phase must start at step 1"),
        (TWO_PHASES + [{"start_step": 3, "weights": {"code": 1}}], "increasing start_step order"),
        ([{"start_step": 1, "weights": {"cdoe": 1}}], "unknown source 'cdoe'; did you mean 'code'"),
        ([{"start_step": 1, "weights": {"code": -1}}], "weight of 'code' must be a finite number >= 0"),
        ([{"start_step": 1, "weights": {"code": 0}}], "no source has a weight > 0"),
        ([TWO_PHASES[0], {**TWO_PHASES[1], "ramp_steps": 9}, {"start_step": 10, "weights": {"code": 1}}], "runs into"),
        ([{"start_step": 1, "weights": {"code": 1}, "ramp": 3}], "unknown key 'ramp'"),
        ([{"start_step": 1}], "needs start_step"),
    ],
)
def test_schedule_mistakes_name_the_phase(corpus_dir, tokenizer_dir, phases, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict({"sources": _sources(corpus_dir), "phases": phases})


def test_a_source_weight_beside_phases_is_refused(corpus_dir):
    sources = _sources(corpus_dir)
    sources["code"]["weight"] = 0.5
    with pytest.raises(ConfigError, match=r"\[dataloader.sources.code\] weight: with \[\[dataloader.phases\]\]"):
        config_from_dict({"sources": sources, "phases": TWO_PHASES})


def _steps(spec, steps, first_step=0, states=None, lanes=None):
    lanes = range(spec.num_lanes) if lanes is None else lanes
    group = LaneGroup(spec, lanes, R, states, first_step)
    return [group.next_step() for _ in range(steps)], group


def _code_share(step) -> float:
    counts = tally((row for rows in step for row in rows), 2)
    return counts[0] / (counts[0] + counts[1])


def test_each_phase_mixes_its_own_weights_from_its_first_step(corpus_dir, tokenizer_dir):
    spec = _spec(corpus_dir, tokenizer_dir, num_lanes=8, seq_len=32)
    steps, _ = _steps(spec, 8)
    shares = [_code_share(step) for step in steps]
    assert all(abs(s - 0.2) < 0.2 for s in shares[:3]), shares
    assert all(abs(s - 0.8) < 0.2 for s in shares[3:]), shares  # from step 4 on, not after a debt is paid
    # Negative control: without the second phase, steps 4-8 keep the first phase's mixture.
    flat, _ = _steps(_spec(corpus_dir, tokenizer_dir, phases=TWO_PHASES[:1], num_lanes=8, seq_len=32), 8)
    assert all(_code_share(step) < 0.45 for step in flat[3:])


@settings(max_examples=12, deadline=None)
@given(
    lane=st.integers(0, 7),
    cut=st.integers(0, 24),
    packing=st.sampled_from(["wrap", "best_fit"]),
    ramp=st.integers(0, 3),
)
def test_restore_is_exact_at_random_cuts_under_a_schedule(corpus_dir, tokenizer_dir, lane, cut, packing, ramp):
    phases = [TWO_PHASES[0], {**TWO_PHASES[1], "ramp_steps": ramp}, {"start_step": 9, "weights": {"prose": 1}}]
    spec = _spec(corpus_dir, tokenizer_dir, phases=phases, packing=packing, seq_len=24, best_fit_window_docs=8)
    assert "mix" in LaneStream(spec, lane, clock=StepClock(R)).state().feed.to_dict()  # the mixer's place is saved
    assert_restores_exactly(spec, lane, [cut], rows=10, rows_per_step=R)


def test_rows_are_the_same_for_every_world_size(corpus_dir, tokenizer_dir):
    assert_same_rows_for_any_layout(_spec(corpus_dir, tokenizer_dir), rows_per_lane=R, steps=6)  # W = 2, 4, 8


def test_a_resume_in_the_middle_continues_by_step(corpus_dir, tokenizer_dir):
    """Save after step 2, resume with the step known: steps 3-6 (across the phase at 4) are unchanged."""
    spec = _spec(corpus_dir, tokenizer_dir)
    everything, _ = _steps(spec, 6)
    _, first = _steps(spec, 2)
    states = first.state()
    later, _ = _steps(spec, 4, first_step=2, states=states)
    assert [[rows_digest(r) for r in step] for step in later] == [[rows_digest(r) for r in s] for s in everything[2:]]
    # Negative control: resuming as if at step 0 puts the phase change elsewhere.
    wrong, _ = _steps(spec, 4, first_step=0, states=states)
    assert [[rows_digest(r) for r in step] for step in wrong] != [[rows_digest(r) for r in s] for s in everything[2:]]


def test_the_future_of_a_schedule_may_change_at_a_resume_its_past_may_not(corpus_dir, tokenizer_dir):
    sources = _sources(corpus_dir, anneal={"paths": [f"{corpus_dir}/prose/*.jsonl"], "block_bytes": 4096})
    a = [TWO_PHASES[0], {"start_step": 8, "weights": {"code": 1}}]  # `anneal` rests in every phase
    b = [TWO_PHASES[0], {"start_step": 5, "weights": {"anneal": 0.5, "code": 0.5}, "ramp_steps": 2}]

    def spec_of(phases):
        return make_spec(corpus_dir, tokenizer_dir, sources=sources, phases=phases)

    spec_a, spec_b = spec_of(a), spec_of(b)
    _, group = _steps(spec_a, 3)
    states = group.state()
    note = check_mixture(fingerprint(spec_a), fingerprint(spec_b), 3)
    assert (
        "changes after the checkpoint's step 3: from step 5 the weights are anneal 0.166667, code 0.3, prose 0.533333"
        in note
    )
    resumed, _ = _steps(spec_b, 5, first_step=3, states=states)
    planned, _ = _steps(spec_b, 5, first_step=3, states=states)
    assert [[rows_digest(r) for r in s] for s in resumed] == [[rows_digest(r) for r in s] for s in planned]
    assert _code_share(resumed[0]) < 0.5  # step 4: still the first phase
    anneal = [tally((row for rows in step for row in rows), 3)[0] for step in resumed]
    assert anneal[0] == 0 and all(anneal[3:])  # the annealing source from step 5 (a ramp) on
    # The past may not change: a schedule that differs at step 3 is refused, naming the step.
    c = [{"start_step": 1, "weights": {"code": 0.2, "prose": 0.8}}, {"start_step": 3, "weights": {"code": 1}}]
    with pytest.raises(ResumeError, match=r"changed at step 3, at or before the checkpoint's step 3: weights code 0.2"):
        check_mixture(fingerprint(spec_a), fingerprint(spec_of(c)), 3)
    assert check_mixture(fingerprint(spec_a), fingerprint(spec_of(c)), 2)  # allowed from a step-2 checkpoint


@pytest.mark.parametrize("packing", ["wrap", "best_fit"])
def test_a_resting_source_continues_where_it_was(corpus_dir, tokenizer_dir, packing):
    """code rests in steps 3-5 and comes back: each lane's code pieces are those it would have read
    without the pause, in order, nothing skipped or repeated (the pieces of a source depend only on its cursor)."""
    paused = [
        {"start_step": 1, "weights": {"code": 0.5, "prose": 0.5}},
        {"start_step": 3, "weights": {"prose": 1}},
        {"start_step": 6, "weights": {"code": 0.5, "prose": 0.5}},
    ]
    options = dict(packing=packing, seq_len=32, best_fit_window_docs=8)
    spec = _spec(corpus_dir, tokenizer_dir, phases=paused, **options)
    steady = _spec(corpus_dir, tokenizer_dir, phases=paused[:1], **options)

    def code_pieces(spec, steps):
        lanes, _ = _steps(spec, steps)
        per_lane = [[] for _ in range(spec.num_lanes)]
        for step in lanes:
            for lane, rows in enumerate(step):
                per_lane[lane] += [  # one entry per (input, label) pair: row cuts do not matter
                    (p.file, p.row, at)
                    for row in rows
                    for p in row.pieces
                    if p.source == 0
                    for at in range(p.doc_offset, p.doc_offset + p.length)
                ]
        return per_lane

    with_pause, without = code_pieces(spec, 9), code_pieces(steady, 9)
    for lane in range(spec.num_lanes):
        assert with_pause[lane] and with_pause[lane] == without[lane][: len(with_pause[lane])], lane
    if packing == "wrap":  # best_fit places a window drawn before the pause first (docs/changing-a-run.md: the lag)
        steps, _ = _steps(spec, 9)
        assert all(tally((row for rows in steps[t] for row in rows), 2)[0] == 0 for t in (3, 4))  # steps 4-5


def _source_tokens(steps, num_sources, names, source):
    """Per lane, one entry per (input, label) pair taken from `source`, in order (row cuts do not matter)."""
    s = names.index(source)
    per_lane = [[] for _ in range(len(steps[0]))]
    for step in steps:
        for lane, rows in enumerate(step):
            per_lane[lane] += [
                (p.file, p.row, at)
                for row in rows
                for p in row.pieces
                if p.source == s
                for at in range(p.doc_offset, p.doc_offset + p.length)
            ]
    return per_lane


@pytest.mark.parametrize("packing", ["wrap", "best_fit"])
def test_a_source_added_at_a_resume_starts_later_and_nothing_else_is_lost(corpus_dir, tokenizer_dir, packing):
    from zephon_titan.titan.dataloader import ZephonDataLoader

    options = dict(packing=packing, best_fit_window_docs=8)
    later = {"start_step": 6, "weights": {"anneal": 0.5, "code": 0.5}}
    anneal = {"anneal": {"paths": [f"{corpus_dir}/prose/*.jsonl"], "block_bytes": 4096}}
    table_a = dict(sources=_sources(corpus_dir), phases=TWO_PHASES, **options)
    table_b = dict(sources=_sources(corpus_dir, **anneal), phases=[*TWO_PHASES, later], **options)
    spec_a = make_spec(corpus_dir, tokenizer_dir, seq_len=32, **table_a)
    spec_b = make_spec(corpus_dir, tokenizer_dir, seq_len=32, **table_b).continuing(spec_a)

    def loader(table):
        config = ZephonDataLoader.Config(data=config_from_dict(data_table(corpus_dir, tokenizer_dir, **table)))
        config.global_batch_size = 16
        return config.build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=32, local_batch_size=2)

    old = loader(table_a)
    batches = iter(old)
    for _ in range(3 * 8):  # three steps of 8 microbatches
        next(batches)
    saved = old.state_dict()
    old.close()
    new = loader(table_b)
    new.load_state_dict(saved)  # the checkpoint's sources matched by name; `anneal` starts at its beginning
    assert new.consumed_tokens()[0] == 0 and new.consumed_tokens()[1:3] == old.consumed_tokens()[:2]
    first = next(iter(new))[0]["input"]
    new.close()

    before, group = _steps(spec_a, 3)
    states = {
        lane: state.with_sources(spec_a.source_names, spec_b.source_names) for lane, state in group.state().items()
    }
    after, _ = _steps(spec_b, 6, first_step=3, states=states)
    assert (first.numpy() == [row.inputs for row in after[0][0]]).all()  # the loader continues as the engine does
    anneal_tokens = [tally((row for rows in step for row in rows), 3)[0] for step in after]
    assert anneal_tokens[:2] == [0, 0] and anneal_tokens[-1]  # none in steps 4-5, then some
    assert all(anneal_tokens[2:])  # from step 6 on (best_fit too: no window is drawn across the phase start)
    # code and prose go on exactly where they were in every lane: the open units were replayed as drawn.
    steady, _ = _steps(spec_a, 9)
    for source in ("code", "prose"):
        joined = [
            a + b
            for a, b in zip(
                _source_tokens(before, 2, spec_a.source_names, source),
                _source_tokens(after, 3, spec_b.source_names, source),
            )
        ]
        reference = _source_tokens(steady, 2, spec_a.source_names, source)
        for lane, got in enumerate(joined):
            assert got and got == reference[lane][: len(got)], (source, lane)
    # A checkpoint taken while a unit drawn before the resume is still open (it keeps how to replay it)
    # resumes exactly too.
    replayed = 0
    for lane, state in states.items():
        clock = StepClock(R, state.rows, 3)
        stream = LaneStream(spec_b, lane, state, clock)
        stream.take(1)
        saved_again = stream.state().to_dict()
        replayed += "replay" in saved_again["feed"]
        expected = stream.take(8)
        again = LaneStream(spec_b, lane, LaneState.from_dict(saved_again), clock)
        assert rows_digest(again.take(8)) == rows_digest(expected), lane
    assert not replayed  # added sources move no phase (mixing.py): nothing to replay differently
    # A removed source is refused, naming it and the way to rest it instead.
    with pytest.raises(ResumeError, match=r"sources code were removed .* give it no weight in the phases"):
        group.state()[0].with_sources(spec_a.source_names, ["prose"])
    with pytest.raises(ResumeError, match=r"sources anneal were removed from the config"):  # at the header check
        check_fingerprint(fingerprint(spec_b), fingerprint(spec_a), mixture_checked_apart=True)
    check_fingerprint(fingerprint(spec_a), fingerprint(spec_b), mixture_checked_apart=True)  # adding is allowed
