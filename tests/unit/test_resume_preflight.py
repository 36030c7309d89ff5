"""A resume is checked before the model is built (issue 31): the checkpoint TorchTitan will load (its own rule:
the latest step-N under dump_folder/checkpoint.folder, or load_step) is read by the loader's resume sequence
first, so a changed seed or other data is one line in seconds. Uses the committed version-2 checkpoint."""

from __future__ import annotations

import os
import shutil

import pytest

from zephon_titan import train
from zephon_titan.errors import ConfigError, ResumeError
from zephon_titan.titan.job import load_job

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "checkpoint_v2")


@pytest.fixture
def run_folder(tmp_path, monkeypatch):
    """The fixture's job as a training run whose dump folder holds its checkpoint (step 3)."""
    target = tmp_path / "run"
    shutil.copytree(FIXTURE, target, copy_function=shutil.copy, ignore=shutil.ignore_patterns("*.py", "*.md"))
    monkeypatch.chdir(target)
    job = (target / "job.toml").read_text()
    (target / "job.toml").write_text('dump_folder = "."\n' + job + "\n[checkpoint]\nenable = true\n")
    return target


def _job(*overrides: str):
    return load_job("job.toml", list(overrides))


def test_the_checkpoint_to_resume_follows_torchtitans_rule(run_folder):
    assert _job().checkpoint_to_resume() == os.path.join(".", "checkpoint", "step-3")
    assert _job("--checkpoint.load_step", "3").checkpoint_to_resume() == os.path.join(".", "checkpoint", "step-3")
    assert _job("--checkpoint.no-enable").checkpoint_to_resume() is None
    assert _job("--checkpoint.exclude_from_loading", "dataloader").checkpoint_to_resume() is None
    shutil.move("checkpoint/step-3", "checkpoint/step-0")
    assert _job().checkpoint_to_resume() is None  # step 0 loads the model only


def test_a_matching_resume_passes_and_a_changed_seed_is_refused_before_the_model_is_built(run_folder, monkeypatch):
    train.check_resume(_job())  # the job the checkpoint was saved with: accepted
    job = _job("--dataloader.seed", "12")
    monkeypatch.setattr(type(job.config), "build", lambda self: pytest.fail("the trainer was built"))
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ResumeError, match="seed"):
        train.run(job)


def test_metric_lines_have_no_colour_codes_off_a_terminal(run_folder):
    assert _job().config.metrics.disable_color_printing  # pytest captures standard error: not a terminal


def test_a_missing_load_step_is_named(run_folder):
    with pytest.raises(ConfigError, match=r"step-5 does not exist"):
        train.check_resume(_job("--checkpoint.load_step", "5"))
