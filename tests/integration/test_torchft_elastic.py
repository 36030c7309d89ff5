"""Elastic while running, no row lost or repeated (issue 49): examples/ft_run.py end to end with torchft 0.2.0.

torchft's lighthouse and 3 replica groups of 1 rank, then of 2 ranks (DP inside the group: its own gloo group,
torchft pairing rank r of every group), on CPU/gloo train TorchTitan's Llama-3 debug model through loader/ft_steps.py; group 2 (every
rank) is SIGKILLed inside step 5 and started again after step 9, healing from a live peer, and group 0 comes
to step 12's quorum late (the others train 12 without it; it heals past). Every committed step trains the plan's
rows of that step, in order, with 3, then 2, then 3 groups (6, 4, 6 live ranks with 2 per group: the step's 6
microbatches dealt 1 or 2 per rank, padded); the failed attempt's rows are its retry's; the weights agree; every
ledger SHA-256 is the plan's; each group's ledger holds exactly the steps it committed (a step it sat out or
healed past is not in it; every rank of a group the same ledger) and `verify` finds the run's ledger (their
union) equal to the plan's.
Negative control: torchft's own DistributedSampler under the same kill loses and repeats rows.
"""

from __future__ import annotations

import argparse
import os

import pytest

torchft = pytest.importorskip("torchft", reason="torchft is not installed (the test extra installs torchft==0.2.0)")

import ft_run  # noqa: E402  (examples/, on the path through tests/conftest.py)

# The slow tier. A CI run at load ~5 once found group 0's own ledger without step 10: the machine made group 0
# late to that quorum by more than the lighthouse's join timeout, so groups 1 and 2 trained it and group 0 healed
# past it. Not a loss (the union held the step, with the plan's rows): the run's ledger is the groups' union, and
# the run below makes group 0 sit a step out on purpose so that this path is checked every time.
pytestmark = [pytest.mark.slow]

STEPS, SIT_OUT = 16, (0, 12)


def run(loader: str, out: str, ranks: int) -> dict:
    args = argparse.Namespace(
        loader=loader,
        steps=STEPS,
        kill_step=5,
        restart_step=9,
        step_sleep=0.1,
        timeout=400,  # a failsafe: a loaded machine slows start-up (7 processes importing torch), not the steps
        out=out,
        sit_out=SIT_OUT,
        ranks=ranks,
    )
    return ft_run.launch(args)


# 1 rank per group: 45-57 s for both runs on the 2-core machine (load 2-6), the slow tier. 2 ranks per group (7
# processes importing torch on 2 cores): 59 s at load 2-3, 74 s at 4, 171 s at 6, so heavy (by hand); the slow
# tier keeps DP inside groups under real torchft in test_ft_launch.py (2 groups x 2 ranks, no kill) and the kill,
# retry and heal with DP in-process in tests/unit/test_ft_steps.py.
@pytest.mark.parametrize("ranks", [1, pytest.param(2, marks=pytest.mark.heavy)])
def test_a_killed_and_restarted_group_loses_and_repeats_no_row(tmp_path, capsys, ranks):
    from zephon_titan.cli.ledgers import cmd_verify

    result = run("zephon", str(tmp_path / "zephon"), ranks)
    steps = result["steps"]
    every = list(range(1, STEPS + 1))
    assert result["committed_steps"] == every
    assert all(s["same_rows_as_plan"] and s["in_plan_order"] for s in steps.values()), steps
    assert result["lost_rows"] == result["repeated_rows"] == result["rows_not_of_their_step"] == 0
    counts = [len(steps[step]["participants"]) if step in steps else 0 for step in every]
    assert counts[:4] == [3] * 4 and 2 in counts and counts[-1] == 3, counts  # 3, then 2, then 3 again
    first_two = counts.index(2) + 1
    assert steps[first_two]["failed_attempts"] >= 1  # the step the kill fell in was retried by the survivors
    assert result["retried_rows_equal_first_attempt"] and result["weights_agree"]
    assert all(s["ranks"] == len(s["participants"]) * ranks for s in steps.values()), steps
    assert result["dp_ledgers_equal"]
    assert result["ledger_sha_mismatches"] == [] and result["ledger_sha_matches"] >= 2 * STEPS
    groups = result["groups"]
    for g, got in groups.items():  # a group's ledger: exactly the steps it committed, each once
        assert got["ledger_steps"] == got["committed_steps"] == sorted(set(got["committed_steps"])), (g, got)
    for g in (0, 1):  # never killed: every step either trained or healed past, never both
        assert sorted(groups[g]["ledger_steps"] + groups[g]["healed_past"]) == every, groups[g]
    # Group 0 heals past the step it sits out, or, when a busy machine already left it out of an earlier quorum, past
    # that one (seen in CI at load ~4.5: left out of 11, healed to 12 at its next quorum, so it never waited for 12);
    # either way it trains no step it healed past.
    healed = groups[0]["healed_past"]
    assert healed and min(healed) <= SIT_OUT[1], groups[0]
    assert all(SIT_OUT[0] not in steps[step]["participants"] for step in healed), steps
    out = tmp_path / "zephon"
    args = argparse.Namespace(a=str(out / "plan.jsonl"), b=str(out / "ledger.jsonl"), steps=None, prefix=False)
    assert cmd_verify(args) == 0, capsys.readouterr().out
    # Group 0's own ledger is not the run's: the steps it healed past are missing there (the CI flake, now
    # expected), the first of them at the latest the step it sat out (a busy machine leaves it out of others too:
    # seen in CI, step 10 besides 12).
    args.b = str(out / "ledger.group0.jsonl")
    assert cmd_verify(args) == 1
    first_missing = min(groups[0]["healed_past"])
    assert first_missing <= SIT_OUT[1]
    assert f"first difference at step {first_missing}" in capsys.readouterr().out

    # Negative control: torchft's DistributedSampler, the same job, the same kill and restart.
    control = run("sampler", str(tmp_path / "sampler"), ranks)
    assert control["committed_steps"] == every
    assert control["lost_rows"] > 0 and control["repeated_rows"] > 0, control
    assert not all(s["same_rows_as_plan"] for s in control["steps"].values())
    assert os.path.exists(out / "ledger.group1.jsonl")
