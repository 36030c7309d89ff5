"""What a command is doing while a person waits, on standard error (standard output carries what users pipe:
the ledger, the JSON, the report).

    with Waiting("plan"):                        # cli.main, around plan, inspect, where and validate
        progress.doing("opening 3 sources")      # anywhere below it: a new stage (no-op without a Waiting)
        progress.doing("simulating", total=1000)
        progress.advance(1, tokens=32768)        # a step done, and its tokens (for the rate)

Nothing is said of a command that ends within AFTER seconds. After that, a thread says the current stage: on a
terminal one line redrawn in place (cleared at the end, and before anything the command writes to standard
output on the same terminal); to a pipe or a log, plain lines, one when the stage changes and at most one every
EVERY seconds within it ("plan: step 400 of 1,000, 2.1 M tokens/s, ~30 s left (simulating 8 lanes ...)"), then
"plan: done in 42 s". ZEPHON_TITAN_PROGRESS_SECONDS sets both (tests: say it at once).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

AFTER = 2.0  # seconds: a shorter wait is not spoken of
EVERY = 5.0  # seconds: to a pipe, at most one line this often within a stage
TICK = 0.25  # seconds between the thread's looks (a terminal's redraws)
_current: Waiting | None = None


def on_terminal(stream: Any) -> bool:
    """Whether `stream` (None: standard error) is a terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def doing(what: str, total: int | None = None, unit: str = "step") -> None:
    """The command's current stage; with `total`, advance() counts it."""
    if _current is not None:
        _current.doing(what, total, unit)


def advance(n: int = 1, tokens: int = 0) -> None:
    if _current is not None:
        _current.advance(n, tokens)


def _amount(rate: float) -> str:
    for size, prefix in ((1e9, " G "), (1e6, " M "), (1e3, " k ")):
        if rate >= size:
            return f"{rate / size:.3g}{prefix}"
    return f"{rate:.3g} "


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 10 else f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min"


class Waiting:
    """The stage a command is in, said on `stream` (standard error) once the command has taken long."""

    def __init__(self, command: str, stream: Any = None, after: float | None = None, every: float | None = None):
        told = os.environ.get("ZEPHON_TITAN_PROGRESS_SECONDS")
        self.command = command
        self.stream = sys.stderr if stream is None else stream
        self.terminal = on_terminal(self.stream)
        self.after = after if after is not None else float(told) if told else AFTER
        self.every = every if every is not None else float(told) if told else EVERY
        self.started = time.monotonic()
        self.what, self.unit, self.done, self.tokens = "starting", "step", 0, 0
        self.total: int | None = None
        self.stage_started = self.started
        self._said = ""  # the stage of the last line said to a pipe
        self._said_at = 0.0
        self._spoke = False
        self._drawn = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stdout: Any = None

    def doing(self, what: str, total: int | None = None, unit: str = "step") -> None:
        self.what, self.total, self.unit, self.done, self.tokens = what, total, unit, 0, 0
        self.stage_started = time.monotonic()

    def advance(self, n: int = 1, tokens: int = 0) -> None:
        self.done += n
        self.tokens += tokens

    def line(self, now: float) -> str:
        """The current stage in words: what it counts first (a terminal's line is cut at its width)."""
        if self.total is None:
            return f"{self.command}: {self.what} ... ({_seconds(now - self.started)})"
        text = f"{self.command}: {self.unit} {self.done:,} of {self.total:,}"
        spent = now - self.stage_started
        if self.done and spent > 0:
            rate = self.tokens / spent if self.tokens else self.done / spent
            text += f", {_amount(rate)}{'tokens' if self.tokens else self.unit + 's'}/s"
            if self.done < self.total:
                text += f", ~{_seconds((self.total - self.done) * spent / self.done)} left"
        return f"{text} ({self.what})"

    def tick(self, now: float) -> None:
        """Say the stage if the command has been long enough at it (the thread calls this every TICK)."""
        if now - self.started < self.after:
            return
        with self._lock:
            if self.terminal:
                width = _columns(self.stream)
                self.stream.write("\r" + self.line(now)[: width - 1] + "\x1b[K")
                self.stream.flush()
                self._drawn = self._spoke = True
            elif self.what != self._said or now - self._said_at >= self.every:
                if self.what != self._said and now - self._said_at < min(1.0, self.every):
                    return  # stages that pass quickly: the one still going is said a moment later
                self.stream.write(self.line(now) + "\n")
                self.stream.flush()
                self._said, self._said_at, self._spoke = self.what, now, True

    def clear(self) -> None:
        """Erase the terminal's line."""
        with self._lock:
            self._erase()

    def _erase(self) -> None:
        if self._drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._drawn = False

    def _run(self) -> None:
        while not self._stop.wait(TICK):
            self.tick(time.monotonic())

    def __enter__(self) -> Waiting:
        global _current
        _current = self
        if self.terminal and on_terminal(sys.stdout):
            self._stdout, sys.stdout = sys.stdout, _Cleared(sys.stdout, self)
        self._thread = threading.Thread(target=self._run, name="zephon-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind: Any, error: Any, tb: Any) -> None:
        global _current
        _current = None
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._stdout is not None:
            sys.stdout = self._stdout
        self.clear()
        if self._spoke and not self.terminal and kind is None:
            self.stream.write(f"{self.command}: done in {_seconds(time.monotonic() - self.started)}\n")
            self.stream.flush()


class _Cleared:
    """Standard output on the terminal that also shows the progress line: each write erases the line first (the
    thread draws it again on its next look)."""

    def __init__(self, stdout: Any, waiting: Waiting):
        self._stdout, self._waiting = stdout, waiting

    def write(self, text: str) -> int:
        with self._waiting._lock:  # not redrawn between the erasing and the text
            self._waiting._erase()
            return self._stdout.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stdout, name)


def _columns(stream: Any) -> int:
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError):
        columns = 0
    return columns if columns > 1 else 80  # a terminal that does not say its size (a pty's 0)
