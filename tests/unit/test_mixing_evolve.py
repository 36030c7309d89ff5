"""Runs that evolve (issue 29): a source added at a resume moves no step before its first weight; best_fit
follows a phased mixture step by step (best_fit_mixing = "per_step"); a checkpoint of a run that mixed the
earlier way (no `best_fit_mixing` in its fingerprint) resumes exactly as that run would have gone on."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import data_table, make_spec, rows_digest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_titan.config import config_from_dict
from zephon_titan.engine import LaneGroup, LaneState, LaneStream, fingerprint, tally
from zephon_titan.engine.portable_spec import portable, spec_from_portable
from zephon_titan.engine.resume import HEADER_KEY, Header, read_lane, read_state
from zephon_titan.engine.stream import StepClock
from zephon_titan.errors import ResumeError
from zephon_titan.loader.state import Decoded, decode_entry, encode_state
from zephon_titan.plan import packing_note

R = 2  # rows per lane per step
PHASES = [
    {"start_step": 1, "weights": {"code": 0.3, "prose": 0.7}},
    {"start_step": 5, "weights": {"code": 0.7, "prose": 0.3}},
]


def _sources(corpus_dir, anneal=False):
    sources = {
        "code": {"paths": [f"{corpus_dir}/code/*.parquet"]},
        "prose": {"paths": [f"{corpus_dir}/prose/*.jsonl"], "block_bytes": 16384},
    }
    if anneal:  # another source, added at a resume (it sorts first: every index moves)
        sources["anneal"] = {"paths": [f"{corpus_dir}/prose/*.jsonl"], "block_bytes": 4096}
    return sources


def _table(corpus_dir, packing, phases, anneal=False, **options):
    return dict(
        sources=_sources(corpus_dir, anneal),
        phases=phases,
        packing=packing,
        best_fit_window_docs=8,
        num_lanes=4,
        **options,
    )


def _spec(corpus_dir, tokenizer_dir, *args, **kwargs):
    return make_spec(corpus_dir, tokenizer_dir, seq_len=32, **_table(corpus_dir, *args, **kwargs))


def _run(spec, steps, first_step=0, states=None):
    group = LaneGroup(spec, range(spec.num_lanes), R, states, first_step)
    return [rows_digest(row for rows in group.next_step() for row in rows) for _ in range(steps)], group


_SPECS: dict = {}


def _cached(corpus_dir, tokenizer_dir, packing, phases_key, phases, anneal=False):
    key = (packing, phases_key, anneal)
    if key not in _SPECS:
        _SPECS[key] = _spec(corpus_dir, tokenizer_dir, packing, phases, anneal)
    return _SPECS[key]


@settings(max_examples=4, deadline=None)  # ~0.6 s each; the packers and cut points vary
@given(packing=st.sampled_from(["wrap", "best_fit"]), cut=st.integers(1, 5), rest=st.none() | st.integers(2, 4))
def test_a_source_added_at_a_resume_leaves_the_steps_before_its_weight_as_planned(
    corpus_dir, tokenizer_dir, packing, cut, rest
):
    total = 9
    first_weighted = total + 1 if rest is None else cut + rest  # the added source's first weighted step
    spec_a = _cached(corpus_dir, tokenizer_dir, packing, "plain", PHASES)
    original, _ = _run(spec_a, total)
    later = [{"start_step": first_weighted, "weights": {"anneal": 0.5, "code": 0.25, "prose": 0.25}}]
    kept = [p for p in PHASES if p["start_step"] < first_weighted]  # later ones come after the compared steps
    phases_b = kept + (later if rest is not None else PHASES[len(kept) :])
    spec_b = _cached(corpus_dir, tokenizer_dir, packing, first_weighted, phases_b, anneal=True).continuing(spec_a)
    _, group = _run(spec_a, cut)
    states = {lane: s.with_sources(spec_a.source_names, spec_b.source_names) for lane, s in group.state().items()}
    resumed, _ = _run(spec_b, total - cut, cut, states)
    before = first_weighted - 1 - cut  # steps cut+1 .. first_weighted-1: the added source rests
    assert resumed[:before] == original[cut : cut + before]
    # Negative control: other weights from the next step on change the steps after the checkpoint (wrap: from
    # the next step; best_fit: once the window open at the checkpoint, drawn for the first plan, is emitted).
    changed = [PHASES[0], {"start_step": cut + 1, "weights": {"code": 0.5, "prose": 0.5}}]
    spec_c = _spec(corpus_dir, tokenizer_dir, packing, changed, anneal=True).continuing(spec_a)
    other, _ = _run(spec_c, total - cut, cut, states)
    assert other != original[cut:]
    assert packing == "best_fit" or other[0] != original[cut]


def test_the_rule_before_issue_29_re_phased_the_steps_before_the_added_source(corpus_dir, tokenizer_dir):
    # Negative control of the property above: phases s / S over the new sources (the spec a new run of the
    # new config has, as every resume had before) change the steps although their weights did not.
    spec_a = _cached(corpus_dir, tokenizer_dir, "wrap", "plain", PHASES)
    original, group = _run(spec_a, 6)
    spec_b = _spec(corpus_dir, tokenizer_dir, "wrap", PHASES, anneal=True)  # not .continuing(spec_a)
    _, group = _run(spec_a, 2)
    states = {lane: s.with_sources(spec_a.source_names, spec_b.source_names) for lane, s in group.state().items()}
    resumed, _ = _run(spec_b, 4, 2, states)
    assert resumed != original[2:]
    grown = spec_b.continuing(spec_a)
    assert grown.phase_offsets is not None  # the kept offsets: not s / S
    assert spec_from_portable(portable(grown)).phase_offsets == grown.phase_offsets  # worker processes have them
    assert spec_a.continuing(spec_a) is spec_a  # nothing added: nothing changes


def _loader(corpus_dir, tokenizer_dir, table):
    from zephon_titan.titan.dataloader import ZephonDataLoader

    config = ZephonDataLoader.Config(data=config_from_dict(data_table(corpus_dir, tokenizer_dir, **table)))
    config.global_batch_size = 4 * R
    return config.build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=32, local_batch_size=2)


def _loader_steps(loader, steps):
    """The inputs of `steps` steps (4 microbatches of 2 rows each), as one array per step."""
    batches = iter(loader)
    return [np.concatenate([next(batches)[0]["input"].numpy() for _ in range(4)]) for _ in range(steps)]


def _engine_steps(spec, steps):
    group = LaneGroup(spec, range(4), R, None, 0)
    return [np.stack([row.inputs for rows in group.next_step() for row in rows]) for _ in range(steps)]


def test_a_checkpoint_of_a_per_window_run_resumes_per_window(corpus_dir, tokenizer_dir):
    # A best_fit run with phases saved as before best_fit_mixing existed: its fingerprint has no component.
    old_table = _table(corpus_dir, "best_fit", PHASES, best_fit_mixing="per_window")
    old = _loader(corpus_dir, tokenizer_dir, old_table)
    _loader_steps(old, 3)
    saved = old.state_dict()
    old.close()
    header = decode_entry(saved[HEADER_KEY], HEADER_KEY)
    assert "best_fit_mixing" not in header["fingerprint"] and "mix_phases" not in header["fingerprint"]
    new_table = _table(corpus_dir, "best_fit", PHASES)  # this release's default: per_step
    new = _loader(corpus_dir, tokenizer_dir, new_table)
    assert new.spec.config.best_fit_mixing == "per_step"
    new.load_state_dict(saved)
    assert new.spec.config.best_fit_mixing == "per_window"  # the run goes on as it was
    got = _loader_steps(new, 4)
    new.close()
    planned = _engine_steps(_spec(corpus_dir, tokenizer_dir, "best_fit", PHASES, best_fit_mixing="per_window"), 7)
    assert all((a == b).all() for a, b in zip(got, planned[3:]))
    # plan --from-checkpoint continues the same way (it reads the state as the loader does).
    spec_new = _spec(corpus_dir, tokenizer_dir, "best_fit", PHASES)
    restored = read_state(Decoded(saved), range(4), fingerprint(spec_new))
    assert restored.spec(spec_new).config.best_fit_mixing == "per_window"
    # Negative control: this release's way (a new run of the config) differs in those steps.
    per_step = _engine_steps(spec_new, 7)
    assert any((a != b).any() for a, b in zip(got, per_step[3:]))


def test_offsets_kept_across_added_sources_survive_the_next_checkpoint(corpus_dir, tokenizer_dir):
    # Run A (2 sources) -> resume B adds `anneal` -> checkpoint -> resume again: B's offsets, not s / S.
    a = _loader(corpus_dir, tokenizer_dir, _table(corpus_dir, "wrap", PHASES))
    _loader_steps(a, 2)
    saved_a = a.state_dict()
    a.close()
    spec_a = _spec(corpus_dir, tokenizer_dir, "wrap", PHASES)  # the same config: the spec stays as it is
    assert read_state(Decoded(saved_a), range(4), fingerprint(spec_a)).spec(spec_a) is spec_a
    table_b = _table(corpus_dir, "wrap", [*PHASES, {"start_step": 7, "weights": {"anneal": 1.0}}], anneal=True)
    b = _loader(corpus_dir, tokenizer_dir, table_b)
    b.load_state_dict(saved_a)
    _loader_steps(b, 2)
    saved_b = b.state_dict()
    expected = _loader_steps(b, 4)  # steps 5-8, uninterrupted
    b.close()
    record = json.loads(decode_entry(saved_b[HEADER_KEY], HEADER_KEY)["fingerprint"]["mix_phases"])
    assert record == {"anneal": "1/4", "code": "0", "prose": "1/2"}  # code 0, prose 1/2 kept; anneal between
    again = _loader(corpus_dir, tokenizer_dir, table_b)
    again.load_state_dict(saved_b)
    assert all((x == y).all() for x, y in zip(_loader_steps(again, 4), expected))
    again.close()
    # Negative control: a damaged record is refused, naming the field.
    header = decode_entry(saved_b[HEADER_KEY], HEADER_KEY)
    assert header["fingerprint"]["mix_phases"]
    fp = dict(header["fingerprint"], mix_phases='{"anneal":"1/4","code":"2","prose":"1/2"}')
    bad_header = Header(header["version"], header["global_batch_size"], header["step"], fp)
    lanes = {
        lane: read_lane(Decoded(saved_b), lane, Header.from_entry(Decoded(saved_b)), ["anneal", "code", "prose"])
        for lane in range(4)
    }
    bad = encode_state(bad_header, lanes, 3)
    with pytest.raises(ResumeError, match="'mix_phases' is damaged"):
        read_state(Decoded(bad), range(4), fingerprint(_spec(corpus_dir, tokenizer_dir, "wrap", PHASES, anneal=True)))


def test_a_best_fit_window_replays_with_its_row_budget_after_a_batch_size_change(corpus_dir, tokenizer_dir):
    # A window drawn before a phase start stops at the rows left before it (by the clock of its draw); the state
    # keeps that budget, so a resume with another global batch size (another clock) replays the same window.
    spec = make_spec(
        corpus_dir, tokenizer_dir, seq_len=32, num_lanes=1, packing="best_fit", best_fit_window_docs=64,
        sources=_sources(corpus_dir), phases=[PHASES[0], {**PHASES[1], "start_step": 4}],
    )  # fmt: skip
    reference = LaneStream(spec, 0, None, StepClock(R))
    reference.take(2 * R)
    state = reference.state()
    # Drawn at row 0: 3 steps of 2 rows before step 4.
    assert state.packer.unit_open and state.packer.window_rows == 3 * R
    left = len(reference.packer._rows) - state.packer.unit_offset  # the window's rows still to come
    expected = [rows_digest([row]) for row in reference.take(left + 3 * R)]

    def resumed(data, rows_per_step, rows):
        stream = LaneStream(spec, 0, LaneState.from_dict(data), StepClock(rows_per_step, state.rows, 2))
        return [rows_digest([row]) for row in stream.take(rows)]

    assert resumed(state.to_dict(), R, left + 3 * R) == expected
    assert resumed(state.to_dict(), 2 * R, left) == expected[:left]  # G doubled: the same window
    # Negative control: the window redrawn without its budget is another window: what follows it differs.
    data = state.to_dict()
    del data["packer"]["window_rows"]
    assert resumed(data, R, left + 3 * R) != expected
    # The field is checked like the others: never without an open unit.
    packer = state.packer.to_dict()
    with pytest.raises(ResumeError, match="'packer.window_rows' is 6 with no open unit"):
        LaneState.from_dict({**state.to_dict(), "packer": {**packer, "unit_open": False, "unit_offset": 0}})
    with pytest.raises(ResumeError, match="'packer.window_rows' is 0 with an open unit"):
        LaneState.from_dict({**state.to_dict(), "packer": {**packer, "window_rows": 0}})


def _books(tmp_path, prose_docs) -> str:
    path = tmp_path / "books.jsonl"
    with open(path, "w", encoding="utf-8") as f:  # ~5 documents of 10k+ tokens
        for i in range(5):
            f.write(json.dumps({"text": "\n\n".join(prose_docs[i * 15 : (i + 1) * 15])}) + "\n")
    return str(path)


def _errors(spec, steps):
    """Per step: the largest |share - weight| over the sources, and the tokens of sources at weight 0."""
    group = LaneGroup(spec, range(spec.num_lanes), R, None, 0)
    errors, resting = [], []
    for step in range(1, steps + 1):
        counts = tally((row for rows in group.next_step() for row in rows), len(spec.sources))[:-1]
        weights = spec.schedule.segment(step).weights
        errors.append(max(abs(c / sum(counts) - w) for c, w in zip(counts, weights)))
        resting.append(sum(c for c, w in zip(counts, weights) if w == 0))
    return errors, resting


@pytest.mark.parametrize("window", [pytest.param(12, marks=pytest.mark.slow), 256])
def test_best_fit_per_step_holds_a_phased_mixture(tmp_path, corpus_dir, tokenizer_dir, prose_docs, window):
    # Three sources of different document lengths; the phase at step 5 rests `books` (docs/mixture.md's table).
    sources = {**_sources(corpus_dir), "books": {"paths": [_books(tmp_path, prose_docs)]}}
    phases = [
        {"start_step": 1, "weights": {"books": 0.5, "code": 0.2, "prose": 0.3}},
        {"start_step": 5, "weights": {"code": 0.5, "prose": 0.5}},
    ]

    def spec(mixing):
        return make_spec(
            corpus_dir, tokenizer_dir, seq_len=128, num_lanes=8, packing="best_fit", best_fit_window_docs=window,
            best_fit_mixing=mixing, sources=sources, phases=phases,
        )  # fmt: skip

    assert "per_step" in packing_note(spec("per_step"))  # what `plan --mixture` prints of the bound
    assert f"windows of {window} documents" in packing_note(spec("per_window"))
    errors, resting = _errors(spec("per_step"), 8)
    assert max(errors) <= 0.25 and max(resting[4:]) <= 8 * 128 // 2, (errors, resting)  # half a row per lane
    # Negative control: the windows as placed (before issue 29) break the same bounds.
    errors, resting = _errors(spec("per_window"), 8)
    assert max(errors) > 0.25 or max(resting[4:]) > 8 * 128 // 2, (errors, resting)


def test_plan_from_a_per_window_checkpoint_continues_it_and_says_so(tmp_path, corpus_dir, tokenizer_dir, capsys):
    import warnings

    import torch.distributed.checkpoint as dcp
    from helpers import write_job

    from zephon_titan.cli import main
    from zephon_titan.plan import plan_ledger
    from zephon_titan.titan.job import load_job

    best_fit = 'packing = "best_fit"\nbest_fit_window_docs = 8\n'
    old_job = write_job(
        tmp_path / "old.toml",
        corpus_dir,
        tokenizer_dir,
        seq_len=128,
        dataloader=best_fit + 'best_fit_mixing = "per_window"',
    )
    new_job = write_job(tmp_path / "new.toml", corpus_dir, tokenizer_dir, seq_len=128, dataloader=best_fit)
    job = load_job(old_job)  # a run saved before best_fit_mixing existed (its fingerprint has none)
    loader = job.config.dataloader.build(
        dp_world_size=1, dp_rank=0, tokenizer=job.trainer_tokenizer(), seq_len=128, local_batch_size=2
    )
    batches = iter(loader)
    for _ in range(2 * 8):  # two steps of 8 microbatches
        next(batches)
    checkpoint = str(tmp_path / "step-2")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"dataloader": loader}, checkpoint_id=checkpoint)
    loader.close()
    first_plan = {e.step: e for e in plan_ledger(old_job, 4)}
    assert list(plan_ledger(new_job, 4, checkpoint)) == [first_plan[3], first_plan[4]]  # the run goes on as it was
    assert (
        main(["plan", new_job, "--steps", "4", "--from-checkpoint", checkpoint, "--mixture", "-o", str(tmp_path / "p")])
        == 0
    )
    assert 'best_fit_mixing = "per_window"' in capsys.readouterr().out  # plan --mixture says how it mixes
    # Negative control: a new run of the new config (per_step) is another plan for those steps.
    new_plan = {e.step: e.sha256 for e in plan_ledger(new_job, 4)}
    assert [new_plan[3], new_plan[4]] != [first_plan[3].sha256, first_plan[4].sha256]
