"""The job's seq_len schedule with TorchTitan's real trainer (CPU debug model, eager, 2 ranks under torchrun):
rows of 64 tokens for steps 1-2, of 128 from step 3 (`[[dataloader.phases]] seq_len`, training.seq_len = 128);
the ledger equals `plan` at every step (seq_len included), the change is logged once, the losses are finite; its
checkpoint of step 2 (just before the change) resumed on 4 ranks gives the same steps 3-4; negative control: the
plan of the same job without the change differs from step 3 on."""

from __future__ import annotations

import math
import os

import pytest
from conftest import CPU_CONFIG, check, copy_checkpoint, cpu_job_args, losses, torchrun

from zephon_titan.engine.ledger import read_ledger
from zephon_titan.plan import plan_ledger

pytestmark = [pytest.mark.integration, pytest.mark.slow]
STEPS = 4


def _job(workdir: str, name: str, later_seq_len: int) -> str:
    with open(CPU_CONFIG) as f:
        text = f.read()
    for old in ("weight = 0.3\n", "weight = 0.7\n", "steps = 6\n"):
        assert old in text
    text = text.replace("weight = 0.3\n", "").replace("weight = 0.7\n", "")
    text = text.replace("steps = 6\n", "steps = 6\ndisable_cuda_graphs = true\n")
    for start, seq_len in ((1, 64), (3, later_seq_len)):
        text += (
            f"\n[[dataloader.phases]]\nstart_step = {start}\nweights = {{ code = 0.3, prose = 0.7 }}\n"
            f"seq_len = {seq_len}\n"
        )
    path = os.path.join(workdir, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def _train(workdir: str, job: str, run: str, nproc: int) -> str:
    args = cpu_job_args(run, STEPS)
    args[args.index(CPU_CONFIG)] = job
    result = check(torchrun(workdir, "zephon_titan.train_cpu", nproc, args))
    return result.stdout + result.stderr


def test_the_trainer_runs_a_seq_len_schedule_as_planned(workdir, monkeypatch):
    job = _job(workdir, "schedule.toml", 128)
    output = _train(workdir, job, "runs/schedule", 2)
    assert "zephon_titan: seq_len 64 -> 128 from step 3 (the job's schedule)" in output
    trained = losses(output)
    assert sorted(trained) == list(range(1, STEPS + 1)) and all(math.isfinite(v) for v in trained.values())
    ran = {e.step: e for e in read_ledger(os.path.join(workdir, "runs/schedule/checkpoint/ledger.jsonl"))}
    monkeypatch.chdir(workdir)
    planned = {e.step: e for e in plan_ledger(job, STEPS)}
    assert sorted(ran) == sorted(planned) == list(range(1, STEPS + 1))
    assert all(ran[s] == planned[s] for s in planned)  # every field: sha256, rows, tokens, weights, seq_len
    assert [ran[s].seq_len for s in sorted(ran)] == [64, 64, 128, 128]
    # Saved after step 2, resumed on 4 ranks: the change at step 3 happens in the resumed run, as planned.
    copy_checkpoint(workdir, "runs/schedule", 2, "runs/schedule_w4")
    resumed_output = _train(workdir, job, "runs/schedule_w4", 4)
    assert "zephon_titan: seq_len 64 -> 128 from step 3 (the job's schedule)" in resumed_output
    assert "Loading the checkpoint from" in resumed_output and "step-2" in resumed_output  # not a fresh start
    resumed = {e.step: e for e in read_ledger(os.path.join(workdir, "runs/schedule_w4/checkpoint/ledger.jsonl"))}
    assert resumed == ran and all(math.isfinite(v) for v in losses(resumed_output).values())
    # Negative control: the same job without the change (64 throughout) differs from step 3 on.
    unchanged = {e.step: e.sha256 for e in plan_ledger(_job(workdir, "no_change.toml", 64), STEPS)}
    assert [unchanged[s] == planned[s].sha256 for s in sorted(planned)] == [True, True, False, False]
