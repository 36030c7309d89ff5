"""A committed checkpoint of the previous loader-state version (tests/fixtures/checkpoint_v2, header version 2,
written by a 2-rank data_run) resumes with this code to exactly the batches of a fresh run of its job."""

import json
import os

import pytest
from checkpoint_attacks import with_header_edited
from helpers import clone_fixture, data_run_resumed, fresh_plan

from zephon_titan.engine.ledger import read_ledger
from zephon_titan.errors import EXIT_USER_ERROR, ResumeError
from zephon_titan.plan import plan_ledger

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "checkpoint_v2")
SAVED_AT, STEPS = 3, 7
CHECKPOINT = f"checkpoint/step-{SAVED_AT}"


@pytest.fixture
def clone(tmp_path, monkeypatch):
    return clone_fixture(FIXTURE, tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def fresh():
    return fresh_plan(FIXTURE, STEPS)


def test_the_committed_ledger_is_a_fresh_runs_first_steps(clone, fresh):
    saved = read_ledger("ledger.jsonl")
    assert [e.step for e in saved] == list(range(1, SAVED_AT + 1))
    assert saved == [fresh[e.step] for e in saved]


def test_the_version_2_checkpoint_continues_the_fresh_run(clone, fresh):
    resumed = list(plan_ledger("job.toml", STEPS, CHECKPOINT))
    assert [e.step for e in resumed] == list(range(SAVED_AT + 1, STEPS + 1))
    assert resumed == [fresh[e.step] for e in resumed]


def test_data_run_resumes_the_version_2_checkpoint(clone, fresh, monkeypatch):
    assert data_run_resumed(CHECKPOINT, 5, monkeypatch) == [fresh[step] for step in range(1, 6)]


def test_an_unknown_version_is_refused_naming_it(clone):
    edited = with_header_edited(CHECKPOINT, "edited/step-3", lambda h: h.__setitem__("version", 1))
    with pytest.raises(ResumeError, match=r"format version 1, this zephon_titan reads versions 2, 3") as e:
        list(plan_ledger("job.toml", STEPS, edited))
    assert "\n" not in str(e.value)
    # Control: the header resealed unchanged still resumes (the edit, not the rewriting, is refused).
    same = with_header_edited(CHECKPOINT, "same/step-3", lambda h: None)
    assert [e.step for e in plan_ledger("job.toml", STEPS, same)] == list(range(SAVED_AT + 1, STEPS + 1))


def test_another_seed_is_refused_and_differs(clone, fresh):
    with open("job.toml") as f:
        text = f.read()
    with open("other.toml", "w") as f:
        f.write(text.replace("seed = 11", "seed = 12"))
    # The refusal names the checkpoint it read, then the change.
    with pytest.raises(ResumeError, match=rf"^{CHECKPOINT}: the checkpoint's data stream differs .*seed: 11 -> 12"):
        list(plan_ledger("other.toml", STEPS, CHECKPOINT))
    other = {e.step: e.sha256 for e in plan_ledger("other.toml", STEPS)}
    assert all(other[step] != fresh[step].sha256 for step in fresh)


def test_the_version_2_checkpoint_takes_a_seq_len_change(clone, fresh):
    # A checkpoint written before seq_len could change resumes at another length from its next step (issue 29):
    # rows of 64, each lane where it stopped; negative control: those steps are not the fresh run's at 32.
    (clone / "long.toml").write_text('[job]\nextends = "job.toml"\n[training]\nseq_len = 64\n')
    resumed = list(plan_ledger("long.toml", STEPS, CHECKPOINT))
    assert [e.step for e in resumed] == list(range(SAVED_AT + 1, STEPS + 1))
    assert {e.seq_len for e in resumed} == {64}
    assert all(e.sha256 != fresh[e.step].sha256 for e in resumed)


def _inspect(capsys, *args: str) -> list[dict]:
    from zephon_titan.cli import main

    assert main(["inspect", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _start(piece: dict) -> tuple:
    """Where a piece starts: its document (source, file, row or byte offset) and its first token."""
    return tuple(v for k, v in piece.items() if k not in ("doc_tokens", "row_tokens", "text")), piece["doc_tokens"][0]


def test_inspect_from_the_checkpoint_shows_the_steps_after_a_seq_len_change(clone, capsys):
    from zephon_titan.cli import main

    step = str(SAVED_AT + 1)
    fresh = _inspect(capsys, "job.toml", "--step", step)
    # The unchanged job from the checkpoint is the fresh run (the checkpoint continues it) ...
    assert _inspect(capsys, "job.toml", "--step", step, "--from-checkpoint", CHECKPOINT) == fresh
    (clone / "long.toml").write_text('[job]\nextends = "job.toml"\n[training]\nseq_len = 64\n')
    long = _inspect(capsys, "long.toml", "--step", step, "--from-checkpoint", CHECKPOINT)
    # ... at 64 every row is 64 tokens and each lane's first row starts where the fresh run's does (wrap: a lane
    # goes on where it stopped); negative control: the rows differ from the fresh run's.
    assert {r["seq_len"] for r in fresh} == {32} and {r["seq_len"] for r in long} == {64}
    assert [r["lane_row"] for r in long] == [r["lane_row"] for r in fresh]
    for a, b in zip(fresh, long):
        if a["lane_row"] % 2 == 0:  # 2 rows per lane per step: the lane's first row of the step
            assert _start(a["pieces"][0]) == _start(b["pieces"][0])
    assert [r["pieces"] for r in long] != [r["pieces"] for r in fresh]
    assert main(["inspect", "long.toml", "--step", step, "--lane", "1", "--from-checkpoint", CHECKPOINT]) == 0
    assert f"step {step}: rows of 64 tokens" in capsys.readouterr().out
    assert main(["inspect", "long.toml", "--step", str(SAVED_AT), "--from-checkpoint", CHECKPOINT]) == EXIT_USER_ERROR
    error = capsys.readouterr().err
    assert f"--step {SAVED_AT} is at or before the checkpoint's step {SAVED_AT};" in error and error.count("\n") == 1
