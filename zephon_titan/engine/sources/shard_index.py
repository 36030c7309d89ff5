"""A sample-shard dataset's index: what Mosaic Streaming's MDS (mds.py) and LitData's (litdata.py) `index.json`
say once parsed (its columns, its shards), and its reading (bounded, checked, once per process). It stands apart
from shards.py (reading the shards as blocks) because each format's module builds a `ShardIndex` and needs no more.
"""

from __future__ import annotations

import json
import os
import posixpath
import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from zephon_titan.engine.sources import storage
from zephon_titan.engine.sources.storage import StorageOptions
from zephon_titan.errors import ConfigError, DataError

MAX_INDEX_BYTES = 256 << 20  # an index.json of ~500,000 shards; a larger one is refused before it is read
MAX_SHARD_BYTES = (1 << 32) - 1  # u32 offsets: no shard (decompressed) is larger
U32 = struct.Struct("<I")
SHARD_RECORD = 4  # ints per shard in FileBlocks.block_rows: samples, size, mtime_ns, compressed


class BadIndex(Exception):
    """What is wrong with an index.json; the caller names the file and the fix."""


@dataclass(frozen=True)
class Column:
    name: str
    encoding: str
    size: int | None
    """Its bytes in every sample when fixed by its encoding; None: in each sample's header."""
    sized: bool
    """Each sample's header holds its size (MDS: the columns of no fixed size; LitData: every leaf)."""


@dataclass(frozen=True)
class Shard:
    basename: str
    """Its path relative to the index.json's folder."""
    samples: int
    stored_bytes: int | None
    """The file's size as the index states it (None: it does not, as LitData's for a compressed chunk)."""
    raw_bytes: int
    """Its size uncompressed."""
    codec: str | None
    """pyarrow's name of its compression when compressed whole (None: not so)."""
    framing: str | None = None
    """LitData's zstd inside the file (shard_codecs.py): "batch" (frames of samples) or "sample" (one each)."""


@dataclass(frozen=True)
class ShardIndex:
    columns: tuple[Column, ...]
    shards: tuple[Shard, ...]


@dataclass(frozen=True)
class ShardFormat:
    """What a sharded format's module gives: its title, how its index.json reads, how a token column decodes."""

    title: str
    rewrite: str
    """The fix for a file the writer did not write ("rewrite it with ...")."""
    parse: Callable[[Any], ShardIndex]
    """(the parsed JSON) -> ShardIndex, raising BadIndex."""
    tokens: Callable[[str], Callable[[bytes], np.ndarray] | None]
    """(a column's encoding) -> its decoder to token ids, or None where it holds none."""
    text_encodings: frozenset[str] = frozenset({"str"})


def u32(value: object) -> int:
    """An index number: an int (not bool) in [0, 2**32)."""
    if type(value) is not int or not 0 <= value <= MAX_SHARD_BYTES:
        raise BadIndex(f"expected an integer in [0, 2**32), got {show(value)}")
    return value


def show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_basename(name: object) -> str:
    """A shard's path as an index names it: relative, inside the dataset's folder."""
    if not isinstance(name, str) or not name or "\x00" in name or "\\" in name or "://" in name:
        raise BadIndex(f"a shard's name must be a relative path, got {show(name)}")
    if name.startswith("/") or ".." in name.split("/"):
        raise BadIndex(f"shard {show(name)} is outside the dataset's folder")
    return name


def shard_path(index_path: str, basename: str) -> str:
    if storage.is_uri(index_path):
        return posixpath.join(posixpath.dirname(index_path), basename)
    return os.path.normpath(os.path.join(os.path.dirname(index_path), basename))


def read_index(fmt: ShardFormat, path: str, size: int, mtime_ns: int, options: StorageOptions) -> ShardIndex:
    """A dataset's index.json of `size` bytes (as listed), read (bounded) and checked; once per process for each
    version (size and mtime in the key: one rewritten is read anew)."""
    return _read_index(fmt, path, size, mtime_ns, options)


@lru_cache(maxsize=64)
def _read_index(fmt: ShardFormat, path: str, size: int, mtime_ns: int, options: StorageOptions) -> ShardIndex:
    fix = f"the dataset's index.json is damaged or was edited: {fmt.rewrite}"
    if size > MAX_INDEX_BYTES:
        raise DataError(f"{path}: {size:,} bytes, more than the {MAX_INDEX_BYTES:,} an index.json may have; {fix}")
    try:
        data = storage.read_bytes(path, options, MAX_INDEX_BYTES)
    except ConfigError as e:
        raise DataError(str(e)) from None
    if data is None:
        raise DataError(f"{path}: it was listed and is gone; check the data")
    if len(data) != size:
        raise DataError(f"{path}: it has {len(data):,} bytes, listed with {size:,}: it changed; check the data")
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise DataError(f"{path}: not JSON ({str(e)[:80]}); {fix}") from None
    try:
        index = fmt.parse(document)
    except BadIndex as e:
        raise DataError(f"{path}: {e}; {fix}") from None
    if not index.shards:
        raise DataError(f"{path}: names no shard; {fix}")
    return index
