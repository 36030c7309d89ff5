"""A rank killed during training, or during a checkpoint save: the restarted job resumes from the last
complete checkpoint and its ledger equals the uninterrupted run's, step for step."""

import os

import pytest
from conftest import CPU_CONFIG, check, cpu_job_args, ledger, losses, torchrun

# Slow tier (a killed rank restarts exactly (the restore itself is proven in the gate)).
pytestmark = [pytest.mark.integration, pytest.mark.slow]
STEPS = 6


def _train(workdir, run, kill=None):
    args = cpu_job_args(run, STEPS, "--comm.init_timeout_seconds", "60")
    env = {"ZEPHON_TEST_KILL": kill} if kill else None
    module = (
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "fault_train.py") if kill else "zephon_titan.train_cpu"
    )
    return torchrun(workdir, module, 2, args, env=env)


@pytest.fixture(scope="module")
def reference(workdir):
    """The uninterrupted run's ledger, equal to the offline plan of the job."""
    from zephon_titan.plan import plan_ledger

    check(_train(workdir, "faults/reference"))
    ran = ledger(os.path.join(workdir, "faults/reference/checkpoint/ledger.jsonl"))
    cwd = os.getcwd()
    os.chdir(workdir)  # the job's paths are relative to its folder
    try:
        planned = {e.step: e.sha256 for e in plan_ledger(CPU_CONFIG, STEPS)}
    finally:
        os.chdir(cwd)
    assert ran == planned and len(set(ran.values())) == STEPS
    return ran


@pytest.mark.parametrize("kill, resumes_from", [("1:4", 3), ("save:1:4", 3)])
def test_restart_after_a_killed_rank_matches_the_uninterrupted_run(workdir, reference, kill, resumes_from):
    run = f"faults/{kill.replace(':', '_')}"
    crashed = _train(workdir, run, kill)
    assert crashed.returncode != 0
    folder = os.path.join(workdir, run, "checkpoint")
    if kill.startswith("save"):  # the interrupted save left no usable step-4 checkpoint
        assert not os.path.exists(os.path.join(folder, "step-4", ".metadata"))
    restarted = check(_train(workdir, run))
    assert min(losses(restarted.stdout + restarted.stderr)) == resumes_from  # from the step-2 checkpoint
    assert ledger(os.path.join(folder, "ledger.jsonl")) == reference
