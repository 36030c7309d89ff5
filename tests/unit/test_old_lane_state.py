"""A committed checkpoint whose lane states are flat (tests/fixtures/checkpoint_state_v2: lane-state version 2,
best_fit windows open under a mixture schedule, an exclusion and a keep, written by a 2-rank data_run) resumes
with this code to exactly the batches of a fresh run of its job, on any number of ranks."""

import os

import pytest
from helpers import clone_fixture, data_run_resumed, fresh_plan

from zephon_titan.engine.ledger import read_ledger
from zephon_titan.engine.state import FeedState, LaneState, MixState, PackerState, SourceCursor
from zephon_titan.errors import ResumeError
from zephon_titan.plan import plan_ledger

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "checkpoint_state_v2")
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


def test_the_flat_lane_states_continue_the_fresh_run(clone, fresh):
    resumed = list(plan_ledger("job.toml", STEPS, CHECKPOINT))
    assert [e.step for e in resumed] == list(range(SAVED_AT + 1, STEPS + 1))
    assert resumed == [fresh[e.step] for e in resumed]
    # Negative control: the same checkpoint with a stricter keep from step 4 gives other batches (the comparison
    # can fail).
    (clone / "other.toml").write_text(
        '[job]\nextends = "job.toml"\n[dataloader]\npipeline_from_step = 4\n'
        '[dataloader.sources.web]\nkeep = "chars > 80"\n'
    )
    other = list(plan_ledger("other.toml", STEPS, CHECKPOINT))
    assert [e.sha256 for e in other] != [e.sha256 for e in resumed]


def test_data_run_resumes_the_flat_lane_states_on_one_rank(clone, fresh, monkeypatch):
    assert data_run_resumed(CHECKPOINT, 5, monkeypatch) == [fresh[step] for step in range(1, 6)]


FLAT = {
    "version": 2,
    "lane_id": 0,
    "rows": 6,
    "cursors": [[0, 0, 64, 64], [0, 2, 108, 32]],
    "mix": [3, [32, 108]],
    "unit_open": True,
    "unit_offset": 2,
    "window_rows": 2,
    "excluding": True,
    "pipeline_era": 1,
}


def test_a_flat_state_is_read_into_each_stages_own_state():
    state = LaneState.from_dict(FLAT)
    assert state.feed == FeedState(
        (
            SourceCursor(window=0, position=0, tokens=64, offset=64),
            SourceCursor(window=0, position=2, tokens=108, offset=32),
        ),
        MixState(3, (32, 108)),
        excluding=True,
        era=1,
    )
    assert state.packer == PackerState(True, 2, window_rows=2)
    # Written back in the stages' layout, and read again to the same state.
    nested = state.to_dict()
    assert nested["version"] == 3 and set(nested) == {"version", "lane_id", "rows", "feed", "packer"}
    assert nested["packer"] == {"unit_open": True, "unit_offset": 2, "window_rows": 2}
    assert LaneState.from_dict(nested) == state
    # The flat layout is read with its own keys only (a stage's key in it, or an unknown key, is refused), and its
    # fields are checked as the stages' are.
    for bad, match in (
        ({**FLAT, "feed": {}}, r"the state must have keys"),
        ({**FLAT, "era": 1}, r"the state must have keys"),
        ({**FLAT, "unit_open": False, "unit_offset": 0}, r"field 'packer.window_rows' is 2 with no open unit"),
        ({**FLAT, "pipeline_era": -1}, r"field 'feed.era' must be an integer >= 0"),
    ):
        with pytest.raises(ResumeError, match=match):
            LaneState.from_dict(bad)
    with pytest.raises(
        ResumeError, match=r"version 4 is not supported by this zephon_titan \(it reads versions 2, 3\)"
    ):
        LaneState.from_dict({**nested, "version": 4})
