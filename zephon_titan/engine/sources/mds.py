"""Mosaic Streaming's MDS datasets: `index.json` + `shard.NNNNN.mds` (or `.mds.zstd`, `.gz`, `.bz2`, `.br`,
`.snappy`), as `streaming.MDSWriter` writes them. A source lists the `index.json` files; shards.py reads the shards.

The index (`{"shards": [...], "version": 2}`, keys sorted) gives per shard its columns (`column_names`,
`column_encodings`, `column_sizes`: a size for fixed-size encodings, null for the others, whose sizes each
sample's header holds), `samples`, `raw_data` (basename, bytes) and, when compressed, `zip_data` (the file
written instead) and `compression` (`zstd`, `zstd:<level>`, `gz`, `bz2`, `br`, `snappy`: python-snappy's raw
format, inflated by pyarrow's codec to the size `raw_data` states). A text column is encoded `str`; a token
column `ndarray`, `ndarray:<int dtype>` or `ndarray:<int dtype>:<length>`, 1-D.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from zephon_titan.engine.sources.shard_index import (
    BadIndex,
    Column,
    Shard,
    ShardFormat,
    ShardIndex,
    check_basename,
    show,
    u32,
)
from zephon_titan.engine.sources.shards import sharded_format

_CODECS = {"zstd": "zstd", "gz": "gzip", "bz2": "bz2", "br": "brotli", "snappy": "snappy"}
# NDArray's dtype codes (streaming/base/format/mds/encodings.py): the integer ones; floats are not token ids.
_VALUE_DTYPES = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 32: "uint32", 33: "int32", 64: "uint64", 65: "int64"}
_SHAPE_DTYPES = {0: "<u1", 1: "<u2", 2: "<u4", 3: "<u8"}


def _parse(document: Any) -> ShardIndex:
    if not isinstance(document, dict) or not isinstance(document.get("shards"), list):
        raise BadIndex("not an MDS index (no list of 'shards')")
    columns: tuple[Column, ...] | None = None
    shards = []
    for n, entry in enumerate(document["shards"]):
        try:
            these, shard = _shard(entry)
        except BadIndex as e:
            raise BadIndex(f"shard {n}: {e}") from None
        if columns is not None and these != columns:
            raise BadIndex(f"shard {n} has other columns than shard 0; a source reads one layout")
        columns = these
        shards.append(shard)
    return ShardIndex(columns or (), tuple(shards))


def _shard(entry: object) -> tuple[tuple[Column, ...], Shard]:
    if not isinstance(entry, dict):
        raise BadIndex(f"expected an object, got {show(entry)}")
    if entry.get("format") != "mds":
        raise BadIndex(f"format is {show(entry.get('format'))}; zephon reads Streaming's 'mds' shards")
    names, encodings, sizes = (entry.get(k) for k in ("column_names", "column_encodings", "column_sizes"))
    if not (isinstance(names, list) and isinstance(encodings, list) and isinstance(sizes, list)):
        raise BadIndex("column_names, column_encodings and column_sizes must be lists")
    if not len(names) == len(encodings) == len(sizes) or not names:
        raise BadIndex("column_names, column_encodings and column_sizes must be as long as each other (and not empty)")
    if not all(isinstance(x, str) for x in [*names, *encodings]) or len(set(names)) != len(names):
        raise BadIndex("column names and encodings must be strings, the names each once")
    columns = tuple(
        Column(name, encoding, None if size is None else u32(size), size is None)
        for name, encoding, size in zip(names, encodings, sizes)
    )
    raw, packed = entry.get("raw_data"), entry.get("zip_data")
    if not isinstance(raw, dict) or not (packed is None or isinstance(packed, dict)):
        raise BadIndex("raw_data must be an object, zip_data an object or null")
    compression = entry.get("compression")
    codec = None
    if packed is not None:
        algorithm = compression.split(":")[0] if isinstance(compression, str) else compression
        if algorithm not in _CODECS:
            raise BadIndex(f"compression {show(compression)} is not read (zstd, gz, bz2, br, snappy are)")
        codec = _CODECS[algorithm]
    stored = packed if packed is not None else raw
    name = check_basename(stored.get("basename"))
    samples, raw_bytes = u32(entry.get("samples")), u32(raw.get("bytes"))
    if 4 * (samples + 2) > raw_bytes:
        raise BadIndex(f"{samples:,} samples cannot fit in a shard of {raw_bytes:,} bytes")
    return columns, Shard(name, samples, u32(stored.get("bytes")), raw_bytes, codec)


def _ndarray(encoding: str) -> Callable[[bytes], np.ndarray] | None:
    """NDArray's layouts: [dtype code if not in the encoding] [ndim << 2 | shape width, shape if not in it] values."""
    parts = encoding.split(":")
    if parts[0] != "ndarray" or len(parts) > 3 or (len(parts) > 1 and parts[1] not in _VALUE_DTYPES.values()):
        return None
    fixed = np.dtype(parts[1]).newbyteorder("<") if len(parts) > 1 else None
    if len(parts) == 3:
        return None if "," in parts[2] else (lambda data: np.frombuffer(data, fixed))

    def decode(data: bytes) -> np.ndarray:
        at, dtype = 0, fixed
        if dtype is None:
            if not data or data[0] not in _VALUE_DTYPES:
                raise ValueError(f"dtype code {data[:1]!r} is not an integer type")
            dtype, at = np.dtype(_VALUE_DTYPES[data[0]]).newbyteorder("<"), 1
        if len(data) <= at or data[at] >> 2 != 1:
            raise ValueError("not a 1-D array")
        width = 1 << (data[at] & 3)
        if len(data) < at + 1 + width:
            raise ValueError("its shape is cut short")
        (length,) = np.frombuffer(data, _SHAPE_DTYPES[data[at] & 3], 1, at + 1)
        values = data[at + 1 + width :]
        if len(values) != int(length) * dtype.itemsize:
            raise ValueError(f"{len(values)} bytes of values for {int(length)} ids of {dtype}")
        return np.frombuffer(values, dtype)

    return decode


MDS_SHARDS = ShardFormat(
    title="MDS",
    rewrite="rewrite the dataset with streaming.MDSWriter",
    parse=_parse,
    tokens=_ndarray,
)

MDS = sharded_format("mds", MDS_SHARDS, b"shards")
