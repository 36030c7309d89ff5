"""Our log lines once per job, not once per rank: rank 0 logs them, every other rank only our warnings and
errors. TorchTitan's own lines are left as they are (`zephon-titan run`, like TorchTitan's launcher, shows
rank 0's console; `torchrun --local-ranks-filter 0` does the same).

ZEPHON_TITAN_LOG_RANKS=all in the environment keeps our lines on every rank (`zephon-titan run --log-ranks
all` sets it).
"""

from __future__ import annotations

import logging
import os

ENV = "ZEPHON_TITAN_LOG_RANKS"
_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_LOGGERS = ("", "zephon_titan")
"""Where our lines go: TorchTitan's logger (the root logger) and the engine's."""


class _OnlyWarnings(logging.Filter):
    """Drops records below WARNING made by this package's code."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not os.path.abspath(record.pathname).startswith(_PACKAGE)


_FILTER = _OnlyWarnings()


def quiet_other_ranks(rank: int | None = None) -> bool:
    """On a rank other than 0 (torchrun's RANK), keep only our warnings and errors; True if it did.

    The filter sits on the loggers, not on their handlers, so it stays when TorchTitan's init_logger()
    replaces the handlers."""
    if rank is None:
        rank = int(os.environ.get("RANK", "0") or 0)
    if rank == 0 or os.environ.get(ENV, "").strip().lower() == "all":
        return False
    for name in _LOGGERS:
        logging.getLogger(name).addFilter(_FILTER)
    return True


def log_every_rank() -> None:
    """Undo quiet_other_ranks() in this process."""
    for name in _LOGGERS:
        logging.getLogger(name).removeFilter(_FILTER)
