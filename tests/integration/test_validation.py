"""Validation with TorchTitan's real trainer on CPU: a fixed eval set held out of the training sources,
the same rows and losses on 1, 2 and 4 ranks and across a save on 2 / resume on 4, with the loss of
each source (titan/validator.py)."""

from __future__ import annotations

import os

import pytest
from conftest import REPO, check, copy_checkpoint, ledger, planned_eval_set, torchrun
from helpers import read_validation_entries

# Slow tier (the eval set through the real trainer (eval rows per W: unit/test_eval_split.py)).
pytestmark = [pytest.mark.integration, pytest.mark.slow]

# The CPU debug job with 5 % of each source held out, validated at steps 1, 2 and 4 (over 4 lanes).
JOB = os.path.join(REPO, "configs", "debug_cpu_validated.toml")
RUNS = ("val_w2", "val_w2_to_w4", "val_w1")


def _run(workdir: str, job: str, run: str, nproc: int, steps: int = 4) -> tuple[list[dict], str]:
    args = ["--job.config_file", job, "--dump_folder", run, "--training.steps", str(steps),
            "--metrics.disable_color_printing"]  # fmt: skip
    output = check(torchrun(workdir, "zephon_titan.train_cpu", nproc, args)).stdout
    return read_validation_entries(os.path.join(workdir, run, "checkpoint", "validation.jsonl")), output


@pytest.fixture(scope="module")
def runs(workdir) -> dict[str, list[dict]]:
    """2 ranks to step 4 (saving at 2 and 4), its step-2 checkpoint resumed on 4 ranks, and 1 rank."""
    out = {}
    out["2 ranks"], _ = _run(workdir, JOB, "val_w2", 2)
    copy_checkpoint(workdir, "val_w2", 2, "val_w2_to_w4")
    out["resumed on 4"], logs = _run(workdir, JOB, "val_w2_to_w4", 4)
    assert "zephon validation at step 4: eval set sha256" in logs
    out["1 rank"], _ = _run(workdir, JOB, "val_w1", 1)
    return out


def test_the_eval_set_is_the_same_rows_everywhere_and_as_planned(workdir, runs):
    plan = planned_eval_set(workdir, JOB)
    assert plan["steps"] >= 1 and all(plan["tokens"].values())
    assert [e["step"] for e in runs["2 ranks"]] == [e["step"] for e in runs["1 rank"]] == [1, 2, 4]
    assert [e["step"] for e in runs["resumed on 4"]] == [4]  # validation.jsonl is not copied with the checkpoint
    for name, entries in runs.items():
        for entry in entries:
            got = {key: entry[key] for key in plan}
            assert got == plan, f"{name} step {entry['step']}: the eval set differs from the planned one"


def test_eval_losses_agree_across_world_sizes_and_the_resume(runs):
    reference = {e["step"]: e for e in runs["1 rank"]}
    for name, entries in runs.items():
        for entry in entries:
            ref = reference[entry["step"]]
            assert entry["loss"] == pytest.approx(ref["loss"], rel=2e-4, abs=2e-4), (name, entry["step"])
            for source, loss in entry["loss_per_source"].items():
                assert loss == pytest.approx(ref["loss_per_source"][source], rel=2e-4, abs=2e-4), (name, source)
    # The model learns between validations: the check compares different numbers (it can fail).
    losses = [e["loss"] for e in runs["1 rank"]]
    assert len(set(losses)) == len(losses)


def test_per_source_losses_average_to_the_overall_loss(runs):
    for name, entries in runs.items():
        for entry in entries:
            tokens, per_source = entry["tokens"], entry["loss_per_source"]
            assert set(per_source) == {"code", "prose"}, name
            mean = sum(per_source[s] * tokens[s] for s in per_source) / sum(tokens.values())
            assert mean == pytest.approx(entry["loss"], rel=1e-9), (name, entry["step"])
            # The sources differ, so this is not one number written twice.
            assert per_source["code"] != per_source["prose"]


def test_training_batches_are_the_same_on_every_world_size(workdir, runs):
    """Validation runs between steps; the training ledger stays the elastic one (and skips the eval part)."""
    ledgers = {run: ledger(os.path.join(workdir, run, "checkpoint", "ledger.jsonl")) for run in RUNS}
    assert sorted(ledgers["val_w1"]) == [1, 2, 3, 4]
    for run, got in ledgers.items():
        assert got == ledgers["val_w1"], run
