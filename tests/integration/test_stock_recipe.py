"""A stock TorchTitan recipe with this loader swapped in by TorchTitan's own `--override.imports`
(zephon_titan/titan/override.py): `torchtitan.train` unchanged, the recipe `llama3_debugmodel` as TorchTitan ships
it, on CPU under torchrun. Its ledger equals `plan` of the job file that holds the loader's table, from the start
and after a resume on another rank count; a trainer whose global batch is not the loader's is refused before
step 1."""

from __future__ import annotations

import json
import os

import pytest
from conftest import CPU_CONFIG, check, copy_checkpoint, ledger, losses, torchrun

pytestmark = [pytest.mark.integration, pytest.mark.slow]
STOCK_TRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stock_train_cpu.py")
STEPS = 4


def stock_args(
    run: str, *extra: str, job: str = CPU_CONFIG, global_batch: int = 16, entries: tuple[str, ...] = ("checkpoint",)
) -> list[str]:
    """A stock recipe run as TorchTitan documents it; only the override entry names this loader. The shapes
    (seq_len, local batch) are the job file's, as a user would set them for the recipe."""
    entry = "zephon_titan.titan.override.dataloader=" + json.dumps({"job": job})
    return ["--module", "llama3", "--config", "llama3_debugmodel", "--hf_assets_path", "demo_out/tokenizer",
            "--dump_folder", run, "--training.steps", str(STEPS), "--training.seq_len", "128",
            "--training.local_batch_size", "4", "--training.global_batch_size", str(global_batch),
            "--checkpoint.enable", "--checkpoint.interval", "2", "--checkpoint.no-last_save_model_only",
            "--metrics.disable_color_printing", "--override.imports", entry, *(f"zephon_titan.titan.override.{e}" for e in entries), *extra]  # fmt: skip


def planned(workdir: str, steps: int = STEPS, job: str = CPU_CONFIG) -> dict[int, str]:
    from zephon_titan.plan import plan_ledger

    cwd = os.getcwd()
    os.chdir(workdir)  # the job's paths are relative to its folder
    try:
        return {e.step: e.sha256 for e in plan_ledger(job, steps)}
    finally:
        os.chdir(cwd)


def test_a_stock_recipe_with_the_override_entry_trains_the_planned_batches(workdir, tmp_path):
    result = check(torchrun(workdir, STOCK_TRAIN, 2, stock_args("stock/w2")))
    output = result.stdout + result.stderr
    assert "zephon_titan.titan.override.dataloader" in output  # TorchTitan logged the replacements
    assert "zephon_titan.titan.override.checkpoint" in output
    plan = planned(workdir)
    ran = ledger(os.path.join(workdir, "stock/w2/checkpoint/ledger.jsonl"))
    assert ran == plan and len(set(plan.values())) == STEPS
    assert sorted(losses(output)) == list(range(1, STEPS + 1))

    # Negative control: another seed plans other batches, so the equality above could fail.
    other = tmp_path / "other_seed.toml"
    with open(CPU_CONFIG) as f:
        other.write_text(f.read().replace("seed = 2026", "seed = 2027"))
    assert planned(workdir, job=str(other)) != plan

    # Resumed from the step-2 checkpoint on 1 rank: the same steps 3 and 4.
    copy_checkpoint(workdir, "stock/w2", 2, "stock/w2_to_w1")
    resumed = check(torchrun(workdir, STOCK_TRAIN, 1, stock_args("stock/w2_to_w1")))
    assert min(losses(resumed.stdout + resumed.stderr)) == 3
    assert ledger(os.path.join(workdir, "stock/w2_to_w1/checkpoint/ledger.jsonl")) == plan


def test_a_trainer_global_batch_other_than_the_loaders_is_refused_before_step_1(workdir):
    result = torchrun(workdir, STOCK_TRAIN, 1, stock_args("stock/mismatch", global_batch=32))
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "training.global_batch_size is 32 but the zephon loader was given 16" in output
    assert not losses(output)  # before step 1


def test_the_loader_entry_without_the_checkpoint_entry_is_refused_before_step_1(workdir):
    """Without ZephonCheckpointManager nothing would write the ledger, check the global batch or check a
    resume: the loader refuses to start, saying which entry to add."""
    result = torchrun(workdir, STOCK_TRAIN, 1, stock_args("stock/no_checkpoint_entry", entries=()))
    output = result.stdout + result.stderr
    assert result.returncode != 0 and not losses(output)
    assert "add zephon_titan.titan.override.checkpoint to --override.imports" in output
