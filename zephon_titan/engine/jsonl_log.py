"""Append-only JSON-lines records (the batch ledger, validation.jsonl) that a crash or a full disk cannot tear.

- **One write per line.** An entry is appended with one write() of its whole line. A short write or a
  failed one (ENOSPC, EFBIG, EIO) is cut off again, so no half line stays for the next append to be glued
  to, and the append fails with one line naming the file.
- **A torn last line is an interrupted append.** A crash can still leave one (killed between the write
  and the cut, or an unflushed append that reads back as NUL bytes). A run that resumes drops it, saying
  so; a reader refuses it naming the file and line.
- **A bad line before the last is corruption**, never an interrupted append (which only ever tears the
  last line): refused naming the file and line, nothing dropped on the way.
- **Resume.** A run that resumes after step s keeps the entries of steps <= s (a later one was written
  by the run that stopped, and will be written again), rewritten whole (a crash leaves the old file or
  the new one); a fresh run starts an empty file.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from zephon_titan.errors import DataError

log = logging.getLogger("zephon_titan")
T = TypeVar("T")


@dataclass(frozen=True)
class RecordFormat(Generic[T]):
    """What one kind of record holds, and how its errors name it."""

    record: str
    """The whole record, in errors: "the ledger" ("the ledger is corrupt there")."""
    entry: str
    """One entry, in errors: "ledger entry" ("line 3: not a ledger entry (...)")."""
    parse: Callable[[bytes], T]
    """One line (its newline included) as an entry; ValueError saying what is wrong with it."""
    to_line: Callable[[T], str]
    """An entry as one line of JSON, without the newline."""
    step: Callable[[T], int]
    """The optimizer step an entry belongs to."""
    remedy: str
    """What to do about a corrupt line: "fix or delete that line, or delete the file (...)"."""


def read_entries(path: str, fmt: RecordFormat[T], drop_torn_tail: bool = False) -> tuple[list[T], int]:
    """The entries of `path`, and the number of the incomplete last line that was dropped (0: none).

    A bad line before the last is a DataError naming the file and line; a bad last line is one too,
    unless `drop_torn_tail` (a run resuming: it is what an interrupted append leaves)."""
    from zephon_titan.engine.sources.guards import open_regular

    entries: list[T] = []
    bad: tuple[int, ValueError | RecursionError] | None = None
    # A folder, a device or a FIFO: one line, never a hang.
    with os.fdopen(open_regular(path, fix=f"name {fmt.record}'s file"), "rb") as f:
        for number, raw in enumerate(f, 1):
            if bad is not None:  # a bad line with more after it: not a torn append
                raise DataError(
                    f"{path} line {bad[0]}: not a {fmt.entry} ({bad[1]}); {fmt.record} is corrupt there (not an "
                    f"interrupted append, which only ever tears the last line): {fmt.remedy}"
                )
            if raw.strip():  # NUL bytes (what a crash can leave of an unflushed append) are a bad line
                try:
                    entries.append(fmt.parse(raw))
                except (ValueError, RecursionError) as e:  # UnicodeDecodeError, JSONDecodeError; nesting too deep
                    bad = (number, e)
    if bad is not None and not drop_torn_tail:
        raise DataError(
            f"{path} line {bad[0]}: not a {fmt.entry} ({bad[1]}); it is the last line: a run was interrupted "
            "while appending it? Delete that line to use the entries before it"
        )
    return entries, bad[0] if bad else 0


class AppendOnlyLog(Generic[T]):
    """A record one process appends to; opened for a run that resumes after `resume_step` (0: a fresh run)."""

    def __init__(self, path: str, fmt: RecordFormat[T], resume_step: int):
        self.path, self.fmt = path, fmt
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self.kept: list[T] = []
        """The entries kept from before the resume (steps <= resume_step), in file order."""
        if resume_step > 0 and os.path.exists(path):  # a fresh run keeps nothing: no need to read
            entries, torn = read_entries(path, fmt, drop_torn_tail=True)
            if torn:
                log.warning(
                    "zephon: %s line %d was incomplete (a crash or a full disk while appending it); dropped it, "
                    "the run resumes after step %d and appends from there",
                    path,
                    torn,
                    resume_step,
                )
            self.kept = [e for e in entries if fmt.step(e) <= resume_step]
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:  # replaced whole: a crash leaves the old or the new file
            f.writelines(fmt.to_line(e) + "\n" for e in self.kept)
        os.replace(tmp, path)

    def append(self, entry: T) -> None:
        """One write() of the entry's line; on a short or failed write the file is cut back to its last
        whole line and OSError names the file."""
        line = (self.fmt.to_line(entry) + "\n").encode("utf-8")
        what = f"step {self.fmt.step(entry)}'s {self.fmt.entry}"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            try:
                written = os.write(fd, line)
            except OSError as e:
                _cut(fd, size)  # a full disk may have taken part of it
                raise OSError(
                    e.errno, f"{self.path}: {what} could not be written ({e.strerror}); removed what was written of it"
                ) from None
            if written != len(line):
                _cut(fd, size)  # never leave half a line for the next append to follow
                raise OSError(
                    f"{self.path}: only {written} of the {len(line)} bytes of {what} could be written "
                    "(disk full?); removed them"
                )
        finally:
            os.close(fd)


def _cut(fd: int, size: int) -> None:
    """Truncate back to `size` bytes; if even that fails, the next resume drops the torn line."""
    try:
        os.ftruncate(fd, size)
    except OSError:
        pass
