"""A stock TorchTitan recipe with this loader swapped in by TorchTitan's own `--override.imports`
(zephon_titan/titan/override.py): `torchtitan.train` unchanged, the recipe `llama3_debugmodel` as TorchTitan ships
it, on CPU under torchrun. Its ledger equals `plan` of the job file that holds the loader's table, from the start
and after a resume on another rank count; a trainer whose global batch is not the loader's is refused before
step 1. With the validator entry, every validation is of the job's eval set, as `plan --validation` predicts it
(the job-file route's own check: integration/test_validation.py); a job without one is refused before step 1."""

from __future__ import annotations

import json
import os

import pytest
from conftest import CPU_CONFIG, REPO, check, copy_checkpoint, ledger, losses, planned_eval_set, torchrun
from helpers import read_validation_entries

pytestmark = [pytest.mark.integration, pytest.mark.slow]
STOCK_TRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stock_train_cpu.py")
STEPS = 4
VALIDATED = os.path.join(REPO, "configs", "debug_cpu_validated.toml")  # an eval set, validated at 1, 2 and 4


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


def test_the_validator_entry_validates_the_jobs_eval_set(workdir):
    """The stock recipe's validator replaced by the entry: validations at the job's steps (its [validator] freq),
    each of the eval set `plan --validation` predicts (SHA-256, steps, rows, tokens per source), recorded in
    validation.jsonl beside the ledger; the training batches still the planned ones."""
    validate = "validator=" + json.dumps({"job": VALIDATED})
    result = check(
        torchrun(workdir, STOCK_TRAIN, 2, stock_args("stock/val", job=VALIDATED, entries=("checkpoint", validate)))
    )
    output = result.stdout + result.stderr
    assert "zephon_titan.titan.override.validator: validator Validator.Config -> ZephonValidator.Config" in output
    plan = planned_eval_set(workdir, VALIDATED)
    assert plan["steps"] >= 2 and all(plan["tokens"].values())
    entries = read_validation_entries(os.path.join(workdir, "stock/val/checkpoint/validation.jsonl"))
    assert [e["step"] for e in entries] == [1, 2, 4]
    for entry in entries:
        assert {key: entry[key] for key in plan} == plan, f"step {entry['step']}: not the planned eval set"
        assert f"zephon validation at step {entry['step']}: eval set sha256 {plan['sha256'][:16]}" in output
        tokens, per_source = entry["tokens"], entry["loss_per_source"]
        mean = sum(per_source[s] * tokens[s] for s in per_source) / sum(tokens.values())
        assert mean == pytest.approx(entry["loss"], rel=1e-9)
    assert len({e["loss"] for e in entries}) == 3  # the model learns between validations
    assert ledger(os.path.join(workdir, "stock/val/checkpoint/ledger.jsonl")) == planned(workdir, job=VALIDATED)


def test_the_validator_entry_refuses_a_job_without_an_eval_set_before_step_1(workdir):
    validate = "validator=" + json.dumps({"job": CPU_CONFIG})
    result = torchrun(workdir, STOCK_TRAIN, 1, stock_args("stock/no_eval_set", entries=("checkpoint", validate)))
    output = result.stdout + result.stderr
    assert result.returncode != 0 and not losses(output)
    assert (
        f"zephon_titan.titan.override.validator job={CPU_CONFIG!r}: the job has no eval set; set eval_fraction"
        in output
    )
