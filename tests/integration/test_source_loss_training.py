"""The training loss of each source (zephon/loss/<source>) through TorchTitan's real trainer on CPU, 1, 2 and 4
ranks: at every step their token-weighted mean is TorchTitan's loss of that step (read back from TorchTitan's
TensorBoard logger, where both are logged); the same per-source losses on 1, 2 and 4 ranks. (TorchTitan's loss is
returned unchanged, bit for bit: unit/test_source_loss.py.)"""

from __future__ import annotations

import glob
import os

import pytest
from conftest import check, cpu_job_args, torchrun

# Slow tier: three torchrun runs of the CPU debug job (~20-40 s each on 2 cores).
pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS = 3
SOURCES = ("code", "prose")


def _scalars(workdir: str, run: str) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (folder,) = glob.glob(os.path.join(workdir, run, "tb", "*"))
    events = EventAccumulator(folder)
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


@pytest.fixture(scope="module")
def runs(workdir) -> dict[int, dict[str, dict[int, float]]]:
    out = {}
    for nproc in (1, 2, 4):
        run = f"source_loss_w{nproc}"
        args = cpu_job_args(run, STEPS, "--metrics.enable_tensorboard", "--checkpoint.no-enable")
        output = check(torchrun(workdir, "zephon_titan.train_cpu", nproc, args)).stdout
        assert "zephon loss per source: code " in output
        out[nproc] = _scalars(workdir, run)
    return out


def _mean(scalars: dict[str, dict[int, float]], step: int, weights_of: dict[str, str]) -> float:
    """The sources' losses weighted by targets (`weights_of`: whose target count weighs each source's loss)."""
    total = sum(scalars[f"zephon/loss_targets/{weights_of[s]}"][step] for s in SOURCES)
    return sum(scalars[f"zephon/loss/{s}"][step] * scalars[f"zephon/loss_targets/{weights_of[s]}"][step]
               for s in SOURCES) / total  # fmt: skip


def test_per_source_losses_average_to_torchtitans_loss(runs):
    for nproc, scalars in runs.items():
        loss = scalars["loss_metrics/global_avg_loss"]
        assert sorted(loss) == list(range(1, STEPS + 1)), nproc
        for step in loss:
            assert _mean(scalars, step, {s: s for s in SOURCES}) == pytest.approx(loss[step], rel=1e-6), (nproc, step)
            # Negative control: each source's loss weighted by the other's targets is another number.
            swapped = _mean(scalars, step, {"code": "prose", "prose": "code"})
            assert swapped != pytest.approx(loss[step], rel=1e-4), (nproc, step)


def test_the_same_losses_on_one_two_and_four_ranks(runs):
    one = runs[1]
    for nproc in (2, 4):
        for source in SOURCES:
            assert runs[nproc][f"zephon/loss_targets/{source}"] == one[f"zephon/loss_targets/{source}"], nproc
            got = runs[nproc][f"zephon/loss/{source}"]
            for step, value in one[f"zephon/loss/{source}"].items():
                assert got[step] == pytest.approx(value, rel=2e-4), (nproc, source, step)
