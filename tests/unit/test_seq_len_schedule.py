"""A seq_len schedule in the job (`[[dataloader.phases]] seq_len`, issue 29): from a phase's start_step every row has
its length, and each lane goes on exactly as a resume at that step with that seq_len would (the resume path of
test_seq_len_change.py is the reference); a checkpoint taken anywhere resumes to the same rows; every document's
tokens are trained once; the ledger records each step's seq_len; the schedule's past cannot change at a resume."""

from __future__ import annotations

import json

import pytest
from helpers import SEQ_LEN_CHANGE, make_spec
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_titan.engine import LaneState, LaneStream, fingerprint
from zephon_titan.engine.fingerprint import check_mixture
from zephon_titan.engine.ledger import step_seq_len
from zephon_titan.engine.portable_spec import portable, spec_from_portable
from zephon_titan.engine.stream import StepClock
from zephon_titan.errors import ConfigError, ResumeError
from zephon_titan.testing import assert_each_document_once, drain

WEIGHTS = {"code": 0.3, "prose": 0.7}


def _table(corpus_dir, packing, labels, change, lengths):
    packing, _, mixing = packing.partition("/")  # "best_fit/per_window": as runs saved before per_step mixed
    first, second = ({"seq_len": n} if n else {} for n in lengths)
    return dict(
        **({"best_fit_mixing": mixing} if mixing else {}),
        sources={
            "code": {"paths": [f"{corpus_dir}/code/part-00002.parquet"]},
            "prose": {"paths": [f"{corpus_dir}/prose/part-00001.jsonl"], "block_bytes": 16384},
        },
        phases=[
            {"start_step": 1, "weights": WEIGHTS, **first},
            {"start_step": change, "weights": WEIGHTS, **second},
        ],
        packing=packing,
        labels=labels,
        best_fit_window_docs=8,
        num_lanes=2,
        exhaustion="redistribute",
    )


@settings(max_examples=4, deadline=None)  # ~1 s of CPU each: a finite corpus drained three times
@given(
    **SEQ_LEN_CHANGE,
    change=st.integers(2, 5),
    r=st.sampled_from([1, 2, 3]),
    saved_at=st.integers(1, 7),
)
def test_a_scheduled_change_is_a_resume_at_that_step(
    corpus_dir, tokenizer_dir, packing, labels, longer, change, r, saved_at
):
    a, b = (48, 160) if longer else (160, 48)
    top = max(a, b)
    scheduled = make_spec(corpus_dir, tokenizer_dir, seq_len=top, **_table(corpus_dir, packing, labels, change, (a, b)))
    assert [(e.start, e.seq_len) for e in scheduled.eras] == [(1, a), (change, b)]
    # The reference: the same phases without seq_len, run at a, resumed after step change - 1 at b.
    plain = _table(corpus_dir, packing, labels, change, (0, 0))
    spec_a = make_spec(corpus_dir, tokenizer_dir, seq_len=a, **plain)
    resumed = make_spec(corpus_dir, tokenizer_dir, seq_len=b, **plain).continuing_at(spec_a, change - 1)
    epoch = []
    for lane in range(2):
        run = LaneStream(scheduled, lane, clock=StepClock(r))
        rows = run.take(saved_at * r)
        state = LaneState.from_dict(run.state().to_dict())  # a checkpoint anywhere, across the change too
        rows += drain(run)
        before = LaneStream(spec_a, lane, clock=StepClock(r))
        reference = before.take((change - 1) * r)
        cut = LaneState.from_dict(before.state().to_dict())
        reference += drain(LaneStream(resumed, lane, cut, StepClock(r, cut.rows, change - 1)))
        assert [x.to_bytes() for x in rows] == [x.to_bytes() for x in reference]
        lengths = [len(x.inputs) for x in rows]
        assert set(lengths[: (change - 1) * r]) == {a} and set(lengths[(change - 1) * r :]) <= {b}
        again = LaneStream(scheduled, lane, state, StepClock(r, state.rows, saved_at))
        assert [x.to_bytes() for x in drain(again)] == [x.to_bytes() for x in rows[saved_at * r :]]
        epoch += rows
    assert_each_document_once(scheduled, epoch)
    # Negative control: the same phases without the change are other rows from the change on.
    control = LaneStream(make_spec(corpus_dir, tokenizer_dir, seq_len=a, **plain), 0, clock=StepClock(r))
    first = LaneStream(scheduled, 0, clock=StepClock(r))
    assert [x.to_bytes() for x in control.take((change - 1) * r)] == [
        x.to_bytes() for x in first.take((change - 1) * r)
    ]
    assert control.next_row().to_bytes() != first.next_row().to_bytes()


def test_the_ledger_and_workers_know_the_schedule_and_its_past_is_fixed(corpus_dir, tokenizer_dir):
    table = _table(corpus_dir, "wrap", "document", 3, (64, 128))
    spec = make_spec(corpus_dir, tokenizer_dir, seq_len=128, **table)
    assert [step_seq_len(spec, s) for s in (1, 2, 3, 9)] == [64, 64, 128, 128]
    assert spec_from_portable(portable(spec)).eras == spec.eras  # worker processes
    # The checkpoint records the schedule (a resume appends to it: test_a_resume_appends_to_the_schedule).
    assert json.loads(fingerprint(spec)["seq_lens"]) == [[1, 64, 64], [3, 128, 128]]
    # A resume may move a seq_len change that has not happened yet; one already trained is refused in one line.
    later = make_spec(corpus_dir, tokenizer_dir, seq_len=128, **_table(corpus_dir, "wrap", "document", 5, (64, 128)))
    assert "from step 3 the weights are code 0.3, prose 0.7 at seq_len 64" in check_mixture(
        fingerprint(spec), fingerprint(later), 2
    )
    with pytest.raises(
        ResumeError, match=r"changed at step 3, at or before the checkpoint's step 4: .* at seq_len 128 ->"
    ):
        check_mixture(fingerprint(spec), fingerprint(later), 4)
    # Control: a job without a schedule keeps its fingerprint text (no seq_len written into its phases).
    plain = make_spec(corpus_dir, tokenizer_dir, seq_len=128, **_table(corpus_dir, "wrap", "document", 3, (0, 0)))
    assert "seq_len" not in str(fingerprint(plain).get("schedule")) and not plain.eras
    assert "seq_lens" not in fingerprint(plain)
    with pytest.raises(ConfigError, match=r"#2 \(start_step 3\) seq_len = 256 is above \[training\] seq_len = 128"):
        make_spec(corpus_dir, tokenizer_dir, seq_len=128, **_table(corpus_dir, "wrap", "document", 3, (64, 256)))


@pytest.mark.slow  # validate and inspect resolve the job as the trainer does (torch and TorchTitan imported)
def test_validate_prints_the_stages_and_inspect_each_steps_length(tmp_path, corpus_dir, tokenizer_dir, capsys):
    from zephon_titan.cli import main
    from zephon_titan.errors import EXIT_USER_ERROR
    from zephon_titan.titan.job import load_job

    head = f'hf_assets_path = "{tokenizer_dir}"\n[model]\nmodule = "llama3"\nconfig = "llama3_debugmodel"\n'
    sources = (
        f'[dataloader.sources.code]\npaths = ["{corpus_dir}/code/*.parquet"]\n'
        f'[dataloader.sources.prose]\npaths = ["{corpus_dir}/prose/*.jsonl"]\nblock_bytes = 16384\n'
    )
    phases = "".join(
        f"[[dataloader.phases]]\nstart_step = {start}\nweights = {{ code = 0.3, prose = 0.7 }}\nseq_len = {n}\n"
        for start, n in ((1, 64), (3, 128))
    )
    training = "[training]\nseq_len = 128\nlocal_batch_size = 2\nglobal_batch_size = 8\nsteps = 6\n"
    job, bad = tmp_path / "job.toml", tmp_path / "bad.toml"
    job.write_text(head + training + "disable_cuda_graphs = true\n[dataloader]\nnum_lanes = 4\n" + sources + phases)
    bad.write_text(head + training + "[dataloader]\nnum_lanes = 4\n" + sources + phases)
    assert main(["validate", str(job), "--no-count"]) == 0
    assert "steps 1-2: rows of 64; steps 3-6: rows of 128" in capsys.readouterr().out
    for step, n in ((2, 64), (3, 128)):
        assert main(["inspect", str(job), "--step", str(step), "--lane", "0"]) == 0
        assert f"step {step}: rows of {n} tokens" in capsys.readouterr().out
    # Without disable_cuda_graphs the job is refused before step 1, in one line.
    assert main(["validate", str(bad), "--no-count"]) == EXIT_USER_ERROR
    error = capsys.readouterr().err
    assert "seq_len (64 from step 1, 128 from step 3) needs [training] disable_cuda_graphs = true" in error
    assert error.count("\n") == 1
    # Under context parallelism (2) every scheduled length must divide by 4, as TorchTitan checks training.seq_len.
    cp = tmp_path / "cp.toml"
    cp.write_text(
        head + training + "disable_cuda_graphs = true\n[parallelism]\ncontext_parallel_degree = 2\n"
        "[dataloader]\nnum_lanes = 4\n" + sources + phases.replace("seq_len = 64", "seq_len = 62")
    )
    with pytest.raises(ConfigError, match=r"seq_len 62 \(from step 1\) is not divisible by 4, as the context"):
        load_job(str(cp)).check_seq_len_schedule()


def test_a_scheduled_run_resumes_by_the_resume_sequence_and_refuses_a_new_training_seq_len(corpus_dir, tokenizer_dir):
    from helpers import engine_checkpoint

    from zephon_titan.engine import LaneGroup
    from zephon_titan.engine.resume import read_state
    from zephon_titan.loader.state import Decoded

    spec = make_spec(corpus_dir, tokenizer_dir, seq_len=128, **_table(corpus_dir, "best_fit", "document", 3, (64, 128)))
    saved = engine_checkpoint(spec, 2)  # saved just before the change
    restored = read_state(Decoded(saved), range(2), fingerprint(spec))
    states = {lane: entry.state for lane, entry in restored.lanes.items()}
    resumed = LaneGroup(restored.spec(spec), range(2), 2, states, 2)
    uninterrupted = LaneGroup(spec, range(2), 2)
    for _ in range(2):
        uninterrupted.next_step()
    for _ in range(3):
        assert [r.to_bytes() for lane in resumed.next_step() for r in lane] == [
            r.to_bytes() for lane in uninterrupted.next_step() for r in lane
        ]
    # The same schedule with a longer training.seq_len at the resume: every era is the phases' own, so nothing
    # changes (the steps are the uninterrupted run's).
    longer = make_spec(
        corpus_dir, tokenizer_dir, seq_len=256, **_table(corpus_dir, "best_fit", "document", 3, (64, 128))
    )
    restored = read_state(Decoded(saved), range(2), fingerprint(longer))
    assert not restored.seq_len_change and restored.eras == spec.eras
    states = {lane: entry.state for lane, entry in restored.lanes.items()}
    again = LaneGroup(restored.spec(longer), range(2), 2, states, 2)
    fresh = LaneGroup(spec, range(2), 2)
    steps = [[r.to_bytes() for lane in fresh.next_step() for r in lane] for _ in range(5)][2:]
    assert [[r.to_bytes() for lane in again.next_step() for r in lane] for _ in range(3)] == steps


@pytest.mark.parametrize("packing", ["wrap", "best_fit"])
def test_a_resume_appends_to_the_schedule(corpus_dir, tokenizer_dir, packing):
    """A job whose first phase inherits [training] seq_len (128) and whose phase 5 sets 64, resumed after step 2 with
    [training] seq_len 96: rows of 128, then 96 from step 3, then the phase's 64 from step 5 (one schedule: the
    checkpoint's up to its step, this config's after it); every document once; a checkpoint of the resumed run
    (after step 4, before the phase) records that schedule and resumes to the same rows across the phase's change."""
    from helpers import engine_checkpoint

    from zephon_titan.engine import LaneGroup
    from zephon_titan.engine.resume import read_state
    from zephon_titan.loader.state import Decoded

    table = _table(corpus_dir, packing, "document", 5, (0, 64))
    first = make_spec(corpus_dir, tokenizer_dir, seq_len=128, **table)
    second = make_spec(corpus_dir, tokenizer_dir, seq_len=96, **table)
    restored = read_state(Decoded(engine_checkpoint(first, 2, rows=1)), range(2), fingerprint(second))
    assert restored.seq_len_change == "seq_len 128 -> 96 from step 3"
    resumed = restored.spec(second)
    assert [(e.start, e.seq_len) for e in resumed.eras] == [(1, 128), (3, 96), (5, 64)]
    assert [step_seq_len(resumed, s) for s in range(1, 8)] == [128, 128, 96, 96, 64, 64, 64]
    # Every document once: each lane's first 2 rows at 128, then the resumed lane to its end.
    epoch = []
    for lane in range(2):
        head = LaneStream(first, lane, clock=StepClock(1))
        rows = head.take(2)
        tail = drain(LaneStream(resumed, lane, head.state(), StepClock(1, 2, 2)))
        assert {len(r.inputs) for r in tail[:2]} == {96} and {len(r.inputs) for r in tail[2:]} == {64}
        epoch += rows + tail
    assert_each_document_once(first, epoch)
    # The resumed run saved after step 4 records its schedule; resumed with the same config, the same rows follow.
    group = LaneGroup(resumed, range(2), 1, restored_states(restored), 2)
    for _ in range(2):
        group.next_step()
    saved = engine_checkpoint(resumed, 4, rows=1, group=group)
    assert json.loads(fingerprint(resumed)["seq_lens"]) == [[1, 128, 128], [3, 96, 96], [5, 64, 64]]
    later = read_state(Decoded(saved), range(2), fingerprint(second))
    assert later.eras == resumed.eras and not later.seq_len_change
    expected = [[r.to_bytes() for lane in group.next_step() for r in lane] for _ in range(3)]
    again = LaneGroup(later.spec(second), range(2), 1, restored_states(later), 4)
    assert [[r.to_bytes() for lane in again.next_step() for r in lane] for _ in range(3)] == expected
    # A checkpoint of the schedule written before checkpoints recorded it: its own seq_len resumes as before
    # (control), another is refused in one line (the lengths its phases inherited are not in it).
    unrecorded = {k: v for k, v in fingerprint(first).items() if k != "seq_lens"}
    legacy = Decoded(engine_checkpoint(first, 2, rows=1, fp=unrecorded))
    assert read_state(legacy, range(2), fingerprint(first)).eras == first.eras
    with pytest.raises(
        ResumeError, match=r"written before checkpoints recorded the schedule.* \[training\] seq_len = 128"
    ):
        read_state(legacy, range(2), fingerprint(second))
    # Negative control: the same lanes without the schedule's change at step 5 (rows of 96 on) differ.
    flat = make_spec(corpus_dir, tokenizer_dir, seq_len=96, **_table(corpus_dir, packing, "document", 5, (0, 0)))
    plain = LaneGroup(flat.continuing_at(first, 2), range(2), 1, restored_states(later), 4)
    assert [[r.to_bytes() for lane in plain.next_step() for r in lane] for _ in range(3)] != expected


def restored_states(restored):
    return {lane: entry.state for lane, entry in restored.lanes.items()}
