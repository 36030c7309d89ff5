"""Parquet: each row group is a block; only the footer is read at startup."""

from __future__ import annotations

import os
from functools import lru_cache

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

    def __init__(self, name: str, files: list[str], text_field: str, max_document_chars: int):
        self._row_group_starts: dict[str, list[int]] = {}
        super().__init__(name, files, text_field, max_document_chars)

    def _scan(self, path: str) -> FileBlocks:
        st = os.stat(path)
        try:
            meta = _open(path, st.st_mtime_ns).metadata
        except (pa.ArrowInvalid, OSError) as e:
            raise DataError(f"{path}: cannot read as Parquet ({e}); check the file or its format") from None
        names = meta.schema.names
        if self.text_field not in names:
            raise DataError(
                f"{path}: no column {self.text_field!r} (columns: {', '.join(names)}); "
                f"set text_field for source {self.name!r}"
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
            table = _open(f.path, f.mtime_ns).read_row_group(local_block, columns=[self.text_field])
        except (pa.ArrowInvalid, OSError) as e:
            raise DataError(f"{f.path}: cannot read row group {local_block} ({e})") from None
        column = table.column(0)
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            raise DataError(f"{f.path}: column {self.text_field!r} has type {column.type}, expected a string")
        first_row = self._row_group_starts[f.path][local_block]
        texts = column.to_pylist()
        for i, text in enumerate(texts):
            if text is None:
                raise DataError(
                    f"{f.path} row {first_row + i}: column {self.text_field!r} is null; "
                    "drop null rows from the file"
                )
            self.check_size(text, f"{f.path} row {first_row + i}")
        return BlockDocuments(f.path, texts, list(range(first_row, first_row + len(texts))))
