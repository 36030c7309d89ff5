"""Documents from one Arrow column (Parquet row groups, Lance fragments): texts, or token-id lists."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from zephon_titan.engine.sources.base import Source
from zephon_titan.engine.sources.block_documents import BlockDocuments, LazyTexts
from zephon_titan.errors import DataError


def is_text_type(kind: pa.DataType) -> bool:
    """A column of strings: plain, large, or dictionary-encoded strings (Arrow writers keep a low-cardinality
    column so; its values are the same strings)."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind))


def column_documents(source: Source, column: pa.ChunkedArray, path: str, first_row: int) -> BlockDocuments:
    """`column` holds rows first_row.. of `path` in `source.column` (its text_field or token_field)."""
    if source.chat is not None:  # conversations come from the records (Source._conversations), any column type
        return BlockDocuments(path, LazyTexts(len(column), lambda i: ""), range(first_row, first_row + len(column)))
    if column.null_count:
        i = next(i for i, v in enumerate(column.is_null().to_pylist()) if v)
        raise DataError(f"{path} row {first_row + i}: column {source.column!r} is null; drop null rows from the file")
    rows = range(first_row, first_row + len(column))
    if source.token_field:
        return BlockDocuments(path, _token_lists(column, path, source.token_field), rows)
    if is_text_type(column.type) and pa.types.is_dictionary(column.type):  # the same strings, stored once each
        column = column.cast(column.type.value_type)
    if not is_text_type(column.type):
        raise DataError(f"{path}: column {source.text_field!r} has type {column.type}, expected a string")
    lengths = pc.utf8_length(column)
    if len(column) and pc.max(lengths).as_py() > source.max_document_chars:  # name the first one too long
        i = pc.index(pc.greater(lengths, source.max_document_chars), True).as_py()
        source.check_size(column[i].as_py(), f"{path} row {first_row + i}")

    # The column stays in Arrow's compact form (one buffer, no Python object per row): a row becomes a
    # Python string only when its document is due. A row group may be hundreds of MiB of text.
    def text(i: int) -> str:
        try:
            return column[i].as_py()  # type: ignore[no-any-return]
        except UnicodeDecodeError as e:  # Arrow does not check a file's strings; Python does, here
            raise DataError(
                f"{path} row {first_row + i}: column {source.text_field!r} is not valid UTF-8 (byte {e.start:,} of "
                "its text); re-encode the file's text as UTF-8"
            ) from None

    return BlockDocuments(path, LazyTexts(len(column), text), rows)


def with_columns(block: BlockDocuments, table: pa.Table, fields: list[str], records: bool) -> BlockDocuments:
    """The block with what its source's pipeline and transforms read from the row group's `table`."""
    if not fields and not records:
        return block
    return dataclasses.replace(
        block,
        fields=table.select(fields) if fields else None,
        records=(lambda i: table.slice(i, 1).to_pylist()[0]) if records else None,
    )


def _token_lists(column: pa.ChunkedArray, path: str, name: str) -> TokenLists:
    """Each row's token ids as an int32 array, sliced from the column's flat values (no Python lists)."""
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)) or not pa.types.is_integer(
        column.type.value_type
    ):
        raise DataError(f"{path}: column {name!r} has type {column.type}, expected lists of integer token ids")
    array = column.combine_chunks()
    offsets = array.offsets.to_numpy()
    values = array.flatten().to_numpy()
    if values.dtype.itemsize >= 4 and values.dtype != np.int32 and values.size:  # could hold ids past int32
        limits = np.iinfo(np.int32)
        wide = np.flatnonzero((values < limits.min) | (values > limits.max))
        if wide.size:  # int32 would wrap such an id to another, valid-looking one (the lanes check the rest)
            row = int(np.searchsorted(offsets - offsets[0], wide[0], side="right")) - 1
            raise DataError(
                f"{path} row {row}: column {name!r} holds token id {int(values[wide[0]]):,}, which no tokenizer's "
                "vocabulary holds; the column must hold ids of this run's tokenizer"
            )
    return TokenLists(values.astype(np.int32, copy=False), offsets - offsets[0])


class TokenLists(Sequence[np.ndarray]):
    """Row i's token ids, a view values[offsets[i]:offsets[i + 1]] made when asked for (not one array
    object per row of a row group held for the whole window)."""

    def __init__(self, values: np.ndarray, offsets: np.ndarray):
        self._values, self._offsets = values, offsets

    def __len__(self) -> int:
        return len(self._offsets) - 1

    @overload
    def __getitem__(self, i: int) -> np.ndarray: ...
    @overload
    def __getitem__(self, i: slice) -> list[np.ndarray]: ...
    def __getitem__(self, i: int | slice) -> np.ndarray | list[np.ndarray]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"row {i} of a block of {len(self)}")
        return self._values[self._offsets[i] : self._offsets[i + 1]]
