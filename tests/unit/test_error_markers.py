"""A job's user error is printed once per job under torchrun: ranks agree through marker files in a folder per run
(errors.report_once). Each failed job leaves such a folder in the temporary folder; those of jobs more than a day
old are removed when a new job makes its own, a fresh one is kept."""

import os
import tempfile
import time

from zephon_titan import errors
from zephon_titan.errors import ConfigError


def test_marker_folders_of_old_jobs_are_removed_and_the_message_printed_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    prefix = f"zephon_titan-errors-{os.getuid()}-"
    old, fresh, other = tmp_path / (prefix + "old"), tmp_path / (prefix + "fresh"), tmp_path / "someone-elses"
    for folder in (old, fresh, other):
        folder.mkdir()
        (folder / "marker").touch()
    two_days_ago = time.time() - 2 * 24 * 3600
    for path in (old, other):
        os.utime(path, (two_days_ago, two_days_ago))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "new")
    for _ in range(2):  # two ranks of the new job
        errors.report_once(ConfigError("job.toml: a mistake"))
    assert capsys.readouterr().err.count("a mistake") == 1
    assert not old.exists() and fresh.exists() and other.exists()  # a stale folder of ours only
    assert (tmp_path / (prefix + "new")).is_dir()
