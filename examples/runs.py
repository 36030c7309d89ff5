"""Run folders of the CPU trainer (tests, demo): start a run from another run's checkpoint."""

from __future__ import annotations

import os
import shutil


def copy_checkpoint(src_run: str, step: int, dst_run: str) -> None:
    """Make `dst_run` resume from `src_run`'s step-`step` checkpoint, with its ledger up to there
    (TorchTitan loads the latest complete checkpoint of the run's own folder)."""
    src = os.path.join(src_run, "checkpoint")
    dst = os.path.join(dst_run, "checkpoint")
    os.makedirs(dst)
    shutil.copytree(os.path.join(src, f"step-{step}"), os.path.join(dst, f"step-{step}"))
    shutil.copy(os.path.join(src, "ledger.jsonl"), os.path.join(dst, "ledger.jsonl"))
