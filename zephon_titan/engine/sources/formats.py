"""The source-format registry. A format is one module that declares a `Format`, plus one
`register_format` line (sources/__init__.py); nothing else names formats.

A format says which file names it reads under `format = "auto"`, how to open a source from its
listed files (or index records), and how to check an index record's block count against its
size, so a doctored index cannot drop documents or read past a file's end; and, optionally, how
`zephon-titan init` samples its files (`init`, sources/init_sample.py): init asks the registry, never a name.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from zephon_titan.config import SourceConfig
from zephon_titan.engine.sources import storage
from zephon_titan.engine.sources.base import FileBlocks, Listing, Source
from zephon_titan.engine.sources.init_sample import InitSampling
from zephon_titan.engine.sources.storage import StorageOptions
from zephon_titan.errors import ConfigError


@dataclass(frozen=True)
class Format:
    name: str
    """The `format = "..."` value of a source."""

    extensions: tuple[str, ...]
    """File name endings this format reads under `format = "auto"`."""

    open: Callable[[SourceConfig, Listing, int, StorageOptions], Source]
    """(source config, files or index records, max_document_chars, StorageOptions) -> Source."""

    check_record: Callable[[FileBlocks, SourceConfig], str] = lambda record, source: ""
    """(FileBlocks, source config) -> what is wrong with an index record ("" if nothing)."""

    token_field: bool = False
    """Reads pre-tokenized columns (`token_field`)."""

    index_keys: tuple[str, ...] = ()
    """The source settings its block numbering depends on: an index records them, and one written for
    other values is refused naming the change (sources/index.py)."""

    fields: bool = False
    """Its Source reads a document's other columns or fields (BlockDocuments.fields): a source's keep and repeat
    may name them."""

    datasets: bool = False
    """Paths name dataset directories (listed by `list_datasets`), not files; blocks carry their own names."""

    list_datasets: Callable[[str, list[str]], list[str]] | None = None
    """(source name, patterns) -> dataset names, for `datasets` formats."""

    init: InitSampling | None = None
    """How `zephon-titan init` reads a source of this format (None: init refuses its files)."""

    sniff: Callable[[bytes], bool] | None = None
    """Files named by `extensions` that another format's names may end with too (a dataset's `index.json` ends in
    JSONL's `.json`): whether a file is this format's, from its first SNIFF_BYTES. Under `format = "auto"` such
    formats are asked first; a file none of them recognizes goes by its name alone."""


_FORMATS: dict[str, Format] = {}
# Bumped when a format is registered or removed: format_of_name's cached answers are per version.
_REGISTRY_VERSION = [0]
SNIFF_BYTES = 4096


def register_format(fmt: Format) -> Format:
    if fmt.name in _FORMATS or fmt.name == "auto":
        raise ValueError(f"source format {fmt.name!r} is registered already")
    _FORMATS[fmt.name] = fmt
    _REGISTRY_VERSION[0] += 1
    return fmt


def unregister_format(name: str) -> None:
    """Remove a registered format (a test's own)."""
    _FORMATS.pop(name, None)
    _REGISTRY_VERSION[0] += 1


def format_names() -> list[str]:
    return sorted(_FORMATS)


def init_formats() -> list[Format]:
    """The formats `zephon-titan init` reads (those with an `init` hook), in registration order."""
    return [fmt for fmt in _FORMATS.values() if fmt.init is not None]


def get_format(name: str, where: str) -> Format:
    if name not in _FORMATS:
        raise ConfigError(f"{where} format must be one of auto, {', '.join(format_names())}, got {name!r}")
    return _FORMATS[name]


def format_of_file(source: SourceConfig, path: str, options: StorageOptions = StorageOptions()) -> Format:
    """The format of one listed file: the source's `format`, or the one its name (and, for formats that sniff,
    its first bytes) selects."""
    where = f"[dataloader.sources.{source.name}]"
    if source.format != "auto":
        return get_format(source.format, where)
    fmt = format_of_name(path, options)
    if fmt is not None:
        return fmt
    known = ", ".join(dict.fromkeys(e for f in _FORMATS.values() for e in f.extensions))
    raise ConfigError(
        f"{where}: cannot tell the format of {path} from its extension (known: {known}); set "
        f"format to one of {', '.join(format_names())}"
    )


def formats_of_files(
    source: SourceConfig, paths: list[str], options: StorageOptions = StorageOptions()
) -> dict[str, Format]:
    """The formats of a source's files by name: format_of_file of each path, in order (its first refusal is the
    one raised), asked once per name ending that no sniffing format could claim: 100,000 files share a few."""
    if source.format != "auto":
        return {source.format: get_format(source.format, f"[dataloader.sources.{source.name}]")} if paths else {}
    undotted = _undotted(_REGISTRY_VERSION[0])
    by_ending: dict[str, Format] = {}  # the dotted ending of a name no undotted extension ends -> its format
    found: dict[str, Format] = {}
    for path in paths:
        plain = not path.endswith(undotted)
        fmt = by_ending.get(_dotted(path)) if plain else None
        if fmt is None:
            fmt = format_of_file(source, path, options)
            if plain and not _formats_named(path)[0]:  # picked by its name alone: the same for its whole ending
                by_ending[_dotted(path)] = fmt
        found[fmt.name] = fmt
    return found


def format_of_name(path: str, options: StorageOptions = StorageOptions()) -> Format | None:
    """The format `format = "auto"` picks for a file (None: none): a sniffing format whose names it has and which
    recognizes its first bytes, else the first format whose names it has."""
    sniffing, plain = _formats_named(path)
    if sniffing:
        with storage.open_own_file(path, options) as handle:
            head = storage.read_range(handle, path, 0, min(handle.size(), SNIFF_BYTES), "its first bytes")
        for fmt in sniffing:
            if fmt.sniff is not None and fmt.sniff(head):
                return fmt
    return plain


def _formats_named(path: str) -> tuple[list[Format], Format | None]:
    """The sniffing formats whose names `path` has, and the first other one (None: none), in registry order.
    Whether a path ends with an extension that starts with "." (and has no "/") depends only on its name from
    the name's first "."; the few other extensions (a dataset's `index.json`) are tested as they are. 100,000
    files of a source then share a handful of answers."""
    others = tuple(path.endswith(e) for e in _undotted(_REGISTRY_VERSION[0]))
    return _formats_of_ending(_dotted(path), others, _REGISTRY_VERSION[0])


def _dotted(path: str) -> str:
    """A path's name from its first "." ("" if it has none)."""
    name = path.rpartition("/")[2]
    return name[name.find(".") :] if "." in name else ""


@functools.lru_cache(maxsize=4)
def _undotted(_version: int) -> tuple[str, ...]:
    return tuple(e for f in _FORMATS.values() for e in f.extensions if not e.startswith(".") or "/" in e)


@functools.lru_cache(maxsize=1024)
def _formats_of_ending(dotted: str, others: tuple[bool, ...], version: int) -> tuple[list[Format], Format | None]:
    undotted = dict(zip(_undotted(version), others))

    def has(fmt: Format) -> bool:
        return any(undotted[e] if e in undotted else dotted.endswith(e) for e in fmt.extensions)

    named = [f for f in _FORMATS.values() if has(f)]
    return [f for f in named if f.sniff is not None], next((f for f in named if f.sniff is None), None)


def dataset_format(source: SourceConfig) -> Format | None:
    """The format of a source whose paths name datasets (all ending in its extensions), if any."""
    if source.format != "auto":
        fmt = get_format(source.format, f"[dataloader.sources.{source.name}]")
        return fmt if fmt.datasets else None
    for fmt in _FORMATS.values():
        if fmt.datasets and all(p.rstrip("/").endswith(fmt.extensions) for p in source.paths):
            return fmt
    return None
