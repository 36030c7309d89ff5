"""Documents into rows of seq_len + 1 tokens.

Row layout. A row holds seq_len + 1 tokens; the model sees inputs = row[:-1] and
labels = row[1:] (so in `wrap` packing every token is an input or a label of
exactly one row, and none is dropped). Positions restart at 0 at every piece of
a document in a row: at each document start, and also at the start of a row that
continues a document from the previous row. The continuation thus becomes its
own attention block (it could not see the previous row anyway) and positions stay
below seq_len, inside the RoPE cache; TorchTitan's block-causal mask cuts
documents where positions return to 0. Padding (best_fit, or the last row of a
finite lane) uses the pad id, positions 0, 1, ... as one block, and label -100.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np

from zephon_titan.config import DataConfig
from zephon_titan.engine.feed import Document, DocumentFeed
from zephon_titan.engine.spec import EngineSpec
from zephon_titan.engine.state import SourceCursor
from zephon_titan.errors import ConfigError, LaneExhausted, ResumeError

IGNORE_INDEX = -100
_ROW_DTYPE = np.dtype("<i4")  # fixed byte order: row bytes (and hashes) are platform-independent


@dataclass(frozen=True, slots=True)
class Piece:
    """A slice of one document placed in a row (for tracing rows back to files)."""

    source: int
    file: str
    row: int
    doc_offset: int
    length: int


@dataclass(frozen=True, slots=True)
class Row:
    inputs: np.ndarray
    """int32 [seq_len] token ids."""
    labels: np.ndarray
    """int32 [seq_len]: inputs shifted by one; -100 where the target is padding."""
    positions: np.ndarray
    """int32 [seq_len]: position of each input inside its document piece."""
    pieces: tuple[Piece, ...]
    padding: int
    """Padding tokens among the row's seq_len + 1 tokens."""

    def to_bytes(self) -> bytes:
        return self.inputs.tobytes() + self.labels.tobytes() + self.positions.tobytes()


def tally(rows: Iterable[Row], num_sources: int) -> list[int]:
    """Tokens per source, then padding (last), over `rows`: the one count behind the ledger and the metrics."""
    counts = [0] * (num_sources + 1)
    for row in rows:
        for piece in row.pieces:
            counts[piece.source] += piece.length
        counts[-1] += row.padding
    return counts


def make_row(parts: list[tuple[np.ndarray, Piece]], row_tokens: int, pad_id: int) -> Row:
    """Concatenate document pieces into a row, padding the tail."""
    used = sum(len(tokens) for tokens, _ in parts)
    padding = row_tokens - used
    tokens = np.empty(row_tokens, dtype=_ROW_DTYPE)
    positions = np.empty(row_tokens, dtype=_ROW_DTYPE)
    at = 0
    for piece_tokens, _ in parts:
        n = len(piece_tokens)
        tokens[at : at + n] = piece_tokens
        positions[at : at + n] = np.arange(n, dtype=_ROW_DTYPE)
        at += n
    tokens[at:] = pad_id
    positions[at:] = np.arange(padding, dtype=_ROW_DTYPE)
    labels = tokens[1:].copy()
    if padding:
        labels[max(used - 1, 0) :] = IGNORE_INDEX
    return Row(tokens[:-1], labels, positions[:-1], tuple(p for _, p in parts), padding)


class Packer(Protocol):
    """A packing mode: documents of a lane's feed -> rows; its state is the open unit (see state.py)."""

    name: ClassVar[str]

    @classmethod
    def from_spec(cls, feed: DocumentFeed, spec: EngineSpec) -> Packer: ...

    @staticmethod
    def fingerprint(config: DataConfig) -> str:
        """The packer's settings that the rows depend on, for the resume fingerprint."""
        ...

    def next_row(self) -> Row: ...

    def unit(self) -> tuple[tuple[SourceCursor, ...], bool, int]: ...

    def restore(self, unit_open: bool, unit_offset: int) -> None: ...


# The packing registry: `[dataloader] packing = "<name>"` picks a class here. Adding a mode is one
# class (the Packer protocol) plus one `register_packer` line.
_PACKERS: dict[str, type[Packer]] = {}


def register_packer(cls: type[Packer]) -> type[Packer]:
    if cls.name in _PACKERS:
        raise ValueError(f"packing {cls.name!r} is registered already")
    _PACKERS[cls.name] = cls
    return cls


def packer_class(name: str) -> type[Packer]:
    if name not in _PACKERS:
        raise ConfigError(f"[dataloader] packing must be one of {', '.join(_PACKERS)}, got {name!r}")
    return _PACKERS[name]


class WrapPacker:
    """Documents concatenated and split across rows: no padding, no token dropped.

    Unit = the document being emitted; unit_offset = its tokens already in rows.
    """

    name: ClassVar[str] = "wrap"

    @classmethod
    def from_spec(cls, feed: DocumentFeed, spec: EngineSpec) -> WrapPacker:
        return cls(feed, spec.row_tokens, spec.pad_id)

    @staticmethod
    def fingerprint(config: DataConfig) -> str:
        return "wrap"

    def __init__(self, feed: DocumentFeed, row_tokens: int, pad_id: int):
        self.feed = feed
        self.row_tokens = row_tokens
        self.pad_id = pad_id
        self._doc: Document | None = None
        self._doc_start: tuple[SourceCursor, ...] = feed.state()
        self._offset = 0

    def restore(self, unit_open: bool, unit_offset: int) -> None:
        """Re-read the open document (the feed is at its start) and skip what was emitted."""
        self._doc_start = self.feed.state()
        self._doc = self.feed.next_document() if unit_open else None
        self._offset = unit_offset
        if unit_open and (self._doc is None or unit_offset > len(self._doc.tokens)):
            raise ResumeError(
                f"lane {self.feed.lane_id}: state does not match the data: the open document is shorter than its offset; was the data changed?"
            )

    def unit(self) -> tuple[tuple[SourceCursor, ...], bool, int]:
        if self._doc is None:
            return self.feed.state(), False, 0
        return self._doc_start, True, self._offset

    def next_row(self) -> Row:
        parts: list[tuple[np.ndarray, Piece]] = []
        need = self.row_tokens
        while need:
            if self._doc is None or self._offset == len(self._doc.tokens):
                self._doc_start = self.feed.state()
                self._doc = self.feed.next_document()
                self._offset = 0
                if self._doc is None:
                    break
            doc = self._doc
            n = min(need, len(doc.tokens) - self._offset)
            parts.append(
                (doc.tokens[self._offset : self._offset + n], Piece(doc.source, doc.file, doc.row, self._offset, n))
            )
            self._offset += n
            need -= n
        if not parts:
            raise LaneExhausted
        return make_row(parts, self.row_tokens, self.pad_id)


class BestFitPacker:
    """Whole documents placed into rows by best-fit decreasing, within a window of documents.

    A document longer than a row is first cut into row-sized chunks. Unit = the
    window of documents; unit_offset = its rows already emitted.
    """

    name: ClassVar[str] = "best_fit"

    @classmethod
    def from_spec(cls, feed: DocumentFeed, spec: EngineSpec) -> BestFitPacker:
        return cls(feed, spec.row_tokens, spec.pad_id, spec.config.best_fit_window_docs)

    @staticmethod
    def fingerprint(config: DataConfig) -> str:
        return f"best_fit(window_docs={config.best_fit_window_docs})"

    def __init__(self, feed: DocumentFeed, row_tokens: int, pad_id: int, window_docs: int):
        self.feed = feed
        self.row_tokens = row_tokens
        self.pad_id = pad_id
        self.window_docs = window_docs
        self._rows: list[Row] = []
        self._emitted = 0
        self._window_start = feed.state()

    def restore(self, unit_open: bool, unit_offset: int) -> None:
        self._window_start = self.feed.state()
        self._rows = self._pack_window() if unit_open else []
        self._emitted = unit_offset
        if unit_offset > len(self._rows):
            raise ResumeError(
                f"lane {self.feed.lane_id}: state does not match the data: the best-fit window has fewer rows; was the data changed?"
            )

    def unit(self) -> tuple[tuple[SourceCursor, ...], bool, int]:
        if self._emitted == len(self._rows):
            return self.feed.state(), False, 0
        return self._window_start, True, self._emitted

    def next_row(self) -> Row:
        if self._emitted == len(self._rows):
            self._window_start = self.feed.state()
            self._rows = self._pack_window()
            self._emitted = 0
            if not self._rows:
                raise LaneExhausted
        row = self._rows[self._emitted]
        self._emitted += 1
        return row

    def _pack_window(self) -> list[Row]:
        pieces: list[tuple[np.ndarray, Piece]] = []
        for _ in range(self.window_docs):
            doc = self.feed.next_document()
            if doc is None:
                break
            for start in range(0, len(doc.tokens), self.row_tokens):
                chunk = doc.tokens[start : start + self.row_tokens]
                pieces.append((chunk, Piece(doc.source, doc.file, doc.row, start, len(chunk))))
        # Longest first; equal lengths keep arrival order (sorted() is stable).
        order = sorted(range(len(pieces)), key=lambda i: -len(pieces[i][0]))
        bins: list[list[tuple[np.ndarray, Piece]]] = []
        free: list[tuple[int, int]] = []  # sorted (free tokens, bin index)
        for i in order:
            n = len(pieces[i][0])
            at = bisect.bisect_left(free, (n, -1))
            if at < len(free):
                space, b = free.pop(at)
            else:
                space, b = self.row_tokens, len(bins)
                bins.append([])
            bins[b].append(pieces[i])
            if space - n > 0:
                bisect.insort(free, (space - n, b))
        return [make_row(parts, self.row_tokens, self.pad_id) for parts in bins]


register_packer(WrapPacker)
register_packer(BestFitPacker)
