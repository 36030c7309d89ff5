"""scripts/elastic_scale.py: save on W ranks, resume on others, through real torchrun + DCP, data only.

The slow tier runs the full 16 -> 8/32/64 run with its chain (~5 min and ~13 GB at its 64-rank phases on the
2-core 24 GiB machine: docs/performance.md). The gate's elastic resumes through data_run are test_data_only_dcp.py;
a shorter variant of this script is in its docstring."""

import os

import pytest
from conftest import REPO, run_scale_script

SCRIPT = os.path.join(REPO, "scripts", "elastic_scale.py")


def _run(tmp_path, *args, timeout):
    stdout, summary = run_scale_script(SCRIPT, str(tmp_path / "work"), *args, timeout=timeout)
    assert "(differs from step 1)" in stdout  # the negative control mismatches from its first step
    return stdout, summary


@pytest.mark.integration
@pytest.mark.slow
def test_sixteen_ranks_resumed_on_8_32_64_and_a_chain(tmp_path):
    """The full run: what the README and docs/performance.md show."""
    stdout, summary = _run(tmp_path, timeout=3600)
    assert [p["ranks"] for p in summary["phases"]] == [0, 16, 8, 32, 64, 8, 64, 32]
    print(stdout)
