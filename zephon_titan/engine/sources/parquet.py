"""Parquet: each row group is a block; only the footer is read at startup.

A source may be pre-tokenized: `token_field` names a column of token-id lists, which is
used as is (no tokenization) with BOS/EOS added as configured.
"""

from __future__ import annotations

import os
from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from zephon_titan.errors import DataError
from zephon_titan.engine.sources.base import BlockDocuments, FileBlocks, Source


@lru_cache(maxsize=32)
def _open(path: str, mtime_ns: int) -> pq.ParquetFile:
    # mtime in the cache key: a file rewritten under the same path is re-opened.
    return pq.ParquetFile(path)


class ParquetSource(Source):
    format_name = "parquet"

    def __init__(self, name: str, files: list[str], text_field: str, max_document_chars: int, token_field: str = ""):
        self._row_group_starts: dict[str, list[int]] = {}
        self.token_field = token_field
        super().__init__(name, files, text_field, max_document_chars)

    @property
    def column(self) -> str:
        return self.token_field or self.text_field

    def describe(self) -> dict:
        return {**super().describe(), "token_field": self.token_field}

    def _scan(self, path: str) -> FileBlocks:
        st = os.stat(path)
        try:
            meta = _open(path, st.st_mtime_ns).metadata
        except (pa.ArrowInvalid, OSError) as e:
            raise DataError(f"{path}: cannot read as Parquet ({e}); check the file or its format") from None
        names = meta.schema.to_arrow_schema().names  # top-level columns (not list leaves)
        if self.column not in names:
            which = "token_field" if self.token_field else "text_field"
            raise DataError(
                f"{path}: no column {self.column!r} (columns: {', '.join(names)}); "
                f"set {which} for source {self.name!r}"
            )
        starts, total = [], 0
        for i in range(meta.num_row_groups):
            starts.append(total)
            total += meta.row_group(i).num_rows
        self._row_group_starts[path] = starts
        return FileBlocks(path, st.st_size, st.st_mtime_ns, meta.num_row_groups)

    def _read(self, file_index: int, local_block: int) -> BlockDocuments:
        f = self.files[file_index]
        try:
            table = _open(f.path, f.mtime_ns).read_row_group(local_block, columns=[self.column])
        except (pa.ArrowInvalid, OSError) as e:
            raise DataError(f"{f.path}: cannot read row group {local_block} ({e})") from None
        first_row = self._row_group_starts[f.path][local_block]
        column = table.column(0)
        if column.null_count:
            i = next(i for i, v in enumerate(column.is_null().to_pylist()) if v)
            raise DataError(
                f"{f.path} row {first_row + i}: column {self.column!r} is null; drop null rows from the file"
            )
        rows = list(range(first_row, first_row + len(column)))
        if self.token_field:
            return BlockDocuments(f.path, _token_lists(column, f.path, self.token_field), rows)
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            raise DataError(f"{f.path}: column {self.text_field!r} has type {column.type}, expected a string")
        texts = column.to_pylist()
        for i, text in enumerate(texts):
            self.check_size(text, f"{f.path} row {first_row + i}")
        return BlockDocuments(f.path, texts, rows)


def _token_lists(column: pa.ChunkedArray, path: str, name: str) -> list[np.ndarray]:
    """Each row's token ids as an int32 array, sliced from the column's flat values (no Python lists)."""
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)) or not pa.types.is_integer(
            column.type.value_type):
        raise DataError(f"{path}: column {name!r} has type {column.type}, expected lists of integer token ids")
    array = column.combine_chunks()
    offsets = array.offsets.to_numpy()
    values = array.flatten().to_numpy().astype(np.int32, copy=False)
    base = offsets[0]
    return [values[a - base : b - base] for a, b in zip(offsets[:-1], offsets[1:])]
