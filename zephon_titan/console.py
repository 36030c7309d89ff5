"""`zephon-titan run --quiet`: the console shows what a person reads during a run, every line stays in the logs.

torchrun writes each rank's output to files under the log folder (`<run id>/attempt_<n>/<local rank>/stdout.log`
and `stderr.log`); with `--tee` it also copies them to the console. Quiet, it only writes the files, and this
follows local rank 0's, printing the lines that matter: ours (the loader's), each step's loss line, checkpoint
saves and loads, warnings and errors. TorchTitan's other INFO lines (meshes, model building, GC) stay in the
files. Nothing in the ranks changes: the files hold the same lines as without --quiet.
"""

from __future__ import annotations

import glob
import os
import threading

SHOWN = (
    "zephon",  # ours
    "step:",  # TorchTitan's loss line of each step
    "the checkpoint",  # TorchTitan's checkpointer: saving, loading (from where), finished
    "checkpoint completed",
    "this is a fresh start",
    "WARNING",
    "ERROR",
    "CRITICAL",
    "Training completed",
)
"""A line containing one of these is printed (a failure's traceback stays in the files: `run` ends with one line
naming them)."""


def shown(line: str) -> bool:
    return any(mark in line for mark in SHOWN)


class Follower:
    """Prints the shown lines of local rank 0's output files under `log_dir` written from now on."""

    def __init__(self, log_dir: str, interval: float = 0.2):
        self.log_dir, self.interval = log_dir, interval
        self._known = set(self._files())  # an earlier run's files in the same folder are not followed
        self._offsets: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zephon-console", daemon=True)

    def __enter__(self) -> Follower:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._read()  # what the ranks wrote last

    def _files(self) -> list[str]:
        pattern = os.path.join(glob.escape(self.log_dir), "*", "attempt_*", "0", "std*.log")
        return sorted(glob.glob(pattern))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._read()

    def _read(self) -> None:
        for path in self._files():
            if path in self._known:
                continue
            at = self._offsets.get(path, 0)
            try:
                with open(path, "rb") as f:
                    f.seek(at)
                    data = f.read()
            except OSError:
                continue
            end = data.rfind(b"\n") + 1  # whole lines only: the rest is read when it is finished
            self._offsets[path] = at + end
            for line in data[:end].decode("utf-8", "replace").splitlines():
                if shown(line):
                    print(line, flush=True)
