"""What `zephon-titan init` reads of a format's files: the hook a `Format` declares (`Format.init`) and the
values it returns. A text format samples one file at a time (init then picks the text column and tokenizes the
samples); a token format counts a whole source's ids itself and names the source keys that say how to read them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from zephon_titan.engine.sources.base import Source
from zephon_titan.engine.sources.columns import is_text_type
from zephon_titan.engine.sources.storage import FileStat

SAMPLE_FILES = 8  # files read per source, spread over its sorted file list
SAMPLE_ROWS = 64  # documents read per sampled file


@dataclass
class Sample:
    """What one sampled file showed: its string fields' values, and how many documents it holds."""

    texts: dict[str, list[str]]  # field -> its values in the sampled documents (string fields only)
    other_fields: dict[str, str]  # field -> type, for fields that are not strings
    documents: int  # documents read
    file_documents: float  # documents in the whole file (exact, or estimated from the bytes read)


@dataclass
class TokenCount:
    """A token source counted: its documents and ids (without the BOS/EOS the job adds), and the source keys
    that say how to read the ids: key -> (value, why), written to the job with their reasons."""

    documents: float
    tokens: float
    settings: dict[str, tuple[Any, str]]


OpenWith = Callable[[dict[str, Any]], Source]
"""(source keys beyond name, paths and format) -> the source opened as the trainer opens it."""


@dataclass(frozen=True)
class InitSampling:
    """How `zephon-titan init` reads a source of a format: exactly one of `sample_file` (text) and `count_tokens`
    (token ids)."""

    title: str
    """The format's name in init's messages ("JSONL")."""

    endings: tuple[str, ...]
    """The file endings init's messages name (the usual ones of the format's `extensions`)."""

    sample_file: Callable[[FileStat], Sample] | None = None
    """A text format: one file's first documents (string fields) and its document count."""

    count_tokens: Callable[[str, Any, OpenWith], TokenCount] | None = None
    """A token format: (the source's paths, for messages; the job's tokenizer; OpenWith) -> TokenCount."""

    def __post_init__(self) -> None:
        if (self.sample_file is None) == (self.count_tokens is None):
            raise ValueError(f"{self.title}: init reads a format by sample_file or by count_tokens (one of them)")


def string_columns(schema: pa.Schema) -> tuple[list[str], dict[str, str]]:
    """(the string columns, {other column: its type}); a name two columns share is no column init can choose."""
    twice = {name for name in schema.names if schema.names.count(name) > 1}
    strings = [f.name for f in schema if is_text_type(f.type) and f.name not in twice]
    others = {f.name: str(f.type) for f in schema if f.name not in strings}
    return strings, {**others, **{name: "the name of more than one column" for name in twice}}


def columns_sample(first_rows: pa.Table | pa.RecordBatch, others: dict[str, str], total: int) -> Sample:
    """A columnar file's Sample: `first_rows` (its string columns only) of `total` rows."""
    texts = {
        name: [v for v in first_rows.column(name).to_pylist() if v is not None] for name in first_rows.schema.names
    }
    return Sample(texts, others, min(total, SAMPLE_ROWS), total)
