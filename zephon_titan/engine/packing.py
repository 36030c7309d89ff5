"""The packers: a lane's documents into rows, and the registry `[dataloader] packing` names one from.

`wrap` concatenates documents and cuts rows from the stream (no padding, no token dropped); `best_fit` places
whole documents of a window into rows (best-fit decreasing, padding the rest). A packer chooses only which
pieces of which documents make a row, and its state is its open unit; how a row is laid out (labels, positions,
padding) is rows.py's, the same for every packer.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np

from zephon_titan.config import DataConfig
from zephon_titan.engine.feed import Document, DocumentFeed
from zephon_titan.engine.rows import Piece, Row, RowShape, document_id
from zephon_titan.engine.spec import EngineSpec
from zephon_titan.engine.state import CLOSED, MAX_RESIZED, FeedState, PackerState
from zephon_titan.errors import ConfigError, LaneExhausted, ResumeError


class Packer(Protocol):
    """A packing mode: documents of a lane's feed -> rows; its state is the open unit (PackerState, state.py),
    with the feed's state at the unit's start."""

    name: ClassVar[str]

    shape: RowShape
    """The rows it makes (set by the lane for its era: spec.era_of)."""
    boundary: Callable[[], int | None] | None
    """Set by the lane under a mixture schedule: rows from the next one to the next segment's
    first row (None: no later segment). A packer that draws ahead stops drawing there."""

    @classmethod
    def from_spec(cls, feed: DocumentFeed, spec: EngineSpec) -> Packer: ...

    @staticmethod
    def fingerprint(config: DataConfig) -> str:
        """The packer's settings that the rows depend on, for the resume fingerprint."""
        ...

    def next_row(self) -> Row: ...

    def unit(self) -> tuple[FeedState, PackerState]:
        """The packer's state, with the feed's at the start of its open unit (where a restore replays from)."""
        ...

    def restore(self, state: PackerState, shapes: list[RowShape] | None = None) -> None:
        """Replay the open unit from the feed (at its start). `shapes`: the row shapes from the one it was drawn
        with to this run's (a resume changed seq_len since)."""
        ...


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

    Unit = the document being emitted; unit_offset = its tokens already in rows. From exclude_from_step on, the
    rest of an excluded document drawn before it is dropped (exclusion.py).
    """

    name: ClassVar[str] = "wrap"
    boundary: Callable[[], int | None] | None = None  # one document at a time: nothing drawn ahead
    draws_runs: ClassVar[bool] = True
    """Whole short documents that follow one another drawn in one go (DocumentFeed.following): a speed knob, rows
    never depend on it (tests/unit/test_document_runs.py draws both ways)."""

    @classmethod
    def from_spec(cls, feed: DocumentFeed, spec: EngineSpec) -> WrapPacker:
        return cls(feed, RowShape.of(spec))

    @staticmethod
    def fingerprint(config: DataConfig) -> str:
        return "wrap"

    def __init__(self, feed: DocumentFeed, shape: RowShape):
        self.feed = feed
        self.shape = shape
        self._doc: Document | None = None
        self._slots = 0
        """The open document's slots (shape.piece_slots), looked up once per document, not once per piece."""
        self._doc_start: FeedState = feed.state()
        self._offset = 0

    def restore(self, state: PackerState, shapes: list[RowShape] | None = None) -> None:
        """Re-read the open document (the feed is at its start) and skip what was emitted. Across a seq_len change
        the piece goes on into rows of the new length from its offset (in slots, which do not depend on it)."""
        unit_open, unit_offset = state.unit_open, state.unit_offset
        if state.resized:
            raise ResumeError(
                f"lane {self.feed.lane_id}: field 'packer.resized' is set in a wrap state; the checkpoint is damaged"
            )
        self._doc_start = self.feed.state()
        self._doc = self.feed.next_document() if unit_open else None
        self._slots = self.shape.piece_slots(self._doc) if self._doc is not None else 0
        self._offset = unit_offset
        if unit_open and (self._doc is None or unit_offset > self._slots):
            raise ResumeError(
                f"lane {self.feed.lane_id}: state does not match the data: the open document is shorter than its offset; was the data changed?"
            )

    def unit(self) -> tuple[FeedState, PackerState]:
        if self._doc is None:
            return self.feed.state(), CLOSED
        return self._doc_start, PackerState(True, self._offset)

    def next_row(self) -> Row:
        parts: list[tuple[np.ndarray, Piece]] = []
        need = self.shape.slots
        while need:
            if self.feed.leaving_out and self._doc is not None and self.feed.dropped(*document_id(self._doc)):
                self._offset = self._slots  # drawn before exclude_from_step: drop its rest
            if self._doc is None or self._offset == self._slots:
                self._doc_start = self.feed.state()
                self._doc = self.feed.next_document()
                self._offset = 0
                if self._doc is None:
                    break
                self._slots = self.shape.piece_slots(self._doc)
            doc = self._doc
            n = min(need, self._slots - self._offset)
            start = doc.start + self._offset
            if parts and _continues(parts[-1][1], doc, start):
                # The same document's next piece, with nothing between: one block, positions go on.
                last = parts[-1][1]
                parts[-1] = (doc.tokens, Piece(last.source, last.file, last.row, last.doc_offset, last.length + n))
            elif n:  # a one-token document has no (input, label) pair under labels = "document"
                parts.append((doc.tokens, Piece(doc.source, doc.file, doc.row, start, n)))
            self._offset += n
            need -= n
            if need and self.draws_runs and self._offset == self._slots:
                need = self._place_following(parts, need)
        if not parts:
            raise LaneExhausted
        return self.shape.make_row(parts)

    def _place_following(self, parts: list[tuple[np.ndarray, Piece]], need: int) -> int:
        """The whole documents that follow the one just placed, drawn in one go (DocumentFeed.following): the
        pieces and the open unit next_row would have made drawing them one by one."""
        run = self.feed.following(need, self.shape.within_document)
        if run is None:
            return need
        pairs = self.shape.within_document
        source, last = run.source, len(run.tokens) - 1
        for tokens, file, row in zip(run.tokens[:last], run.files, run.rows):
            n = len(tokens) - pairs
            parts.append((tokens, Piece(source, file, row, 0, n)))
            need -= n
        tokens, file, row = run.tokens[last], run.files[last], run.rows[last]
        n = min(need, len(tokens) - pairs)
        parts.append((tokens, Piece(source, file, row, 0, n)))
        self._doc, self._doc_start, self._offset = (
            Document(source, tokens, file, row, 0, len(tokens)),
            run.before_last,
            n,
        )
        self._slots = self.shape.piece_slots(self._doc)
        return need - n


def _continues(last: Piece, doc: Document, start: int) -> bool:
    return (last.source, last.file, last.row) == (
        doc.source,
        doc.file,
        doc.row,
    ) and last.doc_offset + last.length == start


class BestFitPacker:
    """Whole documents placed into rows by best-fit decreasing, within a window of documents.

    A document longer than a row is first cut into row-sized chunks. Unit = the
    window of documents; unit_offset = its rows already emitted. From exclude_from_step on, a window drawn
    before it emits its rows without the excluded documents' pieces (padding in their place: exclusion.py).

    best_fit_mixing = "per_step" (docs/mixture.md): a window's rows are emitted in the mixer's order (_in_mixer_order),
    and under a schedule a window stops drawing at the slots of the rows left before the next segment
    (`boundary`), so a phase starts at its weights within a row or two per lane instead of a window later.
    """

    name: ClassVar[str] = "best_fit"

    @classmethod
    def from_spec(cls, feed: DocumentFeed, spec: EngineSpec) -> BestFitPacker:
        groups = tuple(int(s.chat is not None) for s in spec.sources) if spec.config.homogeneous_rows else None
        return cls(feed, RowShape.of(spec), spec.config.best_fit_window_docs, spec.config.best_fit_mixing, groups)

    @staticmethod
    def fingerprint(config: DataConfig) -> str:
        apart = ", chat and text rows apart" if config.homogeneous_rows else ""
        return f"best_fit(window_docs={config.best_fit_window_docs}{apart})"

    def __init__(
        self,
        feed: DocumentFeed,
        shape: RowShape,
        window_docs: int,
        mixing: str = "per_step",
        groups: tuple[int, ...] | None = None,
    ):
        """`groups`: per source, the group of rows its pieces go to (homogeneous_rows: chat 1, text 0); None: one."""
        self.feed = feed
        self.groups = groups
        self.shape = shape
        self.window_docs = window_docs
        self.per_step = mixing == "per_step"
        """best_fit_mixing: a window's rows in the mixer's order, no window across a segment start; else (runs
        before it) rows as placed, longest first, and a segment starts with the next window."""
        self.boundary: Callable[[], int | None] | None = None
        self.window_rows: int | None = None
        self.resized: tuple[int, ...] = ()
        self._bins: list[list[_Placed]] = []
        self._rows: list[Row] = []
        self._emitted = 0
        self._window_start = feed.state()

    def restore(self, state: PackerState, shapes: list[RowShape] | None = None) -> None:
        """Replay the open window with the row shape it was drawn with; across each later seq_len change (a
        resume) the pieces of its rows not yet emitted are packed again, by the same rule, into rows of the new
        length (a piece longer than the new row is cut first), and those rows follow: every piece once."""
        unit_open, unit_offset, resized = state.unit_open, state.unit_offset, state.resized or ()
        self.window_rows = state.window_rows  # the open window's budget when it was drawn
        shapes = shapes or [self.shape]
        counts = [*resized, unit_offset]
        if len(counts) > len(shapes) or not unit_open and resized:
            raise ResumeError(
                f"lane {self.feed.lane_id}: field 'packer.resized' has {len(resized)} entries for {len(shapes) - 1} seq_len "
                "changes since its window was drawn; the checkpoint is damaged"
            )
        if len(shapes) - 1 > MAX_RESIZED:
            raise ResumeError(
                f"lane {self.feed.lane_id}: its best_fit window has stayed open across {len(shapes) - 1} seq_len "
                f"changes, more than the {MAX_RESIZED} a lane's state holds; resume from a later checkpoint"
            )
        counts += [0] * (len(shapes) - len(counts))
        current, self.shape = self.shape, shapes[0]
        self._window_start = self.feed.state()
        bins = self._pack_window()[0] if unit_open else []  # each row's pieces (re-packed at a seq_len change)
        for i, shape in enumerate(shapes):
            if i:
                self.shape = shape
                bins = self._pack(self._cut([p for b in bins[counts[i - 1] :] for p in b]))
            if counts[i] > len(bins) or (unit_open and counts[i] == len(bins) and i < len(shapes) - 1):
                raise ResumeError(
                    f"lane {self.feed.lane_id}: state does not match the data: the best-fit window has fewer rows; was the data changed?"
                )
        self.shape = current
        self._bins = bins
        self._rows = [self.shape.make_row([(p.tokens, p.piece) for p in b]) for b in bins]
        self._emitted = counts[-1]
        self.resized = tuple(counts[:-1]) if unit_open else ()

    def unit(self) -> tuple[FeedState, PackerState]:
        if self._emitted == len(self._rows):
            return self.feed.state(), CLOSED
        return self._window_start, PackerState(True, self._emitted, self.window_rows, self.resized or None)

    def next_row(self) -> Row:
        while self._emitted == len(self._rows):
            self._window_start = self.feed.state()
            self.window_rows = self.boundary() if self.boundary is not None and self.per_step else None
            self.resized = ()
            self._bins, documents = self._pack_window()
            self._rows = [self.shape.make_row([(p.tokens, p.piece) for p in b]) for b in self._bins]
            self._emitted = 0
            if not documents:
                raise LaneExhausted
            # A window of one-token documents (no pair under labels = "document") has no row: next window.
        row = self._rows[self._emitted]
        if self.feed.leaving_out:  # a window drawn before exclude_from_step (or a keep change) may hold such documents
            kept = [p for p in self._bins[self._emitted] if not self.feed.dropped(*document_id(p.piece))]
            if len(kept) < len(self._bins[self._emitted]):
                row = self.shape.make_row([(p.tokens, p.piece) for p in kept])  # padding in their place
        self._emitted += 1
        return row

    def _pack_window(self) -> tuple[list[list[_Placed]], int]:
        """The rows (each its pieces) of the next window of documents, and how many documents it read."""
        pieces: list[_Placed] = []
        documents = drawn = 0
        budget = None if self.window_rows is None else self.window_rows * self.shape.slots
        for _ in range(self.window_docs):
            if budget is not None and drawn >= budget:
                break  # the next segment's rows are drawn with its weights
            doc = self.feed.next_document()
            if doc is None:
                break
            documents += 1
            size = self.shape.piece_slots(doc)
            pieces.append(_Placed(doc.tokens, Piece(doc.source, doc.file, doc.row, doc.start, size), drawn))
            drawn += size
        return self._pack(self._cut(pieces)), documents

    def _cut(self, pieces: list[_Placed]) -> list[_Placed]:
        """Pieces longer than a row cut into row-sized chunks (each keeps where the mixer drew its slots)."""
        out = []
        for p in pieces:
            q = p.piece
            for start in range(0, q.length, self.shape.slots):
                n = min(self.shape.slots, q.length - start)
                out.append(
                    _Placed(p.tokens, Piece(q.source, q.file, q.row, q.doc_offset + start, n), p.arrival + start)
                )
        return out

    def _pack(self, pieces: list[_Placed]) -> list[list[_Placed]]:
        """Best-fit decreasing of pieces (each at most a row) into rows; in the mixer's order under per_step."""
        if self.groups is None:
            bins = self._best_fit(pieces, range(len(pieces)))
        else:  # homogeneous_rows: each group's pieces into rows of their own
            of = self.groups
            bins = [
                b
                for g in sorted(set(of))
                for b in self._best_fit(pieces, [i for i, p in enumerate(pieces) if of[p.piece.source] == g])
            ]
        if self.per_step:
            bins = _in_mixer_order(bins, [p.piece.length for p in pieces], [p.arrival for p in pieces])
        return [[pieces[i] for i in parts] for parts in bins]

    def _best_fit(self, pieces: list[_Placed], indices: Sequence[int]) -> list[list[int]]:
        """Best-fit decreasing of pieces[i] for i in `indices` into rows (each row its pieces, as indices)."""
        # Longest first; equal lengths keep arrival order (sorted() is stable).
        order = sorted(indices, key=lambda i: -pieces[i].piece.length)
        bins: list[list[int]] = []
        free: list[tuple[int, int]] = []  # sorted (free tokens, bin index)
        for i in order:
            n = pieces[i].piece.length
            at = bisect.bisect_left(free, (n, -1))
            if at < len(free):
                space, b = free.pop(at)
            else:
                space, b = self.shape.slots, len(bins)
                bins.append([])
            bins[b].append(i)
            if space - n > 0:
                bisect.insort(free, (space - n, b))
        return bins


@dataclass(frozen=True, slots=True)
class _Placed:
    """A piece of a best_fit window: its document's tokens, the piece, and the window's slots drawn before it
    (where the mixer put it)."""

    tokens: np.ndarray
    piece: Piece
    arrival: int


def _in_mixer_order(bins: list[list[int]], lengths: list[int], arrivals: list[int]) -> list[list[int]]:
    """The rows (pieces by index) ordered by where the mixer drew their slots: the mean draw position.

    Best-fit decreasing fills the first rows with the longest pieces (one source's, when sources differ in
    document length) and the last ones with the short pieces, so a window's rows emitted as placed hold one
    source for many steps. The mixer drew the window's slots in the weights' proportions all along; a row
    emitted at the mean position of its slots in that draw keeps each step close to the weights. The key is
    a quotient of exact integers (correctly rounded: the same order on every platform), ties by placement."""

    def centre(b: int) -> tuple[float, int]:
        twice_sum = sum((2 * arrivals[i] + lengths[i]) * lengths[i] for i in bins[b])
        return twice_sum / (2 * sum(lengths[i] for i in bins[b])), b

    return [bins[b] for b in sorted(range(len(bins)), key=centre)]


register_packer(WrapPacker)
register_packer(BestFitPacker)
