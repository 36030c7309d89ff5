"""A checkpoint save that fails on the disk (full, gone, read-only) ends the job in one line, not one DCP
traceback per rank: which checkpoint, the system's reason, the free space where it was going, and what a resume
will pick. DCP writes a checkpoint's `.metadata` last, so a failed save leaves no checkpoint a resume could take:
the last complete one stays the one it picks."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

from torch.distributed.checkpoint.api import CheckpointException

from zephon_titan.errors import ZephonError

SAVE_ERRORS = (CheckpointException, OSError)


class SaveError(ZephonError):
    """A checkpoint could not be written."""


def _causes(error: BaseException) -> Iterator[BaseException]:
    """The error, the errors DCP gathered from every rank, and their causes, depth first."""
    seen: set[int] = set()
    stack = [error]
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        if isinstance(e, CheckpointException):
            stack.extend(failure[0] if isinstance(failure, tuple) else failure for failure in e.failures.values())
        stack.extend(c for c in (e.__cause__, e.__context__) if c is not None)


def _free_space(folder: str) -> str:
    """The free space of the disk `folder` is on (its nearest existing parent)."""
    path = os.path.abspath(folder)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return "free space unknown"
    return f"{usage.free / 2**30:,.2f} GiB free of {usage.total / 2**30:,.1f} GiB"


def _last_complete(folder: str, failed: str) -> str:
    try:
        steps = [
            name
            for name in os.listdir(folder)
            if name.startswith("step-")
            and name[5:].isdigit()
            and os.path.join(folder, name) != failed
            and os.path.exists(os.path.join(folder, name, ".metadata"))
        ]
    except OSError:
        return "none"
    return max(steps, key=lambda name: int(name[5:])) if steps else "none"


def save_failure(error: BaseException, checkpoint_id: str) -> SaveError:
    """The one line for a failed save of `checkpoint_id` (a step-N folder)."""
    os_error = next((e for e in _causes(error) if isinstance(e, OSError)), None)
    reason = (os_error.strerror or str(os_error)) if os_error is not None else type(error).__name__
    folder = os.path.dirname(os.path.abspath(checkpoint_id))
    return SaveError(
        f"cannot save the checkpoint {os.path.abspath(checkpoint_id)}: {reason} ({_free_space(folder)} on its disk); free space or "
        f"save elsewhere, then resume: a resume picks the last complete checkpoint in {folder} "
        f"({_last_complete(folder, os.path.abspath(checkpoint_id))}), never this one"
    )
