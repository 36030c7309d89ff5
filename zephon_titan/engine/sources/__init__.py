"""Source formats. `open_source` picks the reader from the config (or file extension)."""

from __future__ import annotations

from zephon_titan.config import SourceConfig
from zephon_titan.errors import ConfigError
from zephon_titan.engine.sources.base import BlockDocuments, FileBlocks, Source, expand_paths
from zephon_titan.engine.sources.index import read_index, save_index_after_first_use
from zephon_titan.engine.sources.jsonl import JsonlSource
from zephon_titan.engine.sources.parquet import ParquetSource
from zephon_titan.engine.sources.storage import StorageOptions

_EXTENSIONS = {
    **{f"{ext}{z}": "jsonl" for ext in (".jsonl", ".json", ".ndjson") for z in ("", ".gz", ".zst", ".zstd")},
    ".parquet": "parquet",
    ".pq": "parquet",
}


def _format_of(source: SourceConfig, path: str) -> str:
    if source.format != "auto":
        return source.format
    for ext, fmt in _EXTENSIONS.items():
        if path.endswith(ext):
            return fmt
    raise ConfigError(
        f"[dataloader.sources.{source.name}]: cannot tell the format of {path} from its extension "
        f"(known: {', '.join(_EXTENSIONS)}); set format = \"jsonl\" or \"parquet\""
    )


def open_source(source: SourceConfig, base_dir: str | None = None, max_document_chars: int = 64 << 20,
                options: StorageOptions = StorageOptions(), listed: list[FileBlocks] | None = None,
                use_index: bool = True) -> Source:
    """Open a source: from `listed` (files already scanned by another process of this job), from
    its index, or by listing and scanning its files (then writing the index if one is configured)."""
    write_index = False
    if listed is None and source.index and use_index:
        indexed = read_index(source, options)
        write_index = indexed is None
        if indexed is not None:
            _check_index_format(source, *indexed)
            listed = indexed[1]
    if _is_lance(source):
        from zephon_titan.engine.sources.lance import LanceSource, expand_datasets

        datasets = listed if listed is not None else expand_datasets(source.name, source.paths)
        opened = LanceSource(source.name, datasets, source.text_field, source.block_rows, max_document_chars,
                             source.token_field, options)
    else:
        opened = _open_files(source, listed, base_dir, max_document_chars, options)
    if write_index:
        save_index_after_first_use(source, opened, options)
    return opened


def _check_index_format(source: SourceConfig, fmt: str, files: list[FileBlocks]) -> None:
    """An index's records were checked for the format it names (index_records.py): it must be the
    source's, or its block counts mean nothing."""
    actual = "lance" if _is_lance(source) else _format_of(source, files[0].path) if files else fmt
    if fmt != actual:
        raise ConfigError(f"[dataloader.sources.{source.name}] index {source.index} describes {fmt} files, but the "
                          f"source's are {actual}; rebuild it with `zephon-titan index <job.toml>`")


def _is_lance(source: SourceConfig) -> bool:
    if source.format != "auto":
        return source.format == "lance"
    return all(p.rstrip("/").endswith(".lance") for p in source.paths)


def _open_files(source: SourceConfig, listed: list[FileBlocks] | None, base_dir: str | None, max_document_chars: int,
                options: StorageOptions) -> Source:
    files = listed if listed is not None else expand_paths(source.name, source.paths, base_dir, options)
    formats = {_format_of(source, f.path) for f in files}
    if len(formats) > 1:
        raise ConfigError(
            f"[dataloader.sources.{source.name}] mixes formats ({', '.join(sorted(formats))}); "
            "split it into one source per format"
        )
    fmt = formats.pop()
    if source.token_field and fmt != "parquet":
        raise ConfigError(
            f"[dataloader.sources.{source.name}] token_field needs Parquet files or Lance datasets (a column of "
            "token-id lists), "
            f"its files are {fmt}"
        )
    if fmt == "parquet":
        return ParquetSource(source.name, files, source.text_field, max_document_chars, source.token_field, options)
    return JsonlSource(source.name, files, source.text_field, source.block_bytes, max_document_chars, options)


__all__ = ["BlockDocuments", "Source", "open_source", "JsonlSource", "ParquetSource", "StorageOptions"]
