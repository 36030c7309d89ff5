"""scripts/elastic_scale.py: save on W ranks, resume on others, through real torchrun + DCP, data only.

The slow tier runs the reduced variant (4 -> 8, 4 -> 2) and the full 16 -> 8/32/64 run with its chain
(~5 min and ~13 GB at its 64-rank phases on the 2-core 24 GiB machine: docs/performance.md)."""

import os

import pytest
from conftest import REPO, run_scale_script

SCRIPT = os.path.join(REPO, "scripts", "elastic_scale.py")


def _run(tmp_path, *args, timeout):
    stdout, summary = run_scale_script(SCRIPT, str(tmp_path / "work"), *args, timeout=timeout)
    assert "(differs from step 1)" in stdout  # the negative control mismatches from its first step
    return stdout, summary


@pytest.mark.integration
@pytest.mark.slow  # elastic resume through data_run is in the gate: test_data_only_dcp.py
def test_reduced_variant(tmp_path):
    stdout, summary = _run(
        tmp_path,
        "--lanes",
        "8",
        "--global-batch",
        "64",
        "--local-batch",
        "8",
        "--ranks",
        "4",
        "--resume-on",
        "8",
        "--chain",
        "4,2",
        "--steps",
        "5",
        "--save-at",
        "2",
        timeout=900,
    )
    ranks = [p["ranks"] for p in summary["phases"]]
    assert ranks == [0, 4, 8, 2]
    assert "| 4 -> 8 | 8 | 3-5 | 3/3 | 3/3 |" in stdout


@pytest.mark.slow
def test_sixteen_ranks_resumed_on_8_32_64_and_a_chain(tmp_path):
    """The full run: what the README and docs/performance.md show."""
    stdout, summary = _run(tmp_path, timeout=3600)
    assert [p["ranks"] for p in summary["phases"]] == [0, 16, 8, 32, 64, 8, 64, 32]
    print(stdout)
