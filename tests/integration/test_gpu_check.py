"""scripts/gpu_check.sh's CPU dry run: the GPU measurement's code paths (the real trainer, or the plain loop
used where the GPU's torch is too old for TorchTitan, on our loader and on pre-made batches, timed per step)
run and report, so the script works when a GPU is at hand."""

import json
import os
import subprocess
import sys

import pytest

# Slow tier (the GPU check's CPU dry run).
pytestmark = [pytest.mark.integration, pytest.mark.slow]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("trainer", ["torchtitan", "plain"])
def test_gpu_check_dry_run_on_cpu(tmp_path, trainer):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    out = subprocess.run(
        ["bash", os.path.join(REPO, "scripts", "gpu_check.sh"), "--cpu", "--steps", "3", "--trainer", trainer],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    results = {name: json.loads((tmp_path / f"{name}.json").read_text()) for name in ("zephon", "premade")}
    for name, r in results.items():
        assert (
            r["loader"] == name
            and r["trainer"].startswith(trainer[:5])
            and r["steps"] == 3
            and r["device"].startswith("cpu")
        )
        assert r["median_step_s"] > 0 and 0 <= r["data_wait_fraction"] < 1
        assert r["copy_pinned_s"] is None  # no device to copy to
    assert "step time with our loader (2 workers) / with pre-made batches:" in out.stdout
