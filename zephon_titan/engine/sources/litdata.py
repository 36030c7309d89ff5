"""LitData datasets: `index.json` + `chunk-<rank>-<n>.bin` (or `.zstd.bin`), as `litdata.optimize` writes them with
its default PyTreeLoader. A source lists the `index.json` files; shards.py reads the chunks.

The index (`{"chunks": [...], "config": {...}}`) gives per chunk its `filename`, `chunk_size` (samples) and
`chunk_bytes` (its size uncompressed); `config` the sample's leaves: `data_format` (one serializer name per leaf)
and `data_spec` (the pytree, as JSON: a flat dict's keys are the column names). Every leaf's size is in each
sample's header. A text column is `str` (or `text`); a token column `no_header_numpy:<n>`,
`no_header_tensor:<n>` or `numpy`, 1-D integers. Chunks compressed whole (`compression="zstd"` with
`compression_level="chunk"`, or no level in the index: `.zstd.bin`) are one block each; zstd inside the chunk
(`compression_level="batch"`, litdata's default for zstd, and `"sample"`: `.bin` whose `chunk_bytes` is the file's
size) is read by ranges, blocks of samples as an uncompressed chunk's (shard_codecs.py). Encryption and other item
loaders are refused by name.
"""

from __future__ import annotations

import json
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

# litdata.constants: _NUMPY_DTYPES_MAPPING (its integer part) and _TORCH_DTYPES_MAPPING (its integer part).
_NUMPY = {0: "int8", 1: "int16", 2: "int32", 3: "int64", 4: "uint8", 5: "uint16", 6: "uint32", 7: "uint64"}
_TORCH = {
    11: "uint8",
    12: "int8",
    13: "int16",
    14: "int16",
    15: "int32",
    16: "int32",
    17: "int64",
    18: "int64",
    20: "uint16",
}


def _parse(document: Any) -> ShardIndex:
    if not isinstance(document, dict) or not isinstance(document.get("chunks"), list):
        raise BadIndex("not a LitData index (no list of 'chunks')")
    config = document.get("config")
    if not isinstance(config, dict):
        raise BadIndex("'config' must be an object")
    loader = config.get("item_loader")
    if loader != "PyTreeLoader":
        raise BadIndex(f"item_loader is {show(loader)}; zephon reads PyTreeLoader chunks (samples of named leaves)")
    if config.get("encryption") is not None:
        raise BadIndex("the chunks are encrypted")
    compression, level = config.get("compression"), config.get("compression_level")
    if compression is not None and not (isinstance(compression, str) and compression.split(":")[0] == "zstd"):
        raise BadIndex(f"compression {show(compression)} is not read (zstd is)")
    if compression is not None and level not in (None, "chunk", "batch", "sample"):
        raise BadIndex(f"compression_level {show(level)} is not read (chunk, batch and sample are)")
    # litdata reads an index without a level as "chunk" (framed_zstd.parse_compression_level), as zephon does.
    framing = level if compression is not None and level in ("batch", "sample") else None
    formats, names = config.get("data_format"), _names(config.get("data_spec"))
    if not isinstance(formats, list) or len(formats) != len(names) or not all(isinstance(f, str) for f in formats):
        raise BadIndex("data_format must list one serializer per leaf of data_spec")
    columns = tuple(Column(name, encoding, None, True) for name, encoding in zip(names, formats))
    codec = "zstd" if compression is not None and framing is None else None
    shards = []
    for n, chunk in enumerate(document["chunks"]):
        if not isinstance(chunk, dict):
            raise BadIndex(f"chunk {n}: expected an object, got {show(chunk)}")
        try:
            samples, raw_bytes = u32(chunk.get("chunk_size")), u32(chunk.get("chunk_bytes"))
            if 4 * (samples + 2) > raw_bytes:
                raise BadIndex(f"{samples:,} samples cannot fit in a chunk of {raw_bytes:,} bytes")
            name = check_basename(chunk.get("filename"))
        except BadIndex as e:
            raise BadIndex(f"chunk {n}: {e}") from None
        # chunk_bytes: the file's size, uncompressed or framed (the writer's len(data)); not stated when whole.
        shards.append(Shard(name, samples, None if codec else raw_bytes, raw_bytes, codec, framing))
    return ShardIndex(columns, tuple(shards))


def _names(spec: object) -> list[str]:
    """The column names of a data_spec: the keys of a flat dict (litdata's treespec_dumps, as JSON)."""
    try:
        tree: Any = json.loads(spec)[1] if isinstance(spec, str) else None
        keys = json.loads(tree["context"]) if tree["type"] == "builtins.dict" else None
        leaves = all(child["type"] is None for child in tree["children_spec"])
    except (ValueError, TypeError, KeyError, IndexError) as e:
        raise BadIndex(f"data_spec is not a pytree LitData writes ({show(e)})") from None
    if not (isinstance(keys, list) and leaves and all(isinstance(k, str) for k in keys)):
        raise BadIndex("samples are not flat dicts of named leaves (data_spec); zephon reads columns by name")
    if len(set(keys)) != len(keys) or len(keys) != len(tree["children_spec"]):
        raise BadIndex("data_spec names a column twice, or not one per leaf")
    return keys


def _tokens(encoding: str) -> Callable[[bytes], np.ndarray] | None:
    kind, _, code = encoding.partition(":")
    table = {"no_header_numpy": _NUMPY, "no_header_tensor": _TORCH}.get(kind)
    if table is not None:
        name = table.get(int(code)) if code.isdigit() else None
        return None if name is None else (lambda data: np.frombuffer(data, np.dtype(name).newbyteorder("<")))
    return _numpy if encoding == "numpy" else None


def _numpy(data: bytes) -> np.ndarray:
    """litdata's NumpySerializer: dtype index u32, ndim u32, shape (ndim x u32), values."""
    if len(data) < 12:
        raise ValueError("its header is cut short")
    code, ndim, length = np.frombuffer(data, "<u4", 3)
    if int(code) not in _NUMPY or int(ndim) != 1:
        raise ValueError("not a 1-D array of integers")
    dtype = np.dtype(_NUMPY[int(code)]).newbyteorder("<")
    if len(data) - 12 != int(length) * dtype.itemsize:
        raise ValueError(f"{len(data) - 12} bytes of values for {int(length)} ids of {dtype}")
    return np.frombuffer(data, dtype, offset=12)


LITDATA_SHARDS = ShardFormat(
    title="LitData",
    rewrite="rewrite the dataset with litdata.optimize",
    parse=_parse,
    tokens=_tokens,
    text_encodings=frozenset({"str", "text"}),
)

LITDATA = sharded_format("litdata", LITDATA_SHARDS, b"chunks")
