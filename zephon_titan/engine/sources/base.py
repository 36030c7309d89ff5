"""What every source format provides: a fixed list of blocks, and the documents of one block.

A block is the unit that is dealt to lanes (a Parquet row group, a byte range of a
JSONL file). Blocks are numbered 0..num_blocks-1 in (sorted file, position in file)
order, so the numbering is a pure function of the files.
"""

from __future__ import annotations

import glob
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass

from zephon_titan.errors import ConfigError, DataError


@dataclass(frozen=True, slots=True)
class BlockDocuments:
    """The documents of one block, in file order.

    `rows[i]` locates texts[i] inside `file`: the row number for Parquet, the byte
    offset of the line for JSONL (see each source's `row_unit`).
    """

    file: str
    texts: list
    """Document texts (str), or token-id arrays for a pre-tokenized source."""
    rows: list[int]


@dataclass(frozen=True, slots=True)
class FileBlocks:
    """One file's share of the block numbering."""

    path: str
    size: int
    mtime_ns: int
    num_blocks: int


class Source(ABC):
    """A named collection of files, cut into blocks."""

    row_unit: str = "row"

    def __init__(self, name: str, files: list[str], text_field: str, max_document_chars: int = 64 << 20):
        self.name = name
        self.text_field = text_field
        self.max_document_chars = max_document_chars
        self.files: list[FileBlocks] = [self._scan(path) for path in files]
        # first_block[i] is the global number of file i's first block.
        self._first_block: list[int] = []
        total = 0
        for f in self.files:
            self._first_block.append(total)
            total += f.num_blocks
        self.num_blocks = total

    @abstractmethod
    def _scan(self, path: str) -> FileBlocks:
        """Read just enough of `path` to know its block count (no document is read)."""

    @abstractmethod
    def _read(self, file_index: int, local_block: int) -> BlockDocuments:
        """Read the documents of block `local_block` of file `file_index`."""

    def read_block(self, block_id: int) -> BlockDocuments:
        if not 0 <= block_id < self.num_blocks:
            raise IndexError(f"source {self.name!r} has {self.num_blocks} blocks, asked for {block_id}")
        # Binary search over file starts: a source may have many files.
        lo, hi = 0, len(self._first_block) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._first_block[mid] <= block_id:
                lo = mid
            else:
                hi = mid - 1
        return self._read(lo, block_id - self._first_block[lo])

    def check_size(self, text: str, where: str) -> None:
        if len(text) > self.max_document_chars:
            raise DataError(
                f"{where}: a document of {len(text):,} characters is over [dataloader] max_document_chars = "
                f"{self.max_document_chars:,} (tokenizing it at once needs ~10x its size in memory); "
                "raise the limit if you mean it, or split the document"
            )

    def describe(self) -> dict:
        """Everything about the files that the row stream depends on (for the fingerprint)."""
        return {
            "format": self.format_name,
            "text_field": self.text_field,
            "num_blocks": self.num_blocks,
            "files": [[f.path, f.size, f.mtime_ns, f.num_blocks] for f in self.files],
        }

    @property
    @abstractmethod
    def format_name(self) -> str: ...


def expand_paths(source_name: str, patterns: list[str], base_dir: str | None) -> list[str]:
    """Expand globs (relative to base_dir) into a sorted, de-duplicated file list.

    Sorting makes the block numbering independent of directory listing order.
    """
    files: set[str] = set()
    for pattern in patterns:
        full = pattern if os.path.isabs(pattern) or base_dir is None else os.path.join(base_dir, pattern)
        matches = [m for m in glob.glob(full, recursive=True) if os.path.isfile(m)]
        if not matches:
            raise ConfigError(
                f"source {source_name!r}: path {pattern!r} matches no file"
                + (f" (looked in {base_dir})" if base_dir and not os.path.isabs(pattern) else "")
                + "; fix the path or remove it from [dataloader.sources."
                + f"{source_name}] paths"
            )
        files.update(os.path.normpath(m) for m in matches)
    return sorted(files)
