"""Parquet: each row group is a block; only the footer is read at startup.

A source may be pre-tokenized: `token_field` names a column of token-id lists, which is
used as is (no tokenization) with BOS/EOS added as configured.
"""

from __future__ import annotations

import threading
from functools import lru_cache
from itertools import accumulate
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from zephon_titan.config import SourceConfig
from zephon_titan.engine.sources import storage
from zephon_titan.engine.sources.base import FileBlocks, Listing, Source
from zephon_titan.engine.sources.block_documents import BlockDocuments
from zephon_titan.engine.sources.columns import column_documents, with_columns
from zephon_titan.engine.sources.formats import Format
from zephon_titan.engine.sources.init_sample import SAMPLE_ROWS, InitSampling, Sample, columns_sample, string_columns
from zephon_titan.engine.sources.storage import FileStat, StorageOptions
from zephon_titan.errors import DataError


@lru_cache(maxsize=32)
def _open(
    path: str, size: int, mtime_ns: int, options: StorageOptions
) -> tuple[pa.NativeFile, pq.ParquetFile, threading.Lock, tuple[int, ...], tuple[int, ...], list[str]]:
    """The file handle, the file, a lock for reading it, its rows per row group, the first row of each
    row group and its top-level column names. The lock: lanes of a process may read row groups of one
    file from several threads.

    Size and mtime are in the cache key: a file rewritten under the same path is re-opened.
    Opening reads the footer (one range request on object storage); row groups are then read
    one by one with range requests of their column chunks.
    """
    handle = storage.open_input_file(path, (size, mtime_ns), options)
    opened = pq.ParquetFile(handle)
    meta = opened.metadata
    rows = tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
    names = meta.schema.to_arrow_schema().names  # top-level columns, not list leaves
    starts = tuple(accumulate(rows[:-1], initial=0))
    return handle, opened, threading.Lock(), rows, starts, names


class ParquetSource(Source):
    format_name = "parquet"
    decodes_in_threads = True  # pyarrow decodes a row group without the GIL

    def __init__(
        self,
        name: str,
        files: Listing,
        text_field: str,
        max_document_chars: int,
        token_field: str = "",
        storage_options: StorageOptions = StorageOptions(),
    ):
        self.token_field = token_field
        super().__init__(name, files, text_field, max_document_chars, storage_options)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "token_field": self.token_field}

    def _scan(self, file: FileStat) -> FileBlocks:
        try:
            _, _, _, rows, _, names = _open(file.path, file.size, file.mtime_ns, self.storage_options)
        except (pa.ArrowInvalid, OSError) as e:
            raise DataError(f"{file.path}: cannot read as Parquet ({_said(e)}); check the file or its format") from None
        self.check_column(file.path, names)
        return FileBlocks(file.path, file.size, file.mtime_ns, len(rows), rows)

    def _open(self, f: FileBlocks) -> tuple[pq.ParquetFile, threading.Lock, tuple[int, ...]]:
        """Open a listed (or indexed) file, checking that its row groups are still those listed;
        returns the file, its read lock and the first row of each row group."""
        try:
            handle, opened, lock, rows, starts, names = _open(f.path, f.size, f.mtime_ns, self.storage_options)
        except (pa.ArrowInvalid, OSError) as e:
            raise self.changed_file(f, f"it cannot be read as Parquet any more ({_said(e)})") from None
        self.check_unchanged(f, handle)
        if rows != f.block_rows:
            raise self.changed_file(f, f"it now has {len(rows)} row groups ({sum(rows):,} rows)")
        self.check_column(f.path, names)
        return opened, lock, starts

    def _read(self, file_index: int, local_block: int) -> BlockDocuments:
        f = self.files[file_index]
        opened, lock, starts = self._open(f)
        fields = self.pipeline_fields
        for name in fields:
            self.check_field(f.path, name, opened.schema_arrow.names)
        try:
            with lock:
                columns = None if self.reads_records else list(dict.fromkeys([self.column, *fields]))
                table = opened.read_row_group(local_block, columns=columns)  # a transform takes the whole record
        except (pa.ArrowException, OSError) as e:  # a damaged page: ArrowInvalid, or another Arrow error
            raise DataError(
                f"{f.path}: cannot read row group {local_block} ({_said(e)}); the file is damaged: restore or rewrite it"
            ) from None
        # Decoding a row group allocates buffers about its size that it frees again; the allocator keeps them
        # for this thread unless asked. Row groups decoded in parallel threads (source_reader.py) would leave one
        # such set per thread, so each gives them back (measured: ~150-250 MB less peak at 1,024 lanes).
        pa.default_memory_pool().release_unused()
        block = column_documents(self, table.column(self.column), f.path, starts[local_block])
        return with_columns(block, table, fields, self.reads_records)


def _check_record(f: FileBlocks, source: SourceConfig) -> str:
    if f.num_blocks != len(f.block_rows):
        return f"num_blocks is {f.num_blocks}, but block_rows lists {len(f.block_rows)} row groups"
    return ""


def _init_sample(file: FileStat) -> Sample:
    """The string columns of the first SAMPLE_ROWS rows; the rows from the footer. A handle of its own (a shared,
    cached one would be left closed for the next reader in this process)."""
    with storage.open_own_file(file.path) as handle:
        parquet = pq.ParquetFile(handle)
        strings, others = string_columns(parquet.schema_arrow)
        rows = parquet.metadata.num_rows
        batches = parquet.iter_batches(batch_size=SAMPLE_ROWS, columns=strings)
        first = next(batches) if strings and rows else pa.table({})
        return columns_sample(first, others, rows)


PARQUET = Format(
    fields=True,
    name="parquet",
    extensions=(".parquet", ".pq"),
    open=lambda source, files, max_chars, options: ParquetSource(
        source.name, files, source.text_field, max_chars, source.token_field, options
    ),
    check_record=_check_record,
    token_field=True,
    init=InitSampling("Parquet", (".parquet",), sample_file=_init_sample),
)


def _said(error: BaseException) -> str:
    """Arrow's message on one line (a thrift error spans three)."""
    return " ".join(str(error).split())
