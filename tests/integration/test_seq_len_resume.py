"""A seq_len change at a resume through real torchrun processes and DCP checkpoints (the data path, data_run):
saved at seq_len 64 on 2 ranks, resumed at 256 with half the rows per step on 4 ranks; equal to `plan
--from-checkpoint` of the new job, the steps before the checkpoint as they were; negative control: the same resume
without the change differs from the next step on; once more with 2 lanes, resumed on 4 ranks (W > num_lanes: rows,
not lanes, belong to ranks). The real trainer across a change: tests/test_demo.py (docs/changing-a-run.md's block)."""

from __future__ import annotations

import os
import shutil

import pytest
from conftest import CPU_CONFIG, check, torchrun

from zephon_titan.engine.ledger import read_ledger
from zephon_titan.plan import plan_ledger

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MODULE = "zephon_titan.titan.data_run"
STEPS = 5


def _job(workdir: str, name: str, seq_len: int, batch: int, lanes: int = 8) -> str:
    with open(CPU_CONFIG) as f:
        text = f.read()
    for old in ("seq_len = 128", "global_batch_size = 16", "num_lanes = 8"):
        assert old in text
    text = text.replace("seq_len = 128", f"seq_len = {seq_len}").replace(
        "global_batch_size = 16", f"global_batch_size = {batch}"
    )
    text = text.replace("num_lanes = 8", f"num_lanes = {lanes}")
    path = os.path.join(workdir, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def _data_run(workdir: str, job: str, nproc: int, ledger_name: str, *extra: str):
    args = ["--job.config_file", job, "--steps", str(STEPS), "--local-batch-size", "2", "--ledger", ledger_name]
    result = check(torchrun(workdir, MODULE, nproc, [*args, *extra]))
    return {e.step: e for e in read_ledger(os.path.join(workdir, ledger_name))}, result.stdout + result.stderr


def test_a_run_saved_at_64_and_resumed_at_256_with_half_the_rows_follows_the_plan(workdir, monkeypatch):
    short, long = _job(workdir, "seq64.toml", 64, 16), _job(workdir, "seq256.toml", 256, 8)
    first, _ = _data_run(workdir, short, 2, "seq/a.jsonl", "--save-at", "2", "--checkpoint", "seq/a")
    shutil.copy(os.path.join(workdir, "seq/a.jsonl"), os.path.join(workdir, "seq/ab.jsonl"))
    resumed, log = _data_run(workdir, long, 4, "seq/ab.jsonl", "--resume", "seq/a/step-2")
    assert "seq_len 64 -> 256 from step 3" in log
    assert {s: resumed[s] for s in (1, 2)} == {s: first[s] for s in (1, 2)}  # the past as it was
    monkeypatch.chdir(workdir)
    planned = {e.step: e for e in plan_ledger(long, STEPS, "seq/a/step-2")}
    assert sorted(planned) == [3, 4, 5]
    assert all(resumed[s] == planned[s] for s in planned)  # every field: sha256, rows, tokens, seq_len
    assert {resumed[s].seq_len for s in planned} == {256} and {resumed[s].rows for s in planned} == {8}
    # Negative control: the same resume (same rows per step) without the change differs from step 3 on.
    same = _job(workdir, "seq64_g8.toml", 64, 8)
    unchanged = {e.step: e.sha256 for e in plan_ledger(same, STEPS, "seq/a/step-2")}
    assert all(unchanged[s] != planned[s].sha256 for s in planned)


def test_resumed_at_256_on_more_ranks_than_lanes_follows_the_plan(workdir, monkeypatch):
    """2 lanes: saved at 64 on 2 ranks (one lane each), resumed at 256 with half the rows on 4 ranks (two ranks
    per lane, each taking two of its lane's four rows per step)."""
    short, long = _job(workdir, "lanes2_64.toml", 64, 16, lanes=2), _job(workdir, "lanes2_256.toml", 256, 8, lanes=2)
    first, _ = _data_run(workdir, short, 2, "lanes2/a.jsonl", "--save-at", "2", "--checkpoint", "lanes2/a")
    shutil.copy(os.path.join(workdir, "lanes2/a.jsonl"), os.path.join(workdir, "lanes2/ab.jsonl"))
    resumed, log = _data_run(workdir, long, 4, "lanes2/ab.jsonl", "--resume", "lanes2/a/step-2")
    assert "seq_len 64 -> 256 from step 3" in log
    assert {s: resumed[s] for s in (1, 2)} == {s: first[s] for s in (1, 2)}
    monkeypatch.chdir(workdir)
    planned = {e.step: e for e in plan_ledger(long, STEPS, "lanes2/a/step-2")}
    assert sorted(planned) == [3, 4, 5] and all(resumed[s] == planned[s] for s in planned)
    assert {resumed[s].seq_len for s in planned} == {256} and {resumed[s].rows for s in planned} == {8}
    # Negative control: the same resume without the change differs from step 3 on.
    unchanged = {
        e.step: e.sha256 for e in plan_ledger(_job(workdir, "lanes2_64_g8.toml", 64, 8, 2), STEPS, "lanes2/a/step-2")
    }
    assert all(unchanged[s] != planned[s].sha256 for s in planned)
