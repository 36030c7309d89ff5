"""Elastic while running, no row lost or repeated (issue 49): examples/ft_run.py end to end with torchft 0.2.0.

torchft's lighthouse and 3 replica groups of 1 rank on CPU/gloo train a tiny model through loader/ft_steps.py;
group 2 is SIGKILLed inside step 5 and started again after step 9, healing from a live peer. Every committed
step trains the plan's rows of that step, in order, with 3, then 2, then 3 groups; the failed attempt's rows are
its retry's; every ledger SHA-256 is the plan's and `verify` finds the run's ledger equal to the plan's.
Negative control: torchft's own DistributedSampler under the same kill loses and repeats rows.
"""

from __future__ import annotations

import argparse
import os

import pytest

torchft = pytest.importorskip("torchft", reason="torchft is not installed (the test extra installs torchft==0.2.0)")

import ft_run  # noqa: E402  (examples/, on the path through tests/conftest.py)

# By hand for now (heavy, not in CI): in one of two clean-clone CI runs at load ~5, every step's rows and SHA-256
# matched the plan but group 0's own ledger lacked step 10, so `verify` of that file failed; under study (issue 49).
pytestmark = [pytest.mark.slow, pytest.mark.heavy]


def run(loader: str, out: str) -> dict:
    args = argparse.Namespace(
        loader=loader, steps=14, kill_step=5, restart_step=9, step_sleep=0.1, timeout=240, out=out
    )
    return ft_run.launch(args)


def test_a_killed_and_restarted_group_loses_and_repeats_no_row(tmp_path, capsys):
    from zephon_titan.cli.ledgers import cmd_verify

    result = run("zephon", str(tmp_path / "zephon"))
    steps = result["steps"]
    assert result["committed_steps"] == list(range(1, 15))
    assert all(s["same_rows_as_plan"] and s["in_plan_order"] for s in steps.values()), steps
    assert result["lost_rows"] == result["repeated_rows"] == result["rows_not_of_their_step"] == 0
    counts = [len(steps[step]["participants"]) if step in steps else 0 for step in range(1, 15)]
    assert counts[:4] == [3] * 4 and 2 in counts and counts[-1] == 3, counts  # 3, then 2, then 3 again
    first_two = counts.index(2) + 1
    assert steps[first_two]["failed_attempts"] >= 1  # the step the kill fell in was retried by the survivors
    assert result["retried_rows_equal_first_attempt"]
    assert result["ledger_sha_mismatches"] == [] and result["ledger_sha_matches"] >= 28
    out = tmp_path / "zephon"
    args = argparse.Namespace(a=str(out / "plan.jsonl"), b=str(out / "ledger.group0.jsonl"), steps=None, prefix=False)
    assert cmd_verify(args) == 0, capsys.readouterr().out

    # Negative control: torchft's DistributedSampler, the same job, the same kill and restart.
    control = run("sampler", str(tmp_path / "sampler"))
    assert control["committed_steps"] == list(range(1, 15))
    assert control["lost_rows"] > 0 and control["repeated_rows"] > 0, control
    assert not all(s["same_rows_as_plan"] for s in control["steps"].values())
    assert os.path.exists(out / "ledger.group1.jsonl")
