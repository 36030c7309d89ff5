"""Source formats. `open_source` picks the reader from the config (or the file names) through the
format registry (formats.py): a new format is one module plus one `register_format` line here."""

from __future__ import annotations

import dataclasses

from zephon_titan.config import SourceConfig
from zephon_titan.engine.pipeline import SourcePipeline, slots_needed, source_pipeline
from zephon_titan.engine.sources.base import FileBlocks, Source, expand_paths
from zephon_titan.engine.sources.block_documents import BlockDocuments
from zephon_titan.engine.sources.formats import (
    Format,
    dataset_format,
    format_of_file,
    formats_of_files,
    get_format,
    register_format,
)
from zephon_titan.engine.sources.index import read_index, save_index_after_first_use
from zephon_titan.engine.sources.jsonl import JSONL, JsonlSource
from zephon_titan.engine.sources.lance import LANCE
from zephon_titan.engine.sources.litdata import LITDATA
from zephon_titan.engine.sources.mds import MDS
from zephon_titan.engine.sources.megatron import MEGATRON
from zephon_titan.engine.sources.olmo import OLMO
from zephon_titan.engine.sources.parquet import PARQUET, ParquetSource
from zephon_titan.engine.sources.storage import StorageOptions
from zephon_titan.engine.transforms import Transform, load_transform
from zephon_titan.errors import ConfigError

register_format(JSONL)
register_format(PARQUET)
register_format(LANCE)
register_format(MEGATRON)
register_format(OLMO)
register_format(MDS)
register_format(LITDATA)


def open_source(
    source: SourceConfig,
    max_document_chars: int = 64 << 20,
    options: StorageOptions = StorageOptions(),
    listed: list[FileBlocks] | None = None,
    use_index: bool = True,
) -> Source:
    """Open a source: from `listed` (files already scanned by another process of this job), from
    its index, or by listing and scanning its files (then writing the index if one is configured)."""
    if source.chat:  # a chat source's documents are in its conversation field
        source = dataclasses.replace(source, text_field=source.prompt_field or source.messages_field)
    write_index = False
    if listed is None and source.index and use_index:
        indexed = read_index(source, options)
        write_index = indexed is None
        if indexed is not None:
            _check_index_format(source, *indexed, options)
            listed = indexed[1]
    datasets = dataset_format(source)
    if datasets is not None and datasets.list_datasets is not None:
        names = listed if listed is not None else datasets.list_datasets(source.name, source.paths)
        opened = datasets.open(source, names, max_document_chars, options)
    else:
        opened = _open_files(source, listed, max_document_chars, options)
    if write_index:
        save_index_after_first_use(source, opened, options)
    fmt = get_format(opened.format_name, f"[dataloader.sources.{source.name}]")
    pipeline = _pipeline(source, fmt)
    opened.set_pipelines((pipeline,), slots_needed((pipeline,)))
    opened.transforms = _transforms(source, fmt)
    return opened


def _transforms(source: SourceConfig, fmt: Format) -> tuple[Transform, ...]:
    """The source's transforms, imported, where its format gives records of text."""
    where = f"[dataloader.sources.{source.name}]"
    if source.transform and (source.token_field or not fmt.fields):
        raise ConfigError(f"{where} transform needs documents of text with records; the source's are token ids")
    return tuple(load_transform(reference, where) for reference in source.transform)


def _pipeline(source: SourceConfig, fmt: Format) -> SourcePipeline | None:
    """The source's keep and repeat, where its format can give what they read."""
    pipeline = source_pipeline(source)
    if pipeline is None:
        return None
    where = f"[dataloader.sources.{source.name}]"
    if pipeline.fields and not fmt.fields:
        held = (
            "columns this loader does not read for keep and repeat yet"  # a format with columns (MDS, LitData)
            if fmt.token_field
            else "only token ids, no columns"
        )
        raise ConfigError(
            f"{where} keep or repeat reads {', '.join(map(repr, pipeline.fields))}, but {fmt.name} files hold "
            f'{held}; a repeat that is a number (repeat = "0.5") needs none'
        )
    if pipeline.uses_text and (source.token_field or not fmt.fields):
        raise ConfigError(
            f"{where} keep or repeat uses chars or bytes, the length of a text, but the source's documents are "
            "token ids; use a column of the file instead"
        )
    return pipeline


def _check_index_format(source: SourceConfig, fmt: str, files: list[FileBlocks], options: StorageOptions) -> None:
    """An index's records were checked for the format it names (index_records.py): it must be the
    source's, or its block counts mean nothing."""
    datasets = dataset_format(source)
    actual = datasets.name if datasets else format_of_file(source, files[0].path, options).name if files else fmt
    if fmt != actual:
        raise ConfigError(
            f"[dataloader.sources.{source.name}] index {source.index} describes {fmt} files, but the "
            f"source's are {actual}; rebuild it with `zephon-titan index <job.toml>`"
        )


def _open_files(
    source: SourceConfig,
    listed: list[FileBlocks] | None,
    max_document_chars: int,
    options: StorageOptions,
) -> Source:
    files = listed if listed is not None else expand_paths(source.name, source.paths, options)
    formats = formats_of_files(source, [f.path for f in files], options)
    if len(formats) > 1:
        raise ConfigError(
            f"[dataloader.sources.{source.name}] mixes formats ({', '.join(sorted(formats))}); "
            "split it into one source per format"
        )
    (fmt,) = formats.values()
    if source.token_field and not fmt.token_field:
        raise ConfigError(
            f"[dataloader.sources.{source.name}] token_field needs Parquet files, Lance, MDS or LitData datasets (a "
            f"column of token-id lists), its files are {fmt.name}"
        )
    return fmt.open(source, files, max_document_chars, options)


__all__ = [
    "BlockDocuments",
    "Format",
    "Source",
    "open_source",
    "register_format",
    "JsonlSource",
    "ParquetSource",
    "StorageOptions",
]
