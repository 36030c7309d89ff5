"""Errors for humans: each says what is wrong, where, and how to fix it."""

import os
import sys


class ZephonError(Exception):
    """Base class of every error zephon_titan raises on purpose."""


class ConfigError(ZephonError):
    """The configuration is invalid (unknown key, bad value, missing file)."""


class DataError(ZephonError):
    """A data file cannot be read as configured (names the file and row)."""


class ResumeError(ZephonError):
    """A checkpoint cannot be restored into this run (names what changed)."""


class LaneExhausted(Exception):
    """A lane has no more rows: every source is used up under a non-repeating policy.

    Not a ZephonError: it is the normal end of a finite stream, like StopIteration
    (which cannot be raised through generators, PEP 479).
    """


# Exit status of a process stopped by a ZephonError (a crash exits 1).
EXIT_USER_ERROR = 2


def report_once(error: BaseException, prefix: str = "zephon_titan: error: ") -> None:
    """Print a user error as one line on stderr, once per job under torchrun.

    Every rank usually hits the same mistake; printing it 8 or 64 times buries it. The
    first rank of this host to report a given message prints it (a marker file per message,
    created atomically in a folder named after torchrun's run id); a rank with a message of
    its own (its data file is bad) still prints it. Outside torchrun it always prints.
    """
    import hashlib
    import tempfile

    message = prefix + " ".join(str(error).split("\n"))
    _write_torchrun_error_file(message)
    if os.environ.get("ZEPHON_TITAN_LAUNCHED") and os.environ.get("TORCHELASTIC_ERROR_FILE"):
        return  # `zephon-titan run` (launch.py) prints the failing rank's line, once
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id:
        folder = os.path.join(tempfile.gettempdir(), f"zephon_titan-errors-{os.getuid()}-{run_id}"[:200])
        marker = os.path.join(folder, hashlib.sha256(message.encode()).hexdigest()[:32])
        try:
            if not os.path.isdir(folder):
                _forget_old_runs()
            os.makedirs(folder, exist_ok=True)
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            return
        except OSError:
            pass  # no usable temp folder: printing twice beats not printing
    print(message, file=sys.stderr, flush=True)


# The marker folders of jobs that failed more than this long ago are removed when a new job's is made: every failed
# job leaves one in the temporary folder, and no rank knows when the others are done with it.
MARKERS_KEPT_SECONDS = 24 * 3600


def _forget_old_runs() -> None:
    import shutil
    import tempfile
    import time

    prefix = f"zephon_titan-errors-{os.getuid()}-"
    try:
        entries = [e for e in os.scandir(tempfile.gettempdir()) if e.name.startswith(prefix)]
        for entry in entries:
            if entry.is_dir(follow_symlinks=False) and time.time() - entry.stat().st_mtime > MARKERS_KEPT_SECONDS:
                shutil.rmtree(entry.path, ignore_errors=True)
    except OSError:
        pass  # tidying the temporary folder never stands in the way of the message


def _write_torchrun_error_file(message: str) -> None:
    """torchrun's failure summary shows this rank's error file as its "traceback": make it our one line."""
    import json
    import time

    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"message": message, "timestamp": int(time.time())}, f)
    except OSError:
        pass
