"""Megatron indexed datasets: `<prefix>.bin` (the tokens) beside `<prefix>.idx` (where each document is),
the format megatron-core's `IndexedDatasetBuilder` writes (`tools/preprocess_data.py`). A source lists the
`.bin` files; each one's `.idx` is the same name ending in `.idx`.

The `.idx` (all little-endian), as megatron-core's `_IndexWriter` writes it:

    b"MMIDIDX\\x00\\x00"       9 bytes
    version                 u64, 1
    dtype code              u8 (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 8 uint16; 6, 7 are floats)
    S: sequences            u64
    D: document_indices     u64 (documents + 1)
    sequence lengths        S x i32 (tokens)
    sequence pointers       S x i64 (byte offset in the .bin)
    document_indices        D x i64 (document d is sequences [di[d], di[d + 1]), di[0] = 0, di[-1] = S)

A document is its sequences' tokens, in order (one sequence per document unless the data was split into
sentences). Block k of a file is documents [k * block_rows, (k + 1) * block_rows): startup reads the
header and four numbers of each `.idx` (sizes checked against the `.bin`); a block reads its slice of the
three arrays and one byte range of the `.bin`, never a whole file. The tokens are the document: no
tokenization; BOS/EOS are added as configured, except where a document already has them
(`Source.specials_in_tokens`). Rows are document numbers in the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa

from zephon_titan.config import SourceConfig
from zephon_titan.engine.sources import storage
from zephon_titan.engine.sources.base import FileBlocks, Listing, Source
from zephon_titan.engine.sources.block_documents import BlockDocuments
from zephon_titan.engine.sources.columns import TokenLists
from zephon_titan.engine.sources.formats import Format
from zephon_titan.engine.sources.init_sample import InitSampling, OpenWith, TokenCount
from zephon_titan.engine.sources.storage import FileStat, StorageOptions
from zephon_titan.errors import DataError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequences, document_indices
DTYPES: dict[int, np.dtype[Any]] = {
    code: np.dtype(name).newbyteorder("<")
    for code, name in {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 8: "uint16"}.items()
}
FLOAT_CODES = {6: "float64", 7: "float32"}
_REWRITE = "rewrite the pair with megatron-core's IndexedDatasetBuilder (tools/preprocess_data.py)"


def index_path(bin_path: str) -> str:
    return bin_path[: -len(".bin")] + ".idx"


@dataclass(frozen=True)
class IdxLayout:
    """Where the arrays of one `.idx` are, from its header."""

    path: str
    dtype: np.dtype[Any]
    sequences: int
    documents: int

    @property
    def lengths_at(self) -> int:
        return HEADER.size

    @property
    def pointers_at(self) -> int:
        return HEADER.size + 4 * self.sequences

    @property
    def doc_indices_at(self) -> int:
        return HEADER.size + 12 * self.sequences

    @property
    def size(self) -> int:
        return self.doc_indices_at + 8 * (self.documents + 1)


def _array(handle: pa.NativeFile, path: str, start: int, count: int, dtype: str, what: str) -> np.ndarray:
    size = np.dtype(dtype).itemsize
    return np.frombuffer(storage.read_range(handle, path, start, count * size, what), dtype=dtype)


def read_layout(handle: pa.NativeFile, path: str, size: int) -> IdxLayout:
    """The header of an `.idx` of `size` bytes, checked (magic, version, dtype, the size it implies)."""
    head = storage.read_range(handle, path, 0, min(size, HEADER.size), "the header")
    if len(head) < HEADER.size or head[: len(MAGIC)] != MAGIC:
        raise DataError(f"{path}: not a Megatron index (no MMIDIDX header); {_REWRITE}")
    _, version, code, sequences, doc_indices = HEADER.unpack(head)
    if version != VERSION:
        raise DataError(f"{path}: index version {version}, zephon reads version {VERSION}; {_REWRITE}")
    if code not in DTYPES:
        kind = f"{FLOAT_CODES[code]}, not token ids" if code in FLOAT_CODES else "unknown"
        raise DataError(f"{path}: dtype code {code} ({kind}); token files hold integer ids: {_REWRITE}")
    if doc_indices < 1:
        raise DataError(f"{path}: the header lists no document_indices (at least [0]); {_REWRITE}")
    layout = IdxLayout(path, DTYPES[code], sequences, doc_indices - 1)
    if sequences and size == layout.size + sequences:
        raise DataError(f"{path}: a multimodal index (sequence modes), not a token dataset; zephon reads text")
    if size != layout.size:
        raise DataError(
            f"{path}: {size:,} bytes, but its header ({sequences:,} sequences, {doc_indices - 1:,} documents) "
            f"makes {layout.size:,}; {_REWRITE}"
        )
    return layout


@lru_cache(maxsize=64)
def _opened_index(path: str, size: int, mtime_ns: int, options: StorageOptions) -> tuple[pa.NativeFile, IdxLayout]:
    """An `.idx` kept open with its checked header (size and mtime in the key: a rewritten file is read anew)."""
    handle = storage.open_input_file(path, (size, mtime_ns), options)
    return handle, read_layout(handle, path, size)


class MegatronSource(Source):
    format_name = "megatron"
    row_unit = "document"
    specials_in_tokens = True

    def __init__(
        self,
        name: str,
        files: Listing,
        block_rows: int,
        storage_options: StorageOptions = StorageOptions(),
    ):
        self.block_rows = block_rows
        super().__init__(name, files, "", storage_options=storage_options)

    def describe(self) -> dict[str, Any]:
        # Each .idx says where the documents are: its size is part of the layout, its mtime of `mtimes`.
        indexes = [list(f.block_rows[:2]) for f in self.files]
        return {**super().describe(), "block_rows": self.block_rows, "indexes": indexes}

    def fingerprint(self) -> dict[str, str]:
        out = super().fingerprint()
        both = json.dumps([out["mtimes"], [f.block_rows[2] for f in self.files]]).encode()
        out["mtimes"] = hashlib.sha256(both).hexdigest()[:16]
        return out

    def token_count(self) -> int:
        """The tokens of all files (from their sizes and each index's dtype; no document read)."""
        return sum(f.size // self._index(f)[1].dtype.itemsize for f in self.files)

    def _index(self, f: FileBlocks) -> tuple[pa.NativeFile, IdxLayout]:
        _, idx_size, idx_mtime_ns = f.block_rows
        return _opened_index(index_path(f.path), idx_size, idx_mtime_ns, self.storage_options)

    def _scan(self, file: FileStat) -> FileBlocks:
        """Checks the `.idx` against the `.bin` with four numbers: the documents span sequences [0, S), and
        the sequences bytes [0, last pointer + last length), which must be the `.bin`'s size."""
        idx = index_path(file.path)
        listed = storage.expand(idx, self.storage_options) if storage.is_uri(idx) else _local_stat(idx)
        if not listed:
            raise DataError(f"{file.path}: no index {idx} beside it; a Megatron dataset is <prefix>.bin + <prefix>.idx")
        stat = listed[0]
        handle, layout = _opened_index(idx, stat.size, stat.mtime_ns, self.storage_options)
        ends = _array(handle, idx, layout.doc_indices_at, 1, "<i8", "document_indices[0]")
        last = _array(handle, idx, layout.size - 8, 1, "<i8", "the last document_indices entry")
        if ends[0] != 0 or last[0] != layout.sequences:
            raise DataError(
                f"{idx}: document_indices run from {ends[0]} to {last[0]}, not 0 to its {layout.sequences:,} "
                f"sequences; {_REWRITE}"
            )
        end = 0
        if layout.sequences:
            length = _array(handle, idx, layout.pointers_at - 4, 1, "<i4", "the last sequence length")[0]
            first = _array(handle, idx, layout.pointers_at, 1, "<i8", "the first sequence pointer")[0]
            pointer = _array(handle, idx, layout.doc_indices_at - 8, 1, "<i8", "the last sequence pointer")[0]
            if first != 0:
                raise DataError(f"{idx}: the first sequence starts at byte {first:,} of the .bin, not 0; {_REWRITE}")
            end = int(pointer) + int(length) * layout.dtype.itemsize
        if end != file.size:
            raise DataError(
                f"{file.path}: {file.size:,} bytes, but its index {idx} says the tokens end at byte {end:,} "
                f"(a truncated .bin, or not this index's .bin); {_REWRITE}"
            )
        blocks = -(-layout.documents // self.block_rows)
        return FileBlocks(file.path, file.size, file.mtime_ns, blocks, (layout.documents, stat.size, stat.mtime_ns))

    def _read(self, file_index: int, local_block: int) -> BlockDocuments:
        f = self.files[file_index]
        idx, (documents, idx_size, idx_mtime_ns) = index_path(f.path), f.block_rows
        handle, layout = self._index(f)
        size, mtime_ns = storage.current_version(idx, handle)
        if size != idx_size or (mtime_ns is not None and mtime_ns != idx_mtime_ns):
            raise self.changed_file(f, f"its index {idx} changed")
        first = local_block * self.block_rows
        stop = min(first + self.block_rows, documents)
        at = layout.doc_indices_at + 8 * first
        bounds = _array(handle, idx, at, stop - first + 1, "<i8", f"document_indices[{first}:{stop + 1}]")
        s0, s1 = int(bounds[0]), int(bounds[-1])
        if np.any(np.diff(bounds) < 0) or s0 < 0 or s1 > layout.sequences:
            raise DataError(f"{idx}: document_indices of documents {first}..{stop - 1} are out of order; {_REWRITE}")
        lengths = _array(handle, idx, layout.lengths_at + 4 * s0, s1 - s0, "<i4", "sequence lengths")
        pointers = _array(handle, idx, layout.pointers_at + 8 * s0, s1 - s0, "<i8", "sequence pointers")
        itemsize = layout.dtype.itemsize
        starts = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])  # token offsets in the block
        base = int(pointers[0]) if len(pointers) else 0
        if np.any(lengths < 0) or not np.array_equal(pointers, base + starts[:-1] * itemsize):
            raise DataError(
                f"{idx}: the sequences of documents {first}..{stop - 1} are not back to back in the .bin "
                f"(lengths and pointers disagree); {_REWRITE}"
            )
        end = base + int(starts[-1]) * itemsize
        if base < 0 or end > f.size:  # the .bin has its listed size (checked when read): the index is wrong
            raise DataError(
                f"{idx}: the sequences of documents {first}..{stop - 1} point to bytes {base:,}-{end:,}, outside "
                f"{f.path} ({f.size:,} bytes); {_REWRITE}"
            )
        tokens = self._tokens(f, base, int(starts[-1]), layout.dtype)
        return BlockDocuments(f.path, TokenLists(tokens, starts[bounds - s0]), range(first, stop))

    def _tokens(self, f: FileBlocks, start: int, count: int, dtype: np.dtype[Any]) -> np.ndarray:
        handle = storage.open_input_file(f.path, (f.size, f.mtime_ns), self.storage_options)
        self.check_unchanged(f, handle)
        data = storage.read_range(handle, f.path, start, count * dtype.itemsize, "tokens")
        return np.frombuffer(data, dtype=dtype)


def _local_stat(path: str) -> list[FileStat]:
    """The `.idx` of a local `.bin` (not a glob: its name may hold glob characters)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return []
    return [FileStat(path, st.st_size, st.st_mtime_ns)]


def _check_record(f: FileBlocks, source: SourceConfig) -> str:
    if len(f.block_rows) != 3:
        return "block_rows must be [documents, .idx size, .idx mtime_ns] for a Megatron dataset"
    expected = -(-f.block_rows[0] // source.block_rows)
    if f.num_blocks != expected:
        return (
            f"num_blocks is {f.num_blocks}, but {f.block_rows[0]:,} documents in blocks of "
            f"{source.block_rows:,} make {expected}"
        )
    return ""


def _init_count(where: str, tokenizer: Any, open_with: OpenWith) -> TokenCount:
    """Documents and tokens from the indexes (exact); no key beyond the paths."""
    source = open_with({})
    assert isinstance(source, MegatronSource)
    return TokenCount(sum(f.block_rows[0] for f in source.files), source.token_count(), {})


MEGATRON = Format(
    name="megatron",
    extensions=(".bin",),
    open=lambda source, files, max_chars, options: MegatronSource(source.name, files, source.block_rows, options),
    check_record=_check_record,
    index_keys=("block_rows",),
    init=InitSampling("Megatron", (".bin",), count_tokens=_init_count),
)
