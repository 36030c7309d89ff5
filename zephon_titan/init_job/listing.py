"""Which sources `zephon-titan init` makes of its data arguments: a directory (one source per format found
under it), a file, a quoted glob, or a dataset directory; files the shell expanded from one directory are one
source again. Formats come from the registry (engine/sources/formats.py): those with an `init` hook."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from typing import Any

from zephon_titan.engine.sources import formats, storage
from zephon_titan.engine.sources.base import expand_paths
from zephon_titan.engine.sources.init_sample import InitSampling, Sample
from zephon_titan.engine.sources.storage import FileStat
from zephon_titan.errors import ConfigError


@dataclass
class SourcePlan:
    name: str
    paths: list[str]
    format: str
    files: list[FileStat]
    samples: list[Sample] = field(default_factory=list)
    text_field: str = ""
    why_field: str = ""
    documents: float = 0.0
    tokens: float = 0.0
    tokenized: int = 0
    """Documents the estimate tokenized (all of them where `exact`)."""
    exact: bool = False
    """Every file counted whole: documents and tokens as `validate` counts them."""
    mean_characters: float = 0.0
    token_settings: dict[str, tuple[Any, str]] = field(default_factory=dict)
    """Token formats: the source's keys that say how to read the ids (value, why)."""
    chat: dict[str, Any] = field(default_factory=dict)
    """A chat source's keys (chat = true, and where its conversations are): docs/chat.md."""

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def sampling(self) -> InitSampling:
        """How init reads the source's format (its `Format.init`: a plan is made only for the formats init reads)."""
        return _init_of(formats.get_format(self.format, ""))

    @property
    def columns(self) -> dict[str, str]:
        """The sampled files' columns (or JSON fields) besides the text, with their types: what a source's keep
        and repeat may read (docs/processing.md)."""
        out: dict[str, str] = {}
        for sample in self.samples:
            out.update((name, "string") for name in sample.texts if name != self.text_field)
            out.update((name, kind) for name, kind in sample.other_fields.items() if name != self.text_field)
        for name in self.chat.values():
            out.pop(str(name), None)
        return out

    @property
    def token_ids(self) -> bool:
        """Its files hold token ids: counted by the format, no text column."""
        return self.sampling.count_tokens is not None

    @property
    def datasets(self) -> bool:
        """Its paths name dataset directories, not files."""
        return formats.get_format(self.format, "").datasets


def file_formats() -> list[formats.Format]:
    """The formats init reads whose paths name files (not dataset directories)."""
    return [f for f in formats.init_formats() if not f.datasets]


def _reads_files(fmt: formats.Format | None) -> bool:
    return fmt is not None and fmt.init is not None and not fmt.datasets


def _init_of(fmt: formats.Format) -> InitSampling:
    assert fmt.init is not None
    return fmt.init


def plan_sources(arguments: list[str]) -> list[SourcePlan]:
    """One SourcePlan per data argument (a directory may give one per format), files listed."""
    plans: list[SourcePlan] = []
    loose: dict[tuple[str, str], list[str]] = {}  # (directory, format) -> plain files named one by one
    for argument in arguments:
        name, _, path = argument.partition("=") if _named(argument) else ("", "", argument)
        fmt = _registered(path.rstrip("/"))
        if fmt is not None and fmt.datasets and fmt.init is not None:
            plans.append(_dataset_source(name or _name_of(path), path, fmt))
        elif os.path.isdir(path):
            plans += _directory_sources(name, path)
        elif not name and os.path.isfile(path):
            loose.setdefault((os.path.dirname(path), _format(path, path)), []).append(path)
        else:
            plans.append(_source(name or _name_of(path), [path]))
    for (directory, _), paths in loose.items():
        plans.append(_source(_name_of(directory or "."), _as_glob(directory, paths)))
    _deduplicate_names(plans)
    return plans


def _as_glob(directory: str, paths: list[str]) -> list[str]:
    """Files named one by one (a glob the shell expanded): `directory/*<ending>` when that is all of them."""
    endings = {"." + os.path.basename(p).split(".", 1)[1] for p in paths if "." in os.path.basename(p)}
    if len(endings) == 1:
        pattern = os.path.join(directory, "*" + endings.pop())
        if sorted(map(os.path.normpath, glob.glob(pattern))) == sorted(map(os.path.normpath, paths)):
            return [pattern]
    return paths


def _named(argument: str) -> bool:
    name, sep, _ = argument.partition("=")
    return bool(sep) and name.replace("_", "").replace("-", "").isalnum()


def _registered(path: str) -> formats.Format | None:
    """The registered format whose file endings `path` has (None: no format's); a dataset's `index.json` by its
    first bytes where the file exists (formats.format_of_name)."""
    if os.path.isfile(path):
        return formats.format_of_name(path)
    registered = (formats.get_format(name, "") for name in formats.format_names())
    return next((f for f in registered if f.sniff is None and path.endswith(f.extensions)), None)


def _format(path: str, argument: str) -> str:
    fmt = _registered(path)
    if fmt is None or not _reads_files(fmt):
        named = [f"{_init_of(f).title} ({', '.join(_init_of(f).endings)})" for f in file_formats()]
        listed = f"{', '.join(named[:-1])} or {named[-1]}" if len(named) > 1 else "".join(named)
        datasets = [e for f in formats.init_formats() if f.datasets for e in _init_of(f).endings]
        nor = f" (nor a {' or '.join(datasets)} dataset)" if datasets else ""
        raise ConfigError(f"{argument}: {path} is not a {listed} file{nor}; leave it out, or name only the data files")
    return fmt.name


def _directory_sources(name: str, directory: str) -> list[SourcePlan]:
    """Every data file (of a format init reads) under `directory`: one source per format, one glob per file
    ending. A folder whose `index.json` a format recognizes (an MDS or LitData dataset) is that dataset: its shards
    are not files of their own."""
    endings: dict[str, set[str]] = {}
    for root, _, files in os.walk(directory):
        sniffed = [f for f in files if (fmt := _registered(os.path.join(root, f))) is not None and fmt.sniff]
        for file in sniffed or files:
            fmt = _registered(os.path.join(root, file))
            if fmt is not None and _reads_files(fmt):
                endings.setdefault(fmt.name, set()).add(max((e for e in fmt.extensions if file.endswith(e)), key=len))
    if not endings:
        named = ", ".join(e for f in file_formats() for e in _init_of(f).endings)
        raise ConfigError(f"{directory}: no data file ({named}) under it; name the folder that holds your data files")
    base = name or _name_of(directory)
    return [
        _source(
            base if len(endings) == 1 else f"{base}_{fmt}",
            [os.path.join(directory, "**", f"*{e}") for e in sorted(ends)],
        )
        for fmt, ends in sorted(endings.items())
    ]


def _dataset_source(name: str, pattern: str, fmt: formats.Format) -> SourcePlan:
    """A source of dataset directories: each one's size is the bytes of the files under it."""
    assert fmt.list_datasets is not None
    datasets = fmt.list_datasets(name, [pattern])
    sizes = [sum(os.path.getsize(os.path.join(r, f)) for r, _, files in os.walk(d) for f in files) for d in datasets]
    return SourcePlan(name, [pattern], fmt.name, [FileStat(d, size, 0) for d, size in zip(datasets, sizes)])


def _source(name: str, paths: list[str]) -> SourcePlan:
    for pattern in paths:
        if not storage.expand(pattern):
            raise ConfigError(
                f"{pattern}: matches no file (from {os.getcwd()}); fix the path, and quote a glob so that init "
                "reads it (not the shell)"
            )
    files = expand_paths(name, paths)  # the loader's own listing, sorted
    found = {_format(f.path, ", ".join(paths)) for f in files}
    if len(found) > 1:
        raise ConfigError(
            f"{', '.join(paths)}: mixes {' and '.join(sorted(found))} files; give each format its own argument "
            "(a source reads one format)"
        )
    return SourcePlan(name, paths, found.pop(), files)


def _name_of(path: str) -> str:
    """A source name from a path: the last folder before any wildcard, else the file's name."""
    parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]
    plain = [p for p in parts if not any(c in p for c in "*?[")]
    if len(plain) == len(parts) and plain and _registered(plain[-1]):
        plain[-1] = plain[-1].split(".", 1)[0]  # a file or dataset: its name without extensions
    chosen = plain[-1] if plain else "data"
    cleaned = "".join(c if c.isalnum() or c in "_-" else "_" for c in chosen).strip("_-")
    return (cleaned or "data")[:48]


def _deduplicate_names(plans: list[SourcePlan]) -> None:
    seen: set[str] = set()
    for plan in plans:
        name, n = plan.name, 2
        while plan.name in seen:
            plan.name, n = f"{name}_{n}", n + 1
        seen.add(plan.name)
