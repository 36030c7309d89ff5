"""The records of a source index, checked before use: an index is a file anyone could have edited.

A record must be well-typed, lie inside the source's configured paths (an index cannot
bring in a foreign file), appear once and in the listing's order (a doubled record would
double a file's documents), and have the block count its size and the settings give (a
doctored count would drop documents or read past the file's end). Sizes and row groups are
also compared with the file itself when it is read (Source.check_unchanged).
"""

from __future__ import annotations

from collections.abc import Callable

from zephon_titan.config import SourceConfig
from zephon_titan.engine.sources import guards, storage
from zephon_titan.engine.sources.base import FileBlocks
from zephon_titan.engine.sources.formats import format_names, get_format
from zephon_titan.engine.sources.lance import parse_block_name
from zephon_titan.errors import ConfigError

_FIX = "the index was edited or is corrupt: rebuild it with `zephon-titan index <job.toml>`"


def check_records(records: list[object], source: SourceConfig, fmt: str, where: str) -> list[FileBlocks]:
    if fmt not in format_names():
        raise ConfigError(f"{where} has format {_show(fmt)}, not one of {', '.join(format_names())}; {_FIX}")
    files: list[FileBlocks] = []
    last: tuple[str, int] | None = None
    check_blocks = get_format(fmt, "index").check_record
    outside = _outside(source, fmt)
    for n, record in enumerate(records):  # 100,000 records: each check inlined, in this order
        problem, f = _parse(record)
        if f is not None:
            if "://" in f.path:
                guards.refuse_credentials_in_path(f.path, f"{where} record {n} path")
            problem = check_blocks(f, source) or outside(f)
        if problem or f is None:
            raise ConfigError(f"{where} record {n}{f' ({f.path})' if f else ''}: {problem}; {_FIX}")
        key = _order_key(f, fmt) if fmt == "lance" else (f.path, 0)
        if last is not None and key <= last:
            what = "repeats the file of an earlier record" if key == last else "is out of sorted order"
            raise ConfigError(f"{where} record {n} ({f.path}) {what}; {_FIX}")
        files.append(f)
        last = key
    if not get_format(fmt, "index").datasets:
        guards.refuse_duplicate_targets(source.name, [f.path for f in files], f"records of {where}")
    return files


def _show(value: object) -> str:
    """A value from the index, cut short: it may be anything, of any size."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _parse(record: object) -> tuple[str, FileBlocks | None]:
    if type(record) is list and len(record) == 5:  # the common, well-formed record, checked in one expression
        path, size, mtime_ns, blocks, rows = record
        if (
            type(path) is str and path and type(size) is int and type(mtime_ns) is int and type(blocks) is int
            and size >= 0 and mtime_ns >= 0 and blocks >= 0 and type(rows) is list
            and (not rows or all(type(r) is int and r >= 0 for r in rows))
        ):  # fmt: skip
            return "", FileBlocks(path, size, mtime_ns, blocks, tuple(rows))
    return _problem(record)


def _problem(record: object) -> tuple[str, FileBlocks | None]:
    """What is wrong with a record the fast path refused (or the record, when nothing is)."""
    if not (isinstance(record, list) and len(record) == 5):
        return f"a record must be [path, size, mtime_ns, num_blocks, block_rows], got {_show(record)}", None
    path, size, mtime_ns, blocks, rows = record
    if not (isinstance(path, str) and path):
        return f"path must be a non-empty string, got {_show(path)}", None
    for name, value in (("size", size), ("mtime_ns", mtime_ns), ("num_blocks", blocks)):
        if type(value) is not int or value < 0:  # bool is an int subclass: refused too
            return f"{name} must be an integer >= 0, got {_show(value)}", None
    if not (isinstance(rows, list) and all(type(r) is int and r >= 0 for r in rows)):
        return f"block_rows must be a list of integers >= 0, got {_show(rows)}", None
    return "", FileBlocks(path, size, mtime_ns, blocks, tuple(rows))


def _outside(source: SourceConfig, fmt: str) -> Callable[[FileBlocks], str]:
    """What is wrong with where a record's file is ("" if it lies inside the source's paths); the patterns'
    matchers and the format's kind looked up once, not once per record."""
    datasets = get_format(fmt, "index").datasets
    matchers = [storage.matcher(pattern) for pattern in source.paths]
    problem = f"is outside the source's configured paths ({', '.join(source.paths)})"

    def check(f: FileBlocks) -> str:
        target = f.path.rpartition("?")[0] if datasets else f.path
        return "" if any(match(target) for match in matchers) else problem

    return check


def _order_key(f: FileBlocks, fmt: str) -> tuple[str, int]:
    """Files are listed in sorted path order; Lance fragments by dataset, then fragment id."""
    parsed = parse_block_name(f.path) if fmt == "lance" else None
    if parsed is not None:
        uri, _, fragment = parsed
        return (uri, fragment)
    return (f.path, 0)
