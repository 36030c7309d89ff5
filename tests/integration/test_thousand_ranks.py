"""scripts/thousand_ranks.py: the real loader and real DCP save/load on torch's multi-threaded process group,
every rank a thread of one process, each step SHA-256-equal to `plan`.

The gate runs L 8, G 96: save on 16 ranks, resume on 48 (W > L, 6 ranks per lane) and on 3 (W not dividing
L). The slow tier runs the issue's shape: L 64, G 3,072, save on 256, resume on 1,024, 96 and 3
(docs/performance.md, "1,024 ranks in one process")."""

import os

import pytest
from conftest import REPO, run_scale_script

pytestmark = pytest.mark.integration
SCRIPT = os.path.join(REPO, "scripts", "thousand_ranks.py")


def _run(tmp_path, *args, timeout):
    stdout, summary = run_scale_script(SCRIPT, str(tmp_path / "work"), *args, timeout=timeout)
    assert "differs from the plan at 4/4 steps" in stdout  # the negative control
    return stdout, summary


@pytest.mark.slow  # a short variant of the run below (which is slow too); the gate's DCP runs are test_data_only_dcp
def test_threaded_ranks_save_and_resume_through_dcp(tmp_path):
    stdout, summary = _run(
        tmp_path, "--lanes", "8", "--global-batch", "96", "--save-on", "16", "--resume-on", "48,3", timeout=300
    )
    assert [p["ranks"] for p in summary["phases"]] == [16, 48, 3]
    assert "| 16 -> 48 | 48 | 3-4 | 2/2 |" in stdout
    # The checkpoint is DCP's: one file per saving rank and the coordinator's index.
    files = os.listdir(tmp_path / "work" / "ckpt" / "step-2")
    assert ".metadata" in files and sum(f.endswith(".distcp") for f in files) == 16


@pytest.mark.slow
def test_thousand_ranks(tmp_path):
    stdout, summary = _run(tmp_path, timeout=3600)
    assert [p["ranks"] for p in summary["phases"]] == [256, 1024, 96, 3]
    assert "| 256 -> 1024 | 1024 | 3-4 | 2/2 |" in stdout
