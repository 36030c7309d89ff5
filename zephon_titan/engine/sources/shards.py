"""Sample shards: the layout Mosaic Streaming's MDS shards (mds.py) and LitData's chunks (litdata.py) share, read as
blocks. A dataset is a folder: an `index.json` naming its shards (each one's samples, bytes and compression) and
the shard files beside it. A source lists the `index.json` files (`format = "auto"` tells them from JSONL by their
first bytes: Format.sniff); each format's module reads its own index into a `ShardIndex`, and this module does the rest.

A shard (both formats, all little-endian):

    samples                 u32 N
    offsets                 (N + 1) x u32, byte offsets in the shard of each sample and of the end
    ...                     (MDS: the writer's config as JSON; skipped: the offsets say where samples are)
    sample i                [u32 size per sized column] then every column's bytes, in column order

A column's size is in each sample's header, or fixed by its encoding (MDS writes sizes only for columns of no
fixed size; LitData for every leaf). Block k of an uncompressed shard is samples [k * block_rows, (k + 1) *
block_rows): one range read of its offsets and one of its samples, never the whole shard. A shard compressed
whole cannot be read from its middle: it is one block, read whole and decompressed within the size its index
states (a shard that inflates past it is refused, not held). LitData's zstd inside the chunk (framed by batches
of samples, or per sample) is read by ranges as an uncompressed shard is, inflating only the block's frames
(shard_codecs.py). Startup reads each `index.json` (bounded) and lists the
shards' sizes (locally a stat each, on object storage one listing of the folder); no shard is read. Rows are
sample numbers in the shard.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from zephon_titan.config import SourceConfig
from zephon_titan.engine.sources import guards, node_cache, storage
from zephon_titan.engine.sources.base import FileBlocks, Listing, Source
from zephon_titan.engine.sources.block_documents import BlockDocuments, LazyTexts
from zephon_titan.engine.sources.formats import Format
from zephon_titan.engine.sources.init_sample import SAMPLE_ROWS, InitSampling, Sample
from zephon_titan.engine.sources.shard_codecs import framed_samples, inflate, samples_of, zstd_samples
from zephon_titan.engine.sources.shard_index import (
    SHARD_RECORD,
    Column,
    Shard,
    ShardFormat,
    ShardIndex,
    read_index,
    shard_path,
)
from zephon_titan.engine.sources.storage import FileStat, StorageOptions
from zephon_titan.errors import ConfigError, DataError


def shard_blocks(shard: Shard, block_rows: int) -> int:
    return min(shard.samples, 1) if shard.codec else -(-shard.samples // block_rows)


def _stats(index_path: str, index: ShardIndex, options: StorageOptions) -> list[FileStat]:
    """Each shard's file as it is now (locally a stat each; on object storage one listing of the folder)."""
    paths = [shard_path(index_path, s.basename) for s in index.shards]
    if storage.is_uri(index_path):
        listed = {f.path: f for f in storage.expand(posixpath.dirname(index_path), options)}
        missing = next((p for p in paths if p not in listed), None)
        if missing is not None:
            raise DataError(f"{missing}: named by {index_path}, but there is no such object; check the data")
        return [listed[p] for p in paths]
    out = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError as e:
            raise DataError(
                f"{path}: named by {index_path}, but it cannot be read ({e.strerror}); check the data"
            ) from None
        guards.check_regular(path, st)
        out.append(FileStat(path, st.st_size, st.st_mtime_ns))
    return out


class ShardsSource(Source):
    """A source of sharded datasets: one FileBlocks per index.json, its block_rows [samples, size, mtime_ns,
    compressed] per shard (as listed), so an index of the source (index.py) holds what startup would list."""

    row_unit = "sample"

    def __init__(
        self,
        fmt: ShardFormat,
        format_name: str,
        name: str,
        files: Listing,
        text_field: str,
        token_field: str,
        block_rows: int,
        max_document_chars: int,
        storage_options: StorageOptions = StorageOptions(),
    ):
        self.fmt, self._format_name = fmt, format_name
        self.token_field = token_field
        self.block_rows = block_rows
        super().__init__(name, files, text_field, max_document_chars, storage_options)
        # Each file's first block of each shard (blocks of a file are its shards' in order).
        self._shard_starts = [np.cumsum([0, *self._shard_block_counts(f)]) for f in self.files]

    @property
    def format_name(self) -> str:
        return self._format_name

    def _shard_block_counts(self, f: FileBlocks) -> list[int]:
        records = np.array(f.block_rows, dtype=np.int64).reshape(-1, SHARD_RECORD)
        return [min(n, 1) if packed else -(-n // self.block_rows) for n, _, _, packed in records.tolist()]

    def block_weights(self, f: FileBlocks) -> list[float]:
        """Samples in each block of a dataset (init's estimate weighs blocks by them)."""
        out: list[float] = []
        for samples, _, _, packed in _records(f):
            step = samples if packed else self.block_rows
            out += [float(min(step, samples - at)) for at in range(0, samples, max(step, 1))]
        return out

    def describe(self) -> dict[str, Any]:
        # Each shard's samples, size and compression are the layout; its mtime is in `mtimes` (fingerprint).
        shards = [[r[0], r[1], r[3]] for f in self.files for r in _records(f)]
        return {**super().describe(), "block_rows": self.block_rows, "token_field": self.token_field, "shards": shards}

    def fingerprint(self) -> dict[str, str]:
        out = super().fingerprint()
        both = json.dumps([out["mtimes"], [r[2] for f in self.files for r in _records(f)]]).encode()
        out["mtimes"] = hashlib.sha256(both).hexdigest()[:16]
        return out

    def _scan_all(self, files: Listing) -> list[FileBlocks]:
        scanned = super()._scan_all(files)
        if any(isinstance(f, FileStat) for f in files):  # listed now (an index's records were checked when written)
            self._refuse_shared_shards(scanned)
        return scanned

    def _refuse_shared_shards(self, scanned: list[FileBlocks]) -> None:
        """Two listed index.json files naming one shard would read its samples twice: a merged root index (Mosaic's
        `merge_index`) listed beside the per-rank indexes it merges (`**/index.json`)."""
        named: dict[str, str] = {}
        for f in scanned:
            index = read_index(self.fmt, f.path, f.size, f.mtime_ns, self.storage_options)  # cached by _scan
            for shard in index.shards:
                path = shard_path(f.path, shard.basename)
                first = named.setdefault(os.path.realpath(path) if not storage.is_uri(path) else path, f.path)
                if first != f.path:
                    raise ConfigError(
                        f"[dataloader.sources.{self.name}]: {path} is named by both {first} and {f.path}, so its "
                        "samples would be read twice (a merged root index.json beside the indexes it merges?); list "
                        "the root index alone or the parts alone"
                    )

    def _scan(self, file: FileStat) -> FileBlocks:
        index = read_index(self.fmt, file.path, file.size, file.mtime_ns, self.storage_options)
        self.check_column(file.path, [c.name for c in index.columns])
        self._column(file.path, index)
        block_rows: list[int] = []
        for shard, stat in zip(index.shards, _stats(file.path, index, self.storage_options)):
            if shard.stored_bytes is not None and stat.size != shard.stored_bytes:
                raise DataError(
                    f"{stat.path}: {stat.size:,} bytes, but {file.path} says {shard.stored_bytes:,} (a truncated or "
                    f"replaced shard); {self.fmt.rewrite}"
                )
            block_rows += [shard.samples, stat.size, stat.mtime_ns, int(shard.codec is not None)]
        blocks = sum(shard_blocks(s, self.block_rows) for s in index.shards)
        return FileBlocks(file.path, file.size, file.mtime_ns, blocks, tuple(block_rows))

    def _column(self, path: str, index: ShardIndex) -> tuple[int, Callable[[bytes], Any]]:
        """The position of the source's column and its decoder (text or token ids)."""
        position = next(i for i, c in enumerate(index.columns) if c.name == self.column)
        column = index.columns[position]
        if self.token_field:
            decode = self.fmt.tokens(column.encoding)
            if decode is None:
                raise DataError(
                    f"{path}: column {column.name!r} is encoded as {column.encoding!r}, not a 1-D array of integer "
                    f"token ids; set token_field for source {self.name!r} to such a column"
                )
            return position, decode
        if column.encoding not in self.fmt.text_encodings:
            raise DataError(
                f"{path}: column {column.name!r} is encoded as {column.encoding!r}, not text "
                f"({', '.join(sorted(self.fmt.text_encodings))}); set text_field for source {self.name!r}"
            )
        return position, lambda data: data.decode("utf-8")

    def _read(self, file_index: int, local_block: int) -> BlockDocuments:
        f = self.files[file_index]
        starts = self._shard_starts[file_index]
        k = int(np.searchsorted(starts, local_block, side="right")) - 1
        index = read_index(self.fmt, f.path, f.size, f.mtime_ns, self.storage_options)
        records = _records(f)
        if len(index.shards) != len(records) or any(
            (s.samples, int(s.codec is not None)) != (r[0], r[3]) for s, r in zip(index.shards, records)
        ):
            raise self.changed_file(f, "its shards are not the ones listed (the source's index is stale or edited)")
        shard, (samples, size, mtime_ns, _) = index.shards[k], records[k]
        path = shard_path(f.path, shard.basename)
        first = (local_block - int(starts[k])) * self.block_rows
        stop = samples if shard.codec else min(first + self.block_rows, samples)
        position, decode = self._column(f.path, index)
        # A shard compressed whole is read whole: from object storage once per node, through its cache (as a
        # compressed JSONL file is); a hit costs no request.
        cache = node_cache.for_path(path, self.storage_options) if shard.codec else None
        if cache is not None:
            whole = cache.fetch(path, size, mtime_ns, lambda: self._download(path, size, mtime_ns))
            data, offsets = read_samples(None, path, size, shard, first, stop, self.fmt.rewrite, whole)
        else:
            handle = self._open_shard(path, size, mtime_ns)
            data, offsets = read_samples(handle, path, size, shard, first, stop, self.fmt.rewrite)
        base = int(offsets[0])
        layout, rewrite = index.columns, self.fmt.rewrite

        def document(i: int) -> Any:
            raw_value = field(data, int(offsets[i]) - base, int(offsets[i + 1]) - base, layout, position)
            where = f"{path} sample {first + i}"
            if raw_value is None:
                raise DataError(f"{where}: its column sizes do not add up to its bytes; {rewrite}")
            try:
                value = decode(raw_value)
            except (UnicodeDecodeError, ValueError) as e:
                raise DataError(
                    f"{where}: column {layout[position].name!r} cannot be decoded ({e}); {rewrite}"
                ) from None
            if isinstance(value, str):
                self.check_size(value, where)
            return value

        rows = range(first, stop)  # token ids or texts, each decoded when its document is due
        return BlockDocuments(path, LazyTexts(len(rows), document), rows)

    def _open_shard(self, path: str, size: int, mtime_ns: int) -> pa.NativeFile:
        handle = storage.open_input_file(path, (size, mtime_ns), self.storage_options)
        now_size, now_mtime = storage.current_version(path, handle)
        if now_size != size or (now_mtime is not None and now_mtime != mtime_ns):
            raise DataError(
                f"{path}: the shard changed since it was listed ({size:,} bytes then, {now_size:,} now); restore "
                "it, or start a new run (and rebuild the index with `zephon-titan index`)"
            )
        return handle

    def _download(self, path: str, size: int, mtime_ns: int) -> bytes:
        """A whole shard for the node's cache: checked, after it is read, to be the object listed (the node's other
        processes will read these bytes without asking the object store); mtimes to the second, as base.py's."""
        data = storage.read_range(self._open_shard(path, size, mtime_ns), path, 0, size, "the compressed shard")
        now_size, now_mtime = storage.remote_version(path, self.storage_options)
        if now_size != size or (now_mtime and mtime_ns and now_mtime // 10**9 != mtime_ns // 10**9):
            raise DataError(
                f"{path}: the shard was replaced while it was read ({size:,} bytes listed, {now_size:,} now); "
                "restore it, or start a new run (and rebuild the index with `zephon-titan index`)"
            )
        return data


def _records(f: FileBlocks) -> list[tuple[int, int, int, int]]:
    rows = f.block_rows
    return [
        (rows[i], rows[i + 1], rows[i + 2], rows[i + 3]) for i in range(0, len(rows) - SHARD_RECORD + 1, SHARD_RECORD)
    ]


def _slice(data: bytes, path: str, at: int, n: int, what: str) -> bytes:
    if at < 0 or at + n > len(data):
        raise DataError(
            f"{path}: {what} at byte {at:,} is past the end of the decompressed shard ({len(data):,} bytes)"
        )
    return data[at : at + n]


def field(data: bytes, start: int, end: int, columns: tuple[Column, ...], position: int) -> bytes | None:
    """Column `position` of the sample data[start:end] (None: the sample's sizes do not add up to its bytes)."""
    sized = sum(c.sized for c in columns)
    header = start + 4 * sized
    if header > end:
        return None
    sizes = iter(struct.unpack_from(f"<{sized}I", data, start))
    lengths = [next(sizes) if c.sized else c.size or 0 for c in columns]
    if header + sum(lengths) != end:
        return None
    at = header + sum(lengths[:position])
    return data[at : at + lengths[position]]


def read_samples(
    handle: pa.NativeFile | None,
    path: str,
    size: int,
    shard: Shard,
    first: int,
    stop: int,
    rewrite: str,
    whole: bytes | None = None,
) -> tuple[bytes, np.ndarray]:
    """Samples [first, stop) of a shard of `size` bytes, uncompressed: their bytes and offsets (those of a
    shard compressed whole, or of a framed one, in its bytes uncompressed). `whole`: the shard's bytes, when
    they were read already (the node cache's copy); else they are read through `handle`."""
    if shard.codec:
        if whole is None:
            assert handle is not None
            whole = storage.read_range(handle, path, 0, size, "the compressed shard")
        # Never more than the size the index states is inflated.
        raw = inflate(whole, shard.codec, shard.raw_bytes, path, "its index.json states", rewrite)
        return samples_of(lambda at, n, what: _slice(raw, path, at, n, what), path, shard.samples, first, stop)
    assert handle is not None
    read = lambda at, n, what: storage.read_range(handle, path, at, n, what)  # noqa: E731
    if shard.framing == "batch":
        return framed_samples(read, path, size, shard.samples, first, stop, rewrite)
    data, offsets = samples_of(read, path, shard.samples, first, stop)
    if shard.framing == "sample":
        return zstd_samples(data, offsets, path, first, rewrite)
    return data, offsets


def check_record(f: FileBlocks, source: SourceConfig) -> str:
    rows = f.block_rows
    if not rows or len(rows) % SHARD_RECORD:
        return "block_rows must be [samples, size, mtime_ns, compressed] per shard"
    records = _records(f)
    if any(packed not in (0, 1) for *_, packed in records):
        return "a shard's compressed flag must be 0 or 1"
    expected = sum(min(n, 1) if packed else -(-n // source.block_rows) for n, _, _, packed in records)
    if f.num_blocks != expected:
        return (
            f"num_blocks is {f.num_blocks}, but its shards in blocks of {source.block_rows:,} samples make {expected}"
        )
    return ""


def sniffer(first_key: bytes) -> Callable[[bytes], bool]:
    """Whether an index.json's first bytes open a JSON object with `first_key`: the writers sort their keys, and
    Mosaic's `merge_index` (a root index over the indexes of a writer per rank) writes `"version"` before it."""
    import re

    pattern = re.compile(rb'\s*\{\s*(?:"version"\s*:\s*\d+\s*,\s*)?"' + re.escape(first_key) + rb'"\s*:')
    return lambda head: pattern.match(head) is not None


def init_sampler(fmt: ShardFormat) -> Callable[[FileStat], Sample]:
    """`zephon-titan init`'s sample of a dataset: its text columns in the first shard's first samples; its samples."""

    def sample(file: FileStat) -> Sample:
        index = read_index(fmt, file.path, file.size, file.mtime_ns, StorageOptions())
        shard = index.shards[0]
        path = shard_path(file.path, shard.basename)
        with storage.open_own_file(path) as handle:
            stop = min(shard.samples, SAMPLE_ROWS)
            data, offsets = read_samples(handle, path, handle.size(), shard, 0, stop, fmt.rewrite)
        texts: dict[str, list[str]] = {}
        others = {c.name: c.encoding for c in index.columns if c.encoding not in fmt.text_encodings}
        for position, column in enumerate(index.columns):
            if column.encoding in fmt.text_encodings:
                base = int(offsets[0])
                values = [
                    field(data, int(a) - base, int(b) - base, index.columns, position)
                    for a, b in zip(offsets, offsets[1:])
                ]
                texts[column.name] = [v.decode("utf-8", "replace") for v in values if v is not None]
        return Sample(texts, others, stop, sum(s.samples for s in index.shards))

    return sample


def sharded_format(name: str, fmt: ShardFormat, first_key: bytes) -> Format:
    """The registry's Format of a sharded format: a dataset's `index.json` whose first key is `first_key`."""
    return Format(
        name=name,
        extensions=("index.json",),
        sniff=sniffer(first_key),
        open=lambda source, files, max_chars, options: ShardsSource(
            fmt, name, source.name, files, source.text_field, source.token_field, source.block_rows, max_chars, options
        ),
        check_record=check_record,
        token_field=True,
        index_keys=("block_rows",),
        init=InitSampling(fmt.title, ("index.json",), sample_file=init_sampler(fmt)),
    )
