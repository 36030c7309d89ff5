"""Mixture schedules through real torchrun processes and DCP checkpoints (the data path, data_run):
a two-phase run saved on 2 ranks and resumed on 4 across the phase boundary equals the uninterrupted
run and `plan`; a run saved on 4 ranks and resumed on 2 with an annealing phase over an added source
keeps its past and follows `plan` of the new schedule from the checkpoint; a change to the past is
refused."""

from __future__ import annotations

import os
import shutil

import pytest
from conftest import CPU_CONFIG, check, torchrun

from zephon_titan.engine.ledger import read_ledger
from zephon_titan.plan import plan_ledger

# Slow tier (schedules through the real trainer (in process: unit/test_schedule.py)).
pytestmark = [pytest.mark.integration, pytest.mark.slow]
MODULE = "zephon_titan.titan.data_run"
STEPS = 6

# The CPU debug job's sources (weights removed: they come from the phases); B adds `anneal` at its resume.
ANNEAL = '\n[dataloader.sources.anneal]\npaths = ["demo_out/prose/*.jsonl"]\nblock_bytes = 8192\n'
PHASES_A = """
[[dataloader.phases]]
start_step = 1
weights = { code = 0.2, prose = 0.8 }

[[dataloader.phases]]
start_step = 4
weights = { code = 0.8, prose = 0.2 }
"""
# B: A's past, then from step 5 (two steps after a step-3 checkpoint) an annealing phase, ramped, over a
# source that A did not have.
PHASES_B = (
    ANNEAL
    + PHASES_A
    + """
[[dataloader.phases]]
start_step = 5
ramp_steps = 1
weights = { anneal = 0.6, code = 0.4 }
"""
)
# C changes step 3, which a step-3 checkpoint has already trained on.
PHASES_C = PHASES_A.replace("start_step = 4", "start_step = 3")


def _job(workdir: str, name: str, phases: str) -> str:
    with open(CPU_CONFIG) as f:
        text = f.read()
    for weight in ("weight = 0.3\n", "weight = 0.7\n"):
        assert weight in text
        text = text.replace(weight, "")
    path = os.path.join(workdir, name)
    with open(path, "w") as f:
        f.write(text + phases)
    return path


def _data_run(workdir: str, job: str, nproc: int, ledger_name: str, *extra: str):
    args = ["--job.config_file", job, "--steps", str(STEPS), "--local-batch-size", "2", "--ledger", ledger_name]
    result = check(torchrun(workdir, MODULE, nproc, [*args, *extra]))
    return {e.step: e for e in read_ledger(os.path.join(workdir, ledger_name))}, result.stdout + result.stderr


def _copy(workdir: str, src: str, dst: str) -> None:
    shutil.copy(os.path.join(workdir, src), os.path.join(workdir, dst))


@pytest.fixture(scope="module")
def jobs(workdir):
    return {
        name: _job(workdir, f"schedule_{name}.toml", phases)
        for name, phases in zip("ABC", (PHASES_A, PHASES_B, PHASES_C))
    }


@pytest.fixture(scope="module")
def runs(workdir, jobs):
    """A on 2 ranks (saved at 2); resumed on 4 ranks across the phase at step 4 (saved at 3); that
    step-3 checkpoint resumed on 2 ranks with B."""
    out = {}
    out["A on 2"], _ = _data_run(workdir, jobs["A"], 2, "sched/a2.jsonl", "--save-at", "2", "--checkpoint", "sched/a2")
    # A resumed run appends to its ledger (which keeps the steps up to the checkpoint), as the trainer's does.
    _copy(workdir, "sched/a2.jsonl", "sched/a24.jsonl")
    resume = ["--resume", "sched/a2/step-2", "--save-at", "3", "--checkpoint", "sched/a24"]
    out["A 2 -> 4"], _ = _data_run(workdir, jobs["A"], 4, "sched/a24.jsonl", *resume)
    _copy(workdir, "sched/a24.jsonl", "sched/ab.jsonl")
    out["A -> B"], out["B log"] = _data_run(workdir, jobs["B"], 2, "sched/ab.jsonl", "--resume", "sched/a24/step-3")
    return out


def test_a_two_phase_run_resumed_across_the_boundary_equals_the_uninterrupted_run_and_the_plan(
    workdir, jobs, runs, monkeypatch
):
    monkeypatch.chdir(workdir)
    planned = {e.step: e for e in plan_ledger(jobs["A"], STEPS)}
    assert runs["A on 2"] == planned
    assert runs["A 2 -> 4"] == planned  # steps 1-2 on 2 ranks, 3-6 on 4 across the phase at step 4
    assert planned[3].weights == {"code": 0.2, "prose": 0.8} and planned[4].weights == {"code": 0.8, "prose": 0.2}
    code = [planned[s].tokens["code"] / sum(planned[s].tokens.values()) for s in range(1, STEPS + 1)]
    assert max(code[:3]) < 0.5 < min(code[3:]), code  # the phase changes at step 4, in every lane at once


def test_a_new_future_at_resume_keeps_the_past_and_follows_the_new_plan(workdir, jobs, runs, monkeypatch):
    monkeypatch.chdir(workdir)
    resumed = runs["A -> B"]
    assert {s: resumed[s] for s in (1, 2, 3)} == {s: runs["A 2 -> 4"][s] for s in (1, 2, 3)}  # the past, unchanged
    planned = {e.step: e for e in plan_ledger(jobs["B"], STEPS, "sched/a24/step-3")}
    assert sorted(planned) == [4, 5, 6] and {s: resumed[s] for s in planned} == planned
    assert "the mixture schedule changes after the checkpoint's step 3: from step 5" in runs["B log"]
    assert "sources added at this resume: anneal" in runs["B log"]
    assert resumed[4].tokens["anneal"] == 0 and resumed[5].tokens["anneal"] > 0 and resumed[6].tokens["anneal"] > 0
    # Negative control: without the resume's new phase the steps after the checkpoint are A's.
    assert resumed[5] != runs["A 2 -> 4"][5]


def test_a_change_to_the_past_is_refused_before_the_first_step(workdir, jobs, runs):
    result = torchrun(
        workdir, MODULE, 2, ["--job.config_file", jobs["C"], "--steps", "5", "--resume", "sched/a24/step-3"]
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "the mixture schedule changed at step 3, at or before the checkpoint's step 3" in output
    # Our line names the checkpoint it read, then the change.
    ours = [
        line for line in output.splitlines() if line.startswith("zephon_titan: error: sched/a24/step-3: the mixture")
    ]
    assert len(ours) == 1  # once, not once per rank (torchrun's summary quotes it as the root cause)
    assert "zephon_titan/" not in output  # no traceback from our processes
