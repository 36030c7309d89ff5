"""A source's transform through the real TorchTitan trainer (CPU, gloo, the debug model): trained on 2 ranks with a
transform that cleans and drops documents, resumed from step 2 on 3 ranks. Every global batch's SHA-256 equals the
uninterrupted run's and `plan`'s; `plan` without the transform gives other batches (the control). Then a stricter
transform from step 3, resumed from step 2 on 3 ranks: steps 3-4 as `plan --from-checkpoint` predicts them. The transform is
a module in the job's folder, imported by name in every rank (and in the fresh process that checks it)."""

from __future__ import annotations

import os

import pytest
from conftest import CPU_CONFIG, check, copy_checkpoint, ledger, torchrun

pytestmark = [pytest.mark.integration, pytest.mark.slow]
STEPS = 4

MODULE = '''
def tidy(record):
    """Drop short documents; collapse runs of blank lines in the rest."""
    text = record["text"].strip()
    if len(text) < 200:
        return None
    while "\\n\\n\\n" in text:
        text = text.replace("\\n\\n\\n", "\\n\\n")
    return text


def tidy_v2(record):
    """Stricter: drop documents under 400 characters."""
    text = record["text"].strip()
    return None if len(text) < 400 else text
'''


def _config(workdir: str, name: str, transform: bool, function: str = "tidy", from_step: int = 0) -> str:
    with open(CPU_CONFIG) as f:
        text = f.read()
    text = text.replace("global_batch_size = 16", "global_batch_size = 24").replace("num_lanes = 8", "num_lanes = 6")
    if from_step:
        text = text.replace("num_lanes = 6", f"num_lanes = 6\npipeline_from_step = {from_step}")
    if transform:
        text = text.replace("weight = 0.3\n", f'weight = 0.3\ntransform = ["job_cleanup:{function}"]\n')
        text = text.replace("block_bytes = 32768\n", f'block_bytes = 32768\ntransform = ["job_cleanup:{function}"]\n')
        assert text.count(f"job_cleanup:{function}") == 2
    path = os.path.join(workdir, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def _train(workdir: str, config: str, run: str, nproc: int) -> tuple[dict[int, str], str]:
    """The run's ledger (SHA-256 by step) and its console output."""
    args = ["--job.config_file", config, "--dump_folder", run, "--training.steps", str(STEPS),
            "--training.local_batch_size", "4", "--metrics.disable_color_printing"]  # fmt: skip
    done = check(torchrun(workdir, "zephon_titan.train_cpu", nproc, args))
    return ledger(os.path.join(workdir, run, "checkpoint", "ledger.jsonl")), done.stdout + done.stderr


def test_a_transform_trains_the_planned_batches_across_a_resume_on_another_number_of_ranks(workdir, monkeypatch):
    from zephon_titan.engine.ledger import read_ledger
    from zephon_titan.plan import plan_ledger

    monkeypatch.chdir(workdir)
    monkeypatch.syspath_prepend(workdir)  # plan, in this process, imports the job's transform as a rank does
    with open(os.path.join(workdir, "job_cleanup.py"), "w") as f:
        f.write(MODULE)
    config = _config(workdir, "cleanup.toml", transform=True)
    uninterrupted, output = _train(workdir, config, "runs/cleanup_w2", 2)
    copy_checkpoint(workdir, "runs/cleanup_w2", 2, "runs/cleanup_w2_to_w3")
    resumed, _ = _train(workdir, config, "runs/cleanup_w2_to_w3", 3)
    planned = {e.step: e.sha256 for e in plan_ledger(config, STEPS)}
    assert sorted(uninterrupted) == list(range(1, STEPS + 1)) and uninterrupted == planned
    assert {s: resumed[s] for s in range(3, STEPS + 1)} == {s: planned[s] for s in range(3, STEPS + 1)}
    plain = {e.step: e.sha256 for e in plan_ledger(_config(workdir, "plain.toml", transform=False), STEPS)}
    assert all(plain[s] != planned[s] for s in planned)
    assert "zephon documents since the last log: code read " in output

    # A stricter transform from the step after the checkpoint (the old one kept in the module), on 3 ranks: steps
    # 1-2 the first run's, 3-4 as plan --from-checkpoint predicts, with the documents each step dropped.
    stricter = _config(workdir, "stricter.toml", transform=True, function="tidy_v2", from_step=3)
    copy_checkpoint(workdir, "runs/cleanup_w2", 2, "runs/cleanup_changed")
    changed, _ = _train(workdir, stricter, "runs/cleanup_changed", 3)
    checkpoint = os.path.join(workdir, "runs/cleanup_w2/checkpoint/step-2")
    ahead = {e.step: e for e in plan_ledger(stricter, STEPS, checkpoint)}
    assert {s: changed[s] for s in (1, 2)} == {s: planned[s] for s in (1, 2)}
    assert {s: changed[s] for s in (3, 4)} == {s: ahead[s].sha256 for s in (3, 4)}
    assert all(changed[s] != planned[s] for s in (3, 4))  # the control: the old transform's steps differ
    written = {e.step: e for e in read_ledger(os.path.join(workdir, "runs/cleanup_changed/checkpoint/ledger.jsonl"))}
    assert [written[s] for s in (3, 4)] == [ahead[3], ahead[4]]  # documents and the pipeline digest included
    assert all(written[s].pipeline is not None for s in (3, 4))
