"""The index of a source: its file list and block counts, so startup lists and opens nothing.

Without an index every rank lists the source's files and (for Parquet) reads every footer
before its first batch: with tens of thousands of files in object storage that is tens of
thousands of requests per rank. With `[dataloader.sources.<name>] index = "<path or URI>"`
a rank reads one small JSON file instead. The index is written by `zephon-titan index
job.toml`, or on first use by the first run that does not find it.

The index holds exactly what the block numbering is built from (paths, sizes, mtimes,
blocks, rows per row group), so the fingerprint, computed from the same records, covers
it: a run resumed with an index is checked against the same components as one without,
and adding an index to a running job changes nothing. A file that changed after the index
was written is caught when it is read (size or row groups differ) and named.

An index is a file anyone could have edited, so every record is checked before use
(index_records.py): its types, that it lies inside the configured paths, that no file is
listed twice, and that its block counts follow from its sizes and settings.
"""

from __future__ import annotations

import json
import logging
import socket

from zephon_titan.config import SourceConfig
from zephon_titan.engine.sources import guards, storage
from zephon_titan.engine.sources.base import FileBlocks, Source
from zephon_titan.engine.sources.formats import format_names, get_format
from zephon_titan.engine.sources.gc_pause import gc_paused
from zephon_titan.engine.sources.index_records import check_records
from zephon_titan.engine.sources.storage import StorageOptions
from zephon_titan.errors import ConfigError

INDEX_VERSION = 1
log = logging.getLogger("zephon_titan")


def _key(source: SourceConfig, fmt: str) -> dict[str, object]:
    """What the block numbering depends on besides the files themselves."""
    key: dict[str, object] = {"paths": list(source.paths), "format": fmt}
    if fmt in format_names():  # an unknown one is refused by check_records, naming it
        key.update((name, getattr(source, name)) for name in get_format(fmt, "index").index_keys)
    return key


def index_document(source: SourceConfig, opened: Source) -> dict[str, object]:
    return {
        "zephon_index": INDEX_VERSION,
        **_key(source, opened.format_name),
        "num_blocks": opened.num_blocks,
        "files": [f.record() for f in opened.files],
    }


def write_index(source: SourceConfig, opened: Source, options: StorageOptions) -> None:
    text = json.dumps(index_document(source, opened), separators=(",", ":")) + "\n"
    storage.write_bytes(source.index, text.encode("utf-8"), options, tmp_suffix=socket.gethostname())


def read_index(source: SourceConfig, options: StorageOptions) -> tuple[str, list[FileBlocks]] | None:
    """The format and files recorded in the source's index, or None if it does not exist yet."""
    guards.refuse_credentials_in_path(source.index, f"[dataloader.sources.{source.name}] index")
    data = storage.read_bytes(source.index, options)
    if data is None:
        return None
    where = f"[dataloader.sources.{source.name}] index {source.index}"
    with gc_paused():  # 100,000 records make ~300,000 containers, all kept (gc_pause.py)
        return _parse_index(data, source, where)


def _parse_index(data: bytes, source: SourceConfig, where: str) -> tuple[str, list[FileBlocks]]:
    try:
        document = json.loads(data)
        version = document.get("zephon_index")
        fmt = document["format"]
        records = document["files"]
        if not isinstance(records, list):
            raise TypeError(f"'files' is {type(records).__name__}, not a list")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(
            f"{where} is not a zephon index ({e}); delete it or rebuild it with `zephon-titan index`"
        ) from None
    if version != INDEX_VERSION:
        raise ConfigError(f"{where} has version {version}, this loader reads {INDEX_VERSION}; rebuild it")
    expected, recorded = _key(source, fmt), {k: document.get(k) for k in _key(source, fmt)}
    if recorded != expected:
        changed = "; ".join(f"{k}: {recorded[k]!r} -> {expected[k]!r}" for k in expected if recorded[k] != expected[k])
        raise ConfigError(
            f"{where} was written for other settings ({changed}); rebuild it with `zephon-titan index <job.toml>` "
            "or point index at another file"
        )
    return fmt, check_records(records, source, fmt, where)


def save_index_after_first_use(source: SourceConfig, opened: Source, options: StorageOptions) -> None:
    """Write the index a run did not find. Every rank may do this at once: the content is the
    same and each write replaces the file atomically. A failed write is not fatal."""
    try:
        write_index(source, opened, options)
        log.info("zephon: wrote the index of source %r to %s (%d files)", source.name, source.index, len(opened.files))
    except OSError as e:
        log.warning(
            "zephon: could not write the index of source %r to %s (%s); startup lists the files "
            "until one is written (`zephon-titan index`)",
            source.name,
            source.index,
            e,
        )
