"""The override entry's factories (zephon_titan/titan/override.py) on their own: what they build from a job
file, and the one-line refusals. The trainer runs are tests/integration/test_stock_recipe.py."""

from __future__ import annotations

import pytest
from torchtitan.components.checkpointer import CheckpointManager
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader

from zephon_titan.errors import ConfigError
from zephon_titan.titan.dataloader import ZephonDataLoader
from zephon_titan.titan.override import checkpoint, dataloader
from zephon_titan.titan.trainer import ZephonCheckpointManager

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
