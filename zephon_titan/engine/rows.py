"""A row: documents cut into (input, label) slots, with positions and padding; what a step's rows hold.

Labels (`[dataloader] labels`). `document` (TorchTitan's rule, the default): a
document of n tokens is n - 1 (input, label) pairs, tokens shifted by one inside
the document, so its last token never predicts the next document's first; a row
is seq_len pairs. `stream`: the packed token stream is shifted instead; a row
holds seq_len + 1 tokens, inputs = row[:-1] and labels = row[1:], so document
boundaries are targets too. Either way `wrap` packing places every slot in
exactly one row and drops none.

Positions restart at 0 at every piece of a document in a row: at each document
start, where a document resumes after other sources' pieces (mixing.py), and at
the start of a row that continues a document from the previous row. The continuation thus becomes its own attention block (it could
not see the previous row anyway) and positions stay below seq_len, inside the
RoPE cache; TorchTitan's block-causal mask cuts documents where positions return
to 0. Padding (best_fit, or the last row of a finite lane) uses the pad id,
positions 0, 1, ... as one block, and label -100.

The layout stands apart from the packers (packing.py), which only choose which pieces go into a row: every
packer's rows are made here, and the ledger, digests, eval set and tools read rows without knowing the packer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from zephon_titan.engine.buffers import lasting_array
from zephon_titan.engine.chat import MASKED
from zephon_titan.engine.document_counts import count_documents
from zephon_titan.engine.feed import Document
from zephon_titan.engine.spec import EngineSpec

IGNORE_INDEX = -100
_ROW_DTYPE = np.dtype("<i4")  # fixed byte order: row bytes (and hashes) are platform-independent


class Piece(NamedTuple):
    """A slice of one document placed in a row (for tracing rows back to files); `doc_offset` counts
    from the document's start. A named tuple, not a frozen dataclass: one per document of every row, and on short
    documents the dataclass's checked __init__ was a few per cent of a lane's time (issue 47)."""

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
    """Padding slots among the row's slots (see RowShape)."""
    documents: tuple[int, ...] | None = None
    """What the lane's feed did with documents since its previous row (engine/document_counts.py; set by the lane;
    never part of the row's bytes)."""
    targets: tuple[int, ...] | None = None
    """Per piece, its trained targets (labels other than -100) where some are not (chat sources); None: every
    slot of every piece is a trained target."""

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


def count_targets(rows: Iterable[Row], num_sources: int) -> list[int]:
    """Trained targets per source over `rows` (labels other than -100; padding has none)."""
    counts = [0] * num_sources
    for row in rows:
        lengths = row.targets if row.targets is not None else (p.length for p in row.pieces)
        for piece, n in zip(row.pieces, lengths):
            counts[piece.source] += n
    return counts


def step_tally(rows: Iterable[Row], num_sources: int) -> list[int]:
    """What the ledger records of rows: their tally(), their documents' counts (document_counts.py), then their
    trained targets per source."""
    rows = list(rows)
    return tally(rows, num_sources) + count_documents(rows, num_sources) + count_targets(rows, num_sources)


@dataclass(frozen=True, slots=True)
class RowShape:
    """How a row is cut from documents: `slots` per row, each one (input, label) pair or stream token."""

    slots: int
    within_document: bool
    pad_id: int
    masked: bool = False
    """Some source's tokens carry chat.MASKED (chat sources): those targets get label -100."""

    @classmethod
    def of(cls, spec: EngineSpec, seq_len: int | None = None) -> RowShape:
        """Rows of the spec's seq_len, or of `seq_len` (an earlier era's: spec.eras)."""
        within = spec.config.labels == "document"
        n = spec.seq_len if seq_len is None else seq_len
        masked = any(s.chat is not None for s in spec.sources)
        return cls(n if within else n + 1, within, spec.pad_id, masked)

    def piece_slots(self, doc: Document) -> int:
        """Slots of a piece tokens[start:end] of a document: the pairs whose input is in the piece
        (the last token of a document has no pair), or its tokens."""
        if self.within_document:
            return max(min(doc.stop, len(doc.tokens) - 1) - doc.start, 0)
        return doc.stop - doc.start

    def make_row(self, parts: list[tuple[np.ndarray, Piece]]) -> Row:
        """A row from pieces (each a document's tokens and the slots of it placed here), padding the tail."""
        used = sum(p.length for _, p in parts)
        padding = self.slots - used
        # The row's arrays are views of one buffer, and positions are slices of a shared ramp: one allocation
        # per row, not three plus one per piece, and outside the C heap (buffers.py): at thousands of lanes a
        # step's rows are thousands of buffers, held ahead and freed together (issue 28).
        inputs, labels, positions = lasting_array(3 * self.slots, _ROW_DTYPE).reshape(3, self.slots)
        ramp = _ramp(self.slots)
        at = used
        if len(parts) > 2:  # one copy call per array over the pieces' views, not one per piece (issue 47)
            np.concatenate(
                [t[p.doc_offset : p.doc_offset + p.length] for t, p in parts], out=inputs[:at], casting="unsafe"
            )
            if self.within_document:
                labels_of = [t[p.doc_offset + 1 : p.doc_offset + p.length + 1] for t, p in parts]
                np.concatenate(labels_of, out=labels[:at], casting="unsafe")
            np.concatenate([ramp[: p.length] for _, p in parts], out=positions[:at])
        else:
            at = 0
            for tokens, p in parts:
                inputs[at : at + p.length] = tokens[p.doc_offset : p.doc_offset + p.length]
                if self.within_document:
                    labels[at : at + p.length] = tokens[p.doc_offset + 1 : p.doc_offset + p.length + 1]
                positions[at : at + p.length] = ramp[: p.length]
                at += p.length
        if padding:  # (a full row has no tail: writing its empty one cost a tenth of a long-document row)
            inputs[at:] = self.pad_id
            positions[at:] = ramp[:padding]
        pieces = tuple([p for _, p in parts])
        targets = None
        if self.masked:  # a chat document's untrained targets: label -100, and the bit off its inputs
            untrained = (labels & MASKED) != 0
            untrained[at:] = True
            labels[untrained] = IGNORE_INDEX
            np.bitwise_and(inputs, ~MASKED, out=inputs)
            ends = np.cumsum([p.length for p in pieces])
            trained = np.concatenate([[0], np.cumsum(~untrained)[ends - 1]]) if pieces else np.zeros(1, np.int64)
            targets = tuple(int(n) for n in np.diff(trained))
        if self.within_document:
            if padding:
                labels[at:] = IGNORE_INDEX
            return Row(inputs, labels, positions, pieces, padding, targets=targets)
        # The stream rule: the row's seq_len + 1 tokens, shifted by one.
        labels[:-1] = inputs[1:]
        if padding:
            labels[max(used - 1, 0) : -1] = IGNORE_INDEX
        return Row(inputs[:-1], labels[:-1], positions[:-1], pieces, padding)


@lru_cache(maxsize=8)
def _ramp(n: int) -> np.ndarray:
    """0, 1, ..., n - 1 (read-only): every piece's positions are a prefix of it."""
    ramp = np.arange(n, dtype=_ROW_DTYPE)
    ramp.flags.writeable = False
    return ramp


def document_id(doc: Document | Piece) -> tuple[int, str, int]:
    """A document's (source, file, row): the same for each of its pieces."""
    return doc.source, doc.file, doc.row
