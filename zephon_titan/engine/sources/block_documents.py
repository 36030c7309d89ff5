"""A block's documents, as a format reads them and the lanes of a process share them.

`BlockDocuments` is immutable: a block read once is held (weakly) by its Source and shared by every lane whose
window meets it. Its texts are `LazyTexts`, each document read or decoded when it is due and not kept, so a lane's
window costs where its documents are, not their bytes. It stands apart from base.py (the Source: block numbering,
reading, caching) because every format builds these and every reader reads them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np
import pyarrow as pa


class LazyTexts(Sequence[str]):
    """A block's documents, each read (or decoded) when it is asked for and not kept.

    A lane holds a whole shuffle window of blocks, of every source, from its first row on; holding their
    raw bytes (or parsed texts) cost megabytes per lane, so a run with thousands of lanes could not fit
    (issue 28). A window now holds only where each document is (`load(i)` reads it: a JSONL line is read
    from the file and parsed, a Parquet row taken from the row group's Arrow column); the lane tokenizes
    a few documents at a time as they come due. A bad line raises its DataError (file, line, byte)
    when its document is reached, as `zephon-titan validate` reaches every document. Nothing is cached:
    the object is immutable, so lanes of a process share it (Source.read_block)."""

    __slots__ = ("_n", "_load", "_load_many")

    def __init__(self, n: int, load: Callable[[int], str], load_many: Callable[[list[int]], list[str]] | None = None):
        """`load_many`: several documents at once, as `load` reads each (a format's faster loop; default: `load`)."""
        self._n = n
        self._load = load
        self._load_many = load_many

    def many(self, indices: list[int]) -> list[str]:
        """Documents `indices` (each in range), as [self[i] for i in indices] reads them."""
        if self._load_many is not None:
            return self._load_many(indices)
        return [self._load(i) for i in indices]

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(f"document {i} of a block of {self._n}")
        return self._load(i)

    def __iter__(self) -> Iterator[str]:
        return (self._load(i) for i in range(self._n))

    def __eq__(self, other: object) -> bool:  # equal to the list of the same texts
        if not isinstance(other, (list, LazyTexts)):
            return NotImplemented
        return list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # compared by value: not hashable


@dataclass(frozen=True, slots=True, weakref_slot=True)
class BlockDocuments:
    """The documents of one block, in file order (immutable: lanes of a process share it).

    `rows[i]` locates texts[i] inside `file`: the row number for Parquet, the byte
    offset of the line for JSONL (see each source's `row_unit`).
    """

    file: str
    texts: Sequence[str] | Sequence[np.ndarray]
    """Document texts (str; LazyTexts, read when asked for), or token-id arrays for a pre-tokenized source."""
    rows: Sequence[int]
    """A list (JSONL's byte offsets) or a range (row numbers)."""
    fields: pa.Table | None = None
    """As a format reads it, when the source has a pipeline: the columns it reads (Source.pipeline_fields), one
    row per document. Source._fill turns them into `keep` and `repeat` and lets them go."""
    keep: np.ndarray | None = None
    """With a pipeline: per document, whether its keep condition holds (engine/pipeline.py)."""
    repeat: np.ndarray | None = None
    """With a pipeline: per document, its repeat value."""
    eras: tuple[tuple[np.ndarray, np.ndarray], ...] = ()
    """With a pipeline: keep and repeat per document in each era of the run (the last is `keep`, `repeat`)."""
    records: Callable[[int], dict[str, Any]] | None = None
    """As a format reads it, when the source has transforms: document i's record (all its columns or fields)."""
    era_texts: tuple[Sequence[Any], ...] = ()
    """Where the source's transforms change by pipeline era: its texts in each era (`texts` is the last's)."""
