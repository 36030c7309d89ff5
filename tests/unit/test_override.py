"""The override entry's factories (zephon_titan/titan/override.py) on their own: what they build from a job
file, and the one-line refusals. The trainer runs are tests/integration/test_stock_recipe.py."""

from __future__ import annotations

import os

import pytest
from torchtitan.components.checkpointer import CheckpointManager
from torchtitan.components.validate import Validator
from torchtitan.config.override import OverrideConfig, apply_overrides
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader

from zephon_titan.errors import ConfigError
from zephon_titan.titan.dataloader import ZephonDataLoader
from zephon_titan.titan.job import read_job_config
from zephon_titan.titan.override import ENTRY, checkpoint, dataloader, validator
from zephon_titan.titan.trainer import ZephonCheckpointManager
from zephon_titan.titan.validator import ZephonEvalLoader, ZephonValidator

TABLE = """
[dataloader]
num_lanes = 4
seed = 7

[dataloader.sources.prose]
paths = ["{corpus}/prose/*.jsonl"]
"""


def _job(tmp_path, corpus_dir, extra=""):
    path = tmp_path / "data.toml"
    path.write_text(TABLE.format(corpus=corpus_dir) + extra)
    return str(path)


def test_the_loader_comes_from_the_job_files_table(tmp_path, corpus_dir):
    built = dataloader(HuggingFaceTextDataLoader.Config(), job=_job(tmp_path, corpus_dir), global_batch_size=8)
    assert isinstance(built, ZephonDataLoader.Config)
    assert (built.data.num_lanes, built.data.seed, built.global_batch_size) == (4, 7, 8)
    assert built.checkpointer_required
    from_file = dataloader(
        HuggingFaceTextDataLoader.Config(), job=_job(tmp_path, corpus_dir, "[training]\nglobal_batch_size = 12\n")
    )
    assert from_file.global_batch_size == 12


def test_the_checkpoint_settings_are_kept(tmp_path):
    stock = CheckpointManager.Config(enable=True, interval=3, folder="ckpt", keep_latest_k=2)
    ours = checkpoint(stock)
    assert isinstance(ours, ZephonCheckpointManager.Config)
    assert (ours.enable, ours.interval, ours.folder, ours.keep_latest_k) == (True, 3, "ckpt", 2)


@pytest.mark.parametrize(
    "extra, kwargs, message",
    [
        ("", {}, r"needs the global batch size .* got None"),
        ("[training]\nglobal_batch_size = -1\n", {}, r"needs the global batch size .* got -1"),
        ("", {"global_batch_size": True}, r"needs the global batch size .* got True"),
    ],
)
def test_a_missing_global_batch_is_one_line(tmp_path, corpus_dir, extra, kwargs, message):
    with pytest.raises(ConfigError, match=message) as e:
        dataloader(HuggingFaceTextDataLoader.Config(), job=_job(tmp_path, corpus_dir, extra), **kwargs)
    assert "\n" not in str(e.value) and "data.toml" in str(e.value)


def test_a_file_without_the_table_is_one_line(tmp_path):
    path = tmp_path / "nothing.toml"
    path.write_text("[training]\nglobal_batch_size = 8\n")
    with pytest.raises(ConfigError, match=r"nothing.toml.*has no \[dataloader\] table"):
        dataloader(HuggingFaceTextDataLoader.Config(), job=str(path))


def test_a_mistake_in_the_table_names_the_file(tmp_path, corpus_dir):
    """A key misspelled in the job's [dataloader] table: one line naming the file and the key."""
    path = tmp_path / "typo.toml"
    path.write_text(TABLE.format(corpus=corpus_dir).replace("num_lanes", "num_lane"))
    with pytest.raises(ConfigError, match=r"typo.toml: .*num_lane") as e:
        dataloader(HuggingFaceTextDataLoader.Config(), job=str(path), global_batch_size=8)
    assert "\n" not in str(e.value)


# ---- the validator entry ----------------------------------------------------------------------------------

HELD_OUT = '[dataloader.sources.prose]\npaths = ["{corpus}/prose/*.jsonl"]\neval_fraction = 0.2\n'


def _eval_job(tmp_path, corpus_dir, extra="", name="eval.toml"):
    """A job whose prose source holds 20 % of its documents out for the eval set."""
    path = tmp_path / name
    table = TABLE.replace('[dataloader.sources.prose]\npaths = ["{corpus}/prose/*.jsonl"]\n', HELD_OUT)
    path.write_text(table.format(corpus=corpus_dir) + "[training]\nglobal_batch_size = 8\n" + extra)
    return str(path)


def test_the_validator_is_the_jobs_eval_set_as_the_job_file_route_reads_it(tmp_path, corpus_dir):
    job = _eval_job(tmp_path, corpus_dir, "[validator]\nfreq = 3\nsteps = 2\n")
    recipe = Validator.Config(enable=True, freq=5, steps=10)  # steps: microbatches of one rank, not kept
    built = validator(recipe, job=job)
    assert isinstance(built, ZephonValidator.Config) and isinstance(built.dataloader, ZephonEvalLoader.Config)
    assert (built.enable, built.freq, built.steps) == (True, 3, 2)  # the job's table over the recipe's
    data = built.dataloader.data
    assert [s.name for s in data.sources] == ["prose"] and data.split == "eval"
    assert built.dataloader.global_batch_size == 8  # [training]'s, as ZephonTrainer fills it in
    # The same eval set as the job-file route (zephon_titan.train) reads from the file.
    route = _route(job).validator.dataloader
    assert data == route.data
    # The eval set's own global batch size, and the entry's argument for training's.
    own = validator(
        recipe, job=_eval_job(tmp_path, corpus_dir, "[validator.dataloader]\nglobal_batch_size = 4\n", "own.toml")
    )
    assert own.dataloader.global_batch_size == 4
    assert validator(recipe, job=job, global_batch_size=16).dataloader.global_batch_size == 16
    recipe_freq = validator(Validator.Config(enable=True, freq=5), job=_eval_job(tmp_path, corpus_dir))
    assert (recipe_freq.freq, recipe_freq.steps) == (5, -1)  # the recipe's freq; the whole eval set once


def _route(job: str):
    """The job-file route's config (zephon_titan.train) of `job`'s tables: a [model] added (the route needs a
    recipe) and validation on."""
    path = os.path.join(os.path.dirname(job), "route.toml")
    with open(path, "w") as f:
        f.write(f'[job]\nextends = "{os.path.basename(job)}"\n[model]\nmodule = "llama3"\nconfig = "llama3_debugmodel"\n'
                "[validator]\nenable = true\n")  # fmt: skip
    return read_job_config(path)


def test_the_validator_entry_claims_the_recipes_validator_node(tmp_path, corpus_dir):
    """Through TorchTitan's own apply_overrides on a stock recipe's tree: the node `validator` is replaced whole
    (the loader of TorchTitan's Validator would count its steps per rank), the training loader left alone."""
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    tree = llama3_debugmodel()
    tree.validator.enable = True  # --validator.enable
    stock_loader = tree.dataloader
    lines = apply_overrides(
        OverrideConfig(imports=[(f"{ENTRY}.validator", {"job": _eval_job(tmp_path, corpus_dir)})]), tree
    )
    assert lines == [f"[Override] {ENTRY}.validator: validator Validator.Config -> ZephonValidator.Config with "
                     f"job={_eval_job(tmp_path, corpus_dir)!r}"]  # fmt: skip
    assert isinstance(tree.validator, ZephonValidator.Config) and tree.dataloader is stock_loader


def test_a_job_without_an_eval_set_is_refused_in_one_line(tmp_path, corpus_dir):
    with pytest.raises(ConfigError, match=r"override.validator job=.*data.toml.*: the job has no eval set; set "
                       r"eval_fraction on a \[dataloader.sources.<name>\]") as e:  # fmt: skip
        validator(Validator.Config(enable=True), job=_job(tmp_path, corpus_dir, "[training]\nglobal_batch_size = 8\n"))
    assert "\n" not in str(e.value)


def test_validation_left_off_is_refused_in_one_line(tmp_path, corpus_dir):
    with pytest.raises(ConfigError, match=r"eval.toml.*: validation is off in the recipe; add --validator.enable") as e:
        validator(Validator.Config(), job=_eval_job(tmp_path, corpus_dir))
    assert "\n" not in str(e.value)
    assert validator(Validator.Config(), job=_eval_job(tmp_path, corpus_dir, "[validator]\nenable = true\n")).enable


def test_an_eval_set_without_a_global_batch_is_refused_in_one_line(tmp_path, corpus_dir):
    job = tmp_path / "no_batch.toml"
    job.write_text(
        TABLE.replace('[dataloader.sources.prose]\npaths = ["{corpus}/prose/*.jsonl"]\n', HELD_OUT).format(
            corpus=corpus_dir
        )
    )
    with pytest.raises(ConfigError, match=r"override.validator job=.*needs the global batch size .* got None") as e:
        validator(Validator.Config(enable=True), job=str(job))
    assert "\n" not in str(e.value) and 'validator={"job"' in str(e.value)
