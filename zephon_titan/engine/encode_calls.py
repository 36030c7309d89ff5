"""Encode calls shared by the readers of a lane group, and how many characters a reader tokenizes at a time.

Readers that step together (one lane group, one thread) tokenize their documents a batch at a time and, when a
batch runs out, take along the next batches of other readers (EncodeBatcher): fewer, longer encode calls. A
document's ids never depend on its batch: these are speed knobs only (source_reader.py reads the batches).
"""

from __future__ import annotations

import weakref
from collections import deque
from typing import Any, Protocol

import numpy as np


class Reader(Protocol):
    """What EncodeBatcher asks of a reader (source_reader.Reader)."""

    queued: bool
    ref: weakref.ref[Any]

    def next_batch_texts(self) -> tuple[int, list[Any]] | None: ...

    def take_ahead(self, start: int, docs: list[Any], encoded: list[np.ndarray]) -> None: ...


# Documents tokenized together in one encode_batch call (a speed knob only). Batches
# start at one document and double, so the first row (and a restore) waits for a few documents only
# (a row of 2,048 tokens is often one document of a source, and a lane's first row meets a few sources).
TOKENIZE_BATCH = 64
FIRST_TOKENIZE_BATCH = 1
# A batch also ends once its texts reach a number of characters: every lane holds its current batch of
# every source as token ids, and the next one once encoded ahead (EncodeBatcher), so the readers of a process
# share a budget of characters tokenized ahead, two batches each. A few lanes get large batches (fewer, longer
# encode calls: ~15 % more tokens/s at 8 lanes than with the floor), thousands of lanes the floor, and their
# batches are encoded together in calls of ENCODE_CALL_CHARS (issue 28).
TOKENIZE_AHEAD_CHARS = 64 << 20
TOKENIZE_BATCH_CHARS = (16 << 10, 1 << 20)  # (floor, ceiling) per reader and batch
_live_readers: weakref.WeakSet[Any] = weakref.WeakSet()


def tokenize_batch_chars() -> int:
    """Characters one reader tokenizes in a batch: its share of the process's budget, within bounds."""
    floor, ceiling = TOKENIZE_BATCH_CHARS
    return max(floor, min(ceiling, TOKENIZE_AHEAD_CHARS // (2 * max(1, len(_live_readers)))))


# Readers that step together (one lane group, one thread) encode in shared calls: a reader whose batch runs
# out takes along the next batches of other readers (the ones waiting longest first), up to this many
# characters in all. Thousands of lanes each tokenize a few documents at a time (their share of
# TOKENIZE_AHEAD_CHARS); with fastokens' threads, a call of a few KiB costs more per token: 1,024 lanes ran
# 12-13 % faster with shared calls (issue 28). A document's ids never depend on its batch.
ENCODE_CALL_CHARS = 1 << 20


_Text = tuple[str | np.ndarray, str, int]
"""A document as a reader reads it: its text (or token ids), file and row."""


class EncodeBatcher:
    """The readers of one lane group without a next batch (a FIFO, weakly held: the longest waiting is the
    nearest to running out): the next reader that encodes takes their next batches along. Not thread-safe:
    one per group of lanes stepped in one thread (LaneGroup, a worker process); a lane alone has its own."""

    def __init__(self) -> None:
        self._waiting: deque[weakref.ref[Reader]] = deque()

    def wants(self, reader: Reader) -> None:
        if not reader.queued:
            reader.queued = True
            self._waiting.append(reader.ref)

    def join(self, reader: Reader, docs: list[_Text]) -> list[tuple[Reader, int, list[_Text]]]:
        """Batches of waiting readers (each: reader, its first window position, its documents) to encode with
        `docs`."""
        chars = sum(len(item) for item, _, _ in docs)
        out = []
        while self._waiting and chars < ENCODE_CALL_CHARS:
            other = self._waiting.popleft()()
            if other is None:
                continue
            other.queued = False
            if other is reader:
                continue
            ahead = other.next_batch_texts()
            if ahead is not None:
                out.append((other, *ahead))
                chars += sum(len(item) for item, _, _ in ahead[1])
        return out


_Batch = tuple[int, tuple[np.ndarray, ...], tuple[str, ...], tuple[int, ...]]
"""A reader's batch: its first window position, and each document's tokens, file and row. Plain tuples (of
arrays, strings and ints), which the garbage collector stops tracking: a batch lives for many rows, and at
thousands of lanes tracked objects that live that long made it run full collections (issue 28)."""
_NO_BATCH: _Batch = (0, (), (), ())


def _batch_of(start: int, docs: list[_Text], encoded: list[np.ndarray]) -> _Batch:
    return (start, tuple(encoded), tuple(file for _, file, _ in docs), tuple(int(row) for _, _, row in docs))


def _index_in(batch: _Batch, p: int) -> int:
    """Where window position p is in the batch, or -1."""
    i = p - batch[0]
    return i if 0 <= i < len(batch[1]) else -1
