"""Lance datasets (optional: `pip install 'zephon-titan[lance]'`, which brings `pylance`).

A dataset is opened at the version it has when the source is listed (or indexed), and that
version is part of every block's name, so a dataset appended to or rewritten during a run is
a different stream: a resume names the change instead of reading other rows. Each fragment
is cut into blocks of `block_rows` rows (fragments are often a million rows: too much for
one lane's block); a block is read with one projected, offset/limit scan of its fragment.

Blocks are named `<dataset>?version=<v>&fragment=<id>`; rows are row numbers in the fragment.
"""

from __future__ import annotations

from functools import lru_cache
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import parse_qs

import pyarrow as pa

from zephon_titan.config import SourceConfig
from zephon_titan.engine.sources.base import FileBlocks, Listing, Source
from zephon_titan.engine.sources.block_documents import BlockDocuments
from zephon_titan.engine.sources.columns import column_documents, with_columns
from zephon_titan.engine.sources.formats import Format
from zephon_titan.engine.sources.guards import refuse_credentials_in_path
from zephon_titan.engine.sources.init_sample import SAMPLE_ROWS, InitSampling, Sample, columns_sample, string_columns
from zephon_titan.engine.sources.storage import FileStat, StorageOptions, is_uri, s3_endpoint
from zephon_titan.errors import ConfigError, DataError

if TYPE_CHECKING:
    from lance import LanceDataset


def _lance() -> ModuleType:
    try:
        import lance
    except ImportError as e:  # keep the cause: pylance may be installed but broken
        raise ConfigError(
            f"a source uses Lance datasets, which need pylance: pip install 'zephon-titan[lance]' ({e})"
        ) from e
    return lance


def _lance_storage_options(uri: str, options: StorageOptions) -> dict[str, str] | None:
    if not uri.startswith("s3://"):
        return None
    out: dict[str, str] = {}
    endpoint = s3_endpoint(options)
    if endpoint:
        out["aws_endpoint"] = endpoint
        out["allow_http"] = str(endpoint.startswith("http://")).lower()
    if options.s3_region:
        out["aws_region"] = options.s3_region
    if options.s3_anonymous:
        out["aws_skip_signature"] = "true"
    return out or None


def _open_dataset(uri: str, version: int | None, options: StorageOptions) -> LanceDataset:
    dataset: LanceDataset = _lance().dataset(uri, version=version, storage_options=_lance_storage_options(uri, options))
    return dataset


@lru_cache(maxsize=16)
def _dataset(uri: str, version: int, options: StorageOptions) -> LanceDataset:
    """A pinned version, opened once per process."""
    return _open_dataset(uri, version, options)


def block_name(uri: str, version: int, fragment: int) -> str:
    return f"{uri}?version={version}&fragment={fragment}"


def _parse(name: str) -> tuple[str, int, int]:
    uri, _, query = name.rpartition("?")
    fields = parse_qs(query)
    return uri, int(fields["version"][0]), int(fields["fragment"][0])


def parse_block_name(name: str) -> tuple[str, int, int] | None:
    """(dataset, version, fragment) of a block name, or None if it is not one (an index record)."""
    try:
        parsed = _parse(name)
    except (KeyError, ValueError, IndexError):
        return None
    return parsed if parsed[0] and block_name(*parsed) == name else None


class LanceSource(Source):
    format_name = "lance"

    def __init__(
        self,
        name: str,
        datasets: Listing,
        text_field: str,
        block_rows: int,
        max_document_chars: int,
        token_field: str = "",
        storage_options: StorageOptions = StorageOptions(),
    ):
        """`datasets`: dataset URIs/paths to list, or FileBlocks (one per fragment) from an index."""
        self.block_rows = block_rows
        self.token_field = token_field
        super().__init__(name, datasets, text_field, max_document_chars, storage_options)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "block_rows": self.block_rows, "token_field": self.token_field}

    def _fragments(self, uri: str) -> list[FileBlocks]:
        try:
            dataset = _open_dataset(uri, None, self.storage_options)  # the latest version, pinned from here on
        except (OSError, ValueError) as e:
            raise ConfigError(f"source {self.name!r}: cannot open Lance dataset {uri} ({e}); fix the path") from None
        self.check_column(uri, dataset.schema.names)
        out: list[FileBlocks] = []
        for fragment in sorted(dataset.get_fragments(), key=lambda f: f.fragment_id):
            rows = fragment.count_rows()  # after deletions, at this version
            out.append(
                FileBlocks(block_name(uri, dataset.version, fragment.fragment_id), rows, 0, -(-rows // self.block_rows))
            )
        return out

    def _scan_all(self, datasets: Listing) -> list[FileBlocks]:
        # Index records (FileBlocks) or dataset names (str): the two kinds a Lance source is opened from.
        if all(isinstance(d, FileBlocks) for d in datasets):
            return list(cast("list[FileBlocks]", datasets))
        return [f for uri in cast("list[str]", datasets) for f in self._fragments(uri)]

    def _scan(self, file: FileStat) -> FileBlocks:
        raise NotImplementedError("a Lance source lists the fragments of each dataset (_scan_all)")

    def _read(self, file_index: int, local_block: int) -> BlockDocuments:
        f = self.files[file_index]
        uri, version, fragment_id = _parse(f.path)
        first_row = local_block * self.block_rows
        try:
            fragment = _dataset(uri, version, self.storage_options).get_fragment(fragment_id)
            if fragment is None:  # an id the dataset lacks: a doctored or stale index
                raise DataError(
                    f"{f.path}: version {version} of the dataset has no fragment {fragment_id}; the source's index "
                    "does not describe this dataset: rebuild it with `zephon-titan index <job.toml>`"
                )
            fields = self.pipeline_fields
            for name in fields:
                self.check_field(f.path, name, fragment.schema.names)
            columns = None if self.reads_records else list(dict.fromkeys([self.column, *fields]))
            table = fragment.to_table(columns=columns, offset=first_row, limit=self.block_rows)
        except (OSError, ValueError) as e:
            raise DataError(
                f"{f.path}: cannot read rows {first_row}.. ({e}); was version {version} of the dataset cleaned up?"
            ) from None
        expected = min(self.block_rows, f.size - first_row)
        if table.num_rows != expected:
            raise self.changed_file(f, f"block {local_block} has {table.num_rows} rows instead of {expected}")
        block = column_documents(self, table.column(self.column), f.path, first_row)
        return with_columns(block, table, fields, self.reads_records)


def expand_datasets(source_name: str, patterns: list[str]) -> list[str]:
    """Dataset paths (local globs allowed, matching `*.lance` directories) or URIs, sorted."""
    import glob
    import os

    out: set[str] = set()
    for pattern in patterns:
        refuse_credentials_in_path(pattern, f"[dataloader.sources.{source_name}] path")
        if is_uri(pattern):
            out.add(pattern.rstrip("/"))
            continue
        matches = [m for m in glob.glob(pattern) if os.path.isdir(m)]
        if not matches:
            raise ConfigError(
                f"source {source_name!r}: path {pattern!r} matches no Lance dataset directory; "
                f"fix the path or remove it from [dataloader.sources.{source_name}] paths"
            )
        out.update(os.path.normpath(m) for m in matches)
    return sorted(out)


def _check_record(f: FileBlocks, source: SourceConfig) -> str:
    if parse_block_name(f.path) is None:
        return "is not a Lance block name (<dataset>?version=<v>&fragment=<id>)"
    expected = -(-f.size // source.block_rows)
    if f.num_blocks != expected:
        return (
            f"num_blocks is {f.num_blocks}, but {f.size:,} rows in blocks of {source.block_rows:,} rows make {expected}"
        )
    return ""


def _init_sample(dataset: FileStat) -> Sample:
    """The string columns of a dataset's first SAMPLE_ROWS rows, and its rows."""
    try:
        import lance
    except ImportError:
        raise ConfigError(f"{dataset.path}: a Lance dataset needs pylance: pip install 'zephon-titan[lance]'") from None
    opened = lance.dataset(dataset.path)
    strings, others = string_columns(opened.schema)
    first = opened.to_table(columns=strings, limit=SAMPLE_ROWS) if strings else pa.table({})
    return columns_sample(first, others, opened.count_rows())


LANCE = Format(
    fields=True,
    name="lance",
    extensions=(".lance",),
    open=lambda source, datasets, max_chars, options: LanceSource(
        source.name, datasets, source.text_field, source.block_rows, max_chars, source.token_field, options
    ),
    check_record=_check_record,
    token_field=True,
    datasets=True,
    list_datasets=expand_datasets,
    index_keys=("block_rows",),
    init=InitSampling("Lance", (".lance",), sample_file=_init_sample),
)
