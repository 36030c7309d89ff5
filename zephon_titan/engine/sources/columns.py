"""Documents from one Arrow column (Parquet row groups, Lance fragments): texts, or token-id lists."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from zephon_titan.engine.sources.base import BlockDocuments, Source
from zephon_titan.errors import DataError


def column_documents(source: Source, column: pa.ChunkedArray, path: str, first_row: int) -> BlockDocuments:
    """`column` holds rows first_row.. of `path` in `source.column` (its text_field or token_field)."""
    if column.null_count:
        i = next(i for i, v in enumerate(column.is_null().to_pylist()) if v)
        raise DataError(f"{path} row {first_row + i}: column {source.column!r} is null; drop null rows from the file")
    rows = list(range(first_row, first_row + len(column)))
    if source.token_field:
        return BlockDocuments(path, _token_lists(column, path, source.token_field), rows)
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        raise DataError(f"{path}: column {source.text_field!r} has type {column.type}, expected a string")
    texts = column.to_pylist()
    for i, text in enumerate(texts):
        source.check_size(text, f"{path} row {first_row + i}")
    return BlockDocuments(path, texts, rows)


def _token_lists(column: pa.ChunkedArray, path: str, name: str) -> list[np.ndarray]:
    """Each row's token ids as an int32 array, sliced from the column's flat values (no Python lists)."""
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)) or not pa.types.is_integer(
        column.type.value_type
    ):
        raise DataError(f"{path}: column {name!r} has type {column.type}, expected lists of integer token ids")
    array = column.combine_chunks()
    offsets = array.offsets.to_numpy()
    values = array.flatten().to_numpy().astype(np.int32, copy=False)
    base = offsets[0]
    return [values[a - base : b - base] for a, b in zip(offsets[:-1], offsets[1:])]
