"""The compressions of sample shards (shards.py), each inflated within a size that is stated before it is read:

- a shard compressed whole (MDS `.mds.zstd`/`.gz`/`.bz2`/`.br`/`.snappy`, LitData `.zstd.bin`): within the size its
  index.json states; it cannot be read from its middle, so it is one block.
- LitData's framed zstd (`compression_level="batch"`, litdata/streaming/framed_zstd.py): a 24-byte prefix (magic
  `LDFZ01\\0\\0`, version u16, flags u16, samples u32, samples per frame K u32, frames u32), the samples' offsets
  ((N + 1) x u32, in the samples' bytes concatenated uncompressed), a frame table (first sample u32, samples u32,
  file offset u64, compressed u32, uncompressed u32 per frame), then the frames, each the zstd of K samples. A
  block reads the prefix, its part of the offsets and of the table, and only the frames that hold its samples.
- LitData's per-sample zstd (`compression_level="sample"`): a classic shard whose samples are each a zstd frame,
  inflated within the size its frame header states.

A frame that inflates past what it states is refused after at most one byte more than that is held; every damaged
header, table or frame is one line naming the file and the frame or sample.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from zephon_titan.engine.sources.shard_index import MAX_SHARD_BYTES, U32
from zephon_titan.errors import DataError

Read = Callable[[int, int, str], bytes]
"""(offset, length, what) -> those bytes of the shard (a range read, or a slice of a decompressed shard)."""

FRAMED_MAGIC = b"LDFZ01\0\0"
PREFIX = struct.Struct("<8sHHIII")
FRAME = struct.Struct("<IIQII")
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def samples_of(read: Read, path: str, samples: int, first: int, stop: int) -> tuple[bytes, np.ndarray]:
    """Samples [first, stop) of a classic shard: their bytes (one read) and offsets (relative to the shard)."""
    (count,) = U32.unpack(read(0, 4, "the sample count"))
    if count != samples:
        raise DataError(
            f"{path}: holds {count:,} samples, its index.json says {samples:,}; the two do not belong together"
        )
    offsets = np.frombuffer(read(4 + 4 * first, 4 * (stop - first + 1), "the sample offsets"), "<u4").astype(np.int64)
    if np.any(np.diff(offsets) < 0) or offsets[0] < 4 + 4 * (count + 1):
        raise DataError(f"{path}: the offsets of samples {first}..{stop - 1} are out of order; the shard is damaged")
    data = read(int(offsets[0]), int(offsets[-1] - offsets[0]), f"samples {first}..{stop - 1}")
    return data, offsets


def inflate(compressed: bytes, codec: str, stated: int, where: str, states: str, rewrite: str) -> bytes:
    """`compressed` inflated, which must give exactly `stated` bytes (`states`: who says so, for the message)."""
    if codec == "snappy":
        return _snappy(compressed, stated, where, states, rewrite)
    chunks, total = [], 0
    try:
        # Streamed in bounded reads: a bomb stops one byte past what it may inflate to, never held whole.
        with pa.input_stream(pa.py_buffer(compressed), compression=codec) as stream:
            while chunk := stream.read(min(16 << 20, stated - total + 1)):
                total += len(chunk)
                if total > stated:
                    break
                chunks.append(chunk)
    except (pa.ArrowInvalid, OSError) as e:
        raise DataError(f"{where}: cannot decompress as {codec} ({str(e)[:120]}); {rewrite}") from None
    if total != stated:
        what = f"more than the {stated:,}" if total > stated else f"{total:,}, not the {stated:,}"
        raise DataError(f"{where}: decompresses to {what} bytes {states}; {rewrite}")
    return b"".join(chunks)


def _snappy(compressed: bytes, stated: int, where: str, states: str, rewrite: str) -> bytes:
    """Raw snappy (python-snappy's `compress`, MDSWriter's 'snappy'): it opens with its size as a varint, checked
    against the stated one before anything is inflated (pyarrow's codec cannot stream it)."""
    size, shift, at = 0, 0, 0
    while at < min(len(compressed), 5):
        byte = compressed[at]
        size |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if not byte & 0x80:
            break
    else:
        raise DataError(f"{where}: not snappy data (its size preamble is cut short or too long); {rewrite}")
    if size != stated:
        raise DataError(f"{where}: snappy data of {size:,} bytes, not the {stated:,} {states}; {rewrite}")
    try:
        raw: bytes = pa.Codec("snappy").decompress(compressed, decompressed_size=stated, asbytes=True)
    except (pa.ArrowInvalid, OSError) as e:
        raise DataError(f"{where}: cannot decompress as snappy ({str(e)[:120]}); {rewrite}") from None
    return raw


def frame_content_size(frame: bytes, where: str, rewrite: str) -> int:
    """The size a zstd frame's header states it inflates to (RFC 8878 3.1.1.1); one that states none is refused,
    as its size would be bounded by nothing."""
    if len(frame) < 6 or frame[:4] != ZSTD_MAGIC:
        raise DataError(f"{where}: not a zstd frame (no zstd magic); {rewrite}")
    descriptor = frame[4]
    single_segment = descriptor >> 5 & 1
    width = (single_segment, 2, 4, 8)[descriptor >> 6]
    at = 5 + (1 - single_segment) + (0, 1, 2, 4)[descriptor & 3]
    if width == 0:
        raise DataError(f"{where}: its zstd frame does not state its size; {rewrite}")
    if len(frame) < at + width:
        raise DataError(f"{where}: its zstd frame header is cut short; {rewrite}")
    return int.from_bytes(frame[at : at + width], "little") + (256 if width == 2 else 0)


def zstd_samples(data: bytes, offsets: np.ndarray, path: str, first: int, rewrite: str) -> tuple[bytes, np.ndarray]:
    """LitData's per-sample zstd: samples_of's bytes and offsets, each sample inflated (offsets from 0)."""
    base, parts, sizes = int(offsets[0]), [], [0]
    for i in range(len(offsets) - 1):
        frame = data[int(offsets[i]) - base : int(offsets[i + 1]) - base]
        where = f"{path} sample {first + i}"
        stated = frame_content_size(frame, where, rewrite)
        if sizes[-1] + stated > MAX_SHARD_BYTES:
            raise DataError(f"{where}: its zstd frame states {stated:,} bytes, past a chunk's 4 GiB; {rewrite}")
        parts.append(inflate(frame, "zstd", stated, where, "its zstd frame header states", rewrite))
        sizes.append(sizes[-1] + stated)
    return b"".join(parts), np.array(sizes, dtype=np.int64)


def framed_samples(
    read: Read, path: str, size: int, samples: int, first: int, stop: int, rewrite: str
) -> tuple[bytes, np.ndarray]:
    """Samples [first, stop) of a LitData framed zstd chunk of `size` bytes: their bytes (uncompressed) and offsets
    (in the samples' bytes concatenated), reading only the frames that hold them."""
    damaged = f"the chunk is damaged; {rewrite}"
    magic, version, flags, count, rows, frames = PREFIX.unpack(read(0, PREFIX.size, "the framed zstd header"))
    if magic != FRAMED_MAGIC:
        raise DataError(
            f"{path}: does not open with LitData's framed zstd magic (LDFZ01), but its index.json says "
            f"compression_level 'batch'; the two do not belong together"
        )
    if version != 1 or flags != 0:
        raise DataError(f"{path}: framed zstd version {version} (flags {flags}); zephon reads version 1; {rewrite}")
    if count != samples:
        raise DataError(
            f"{path}: holds {count:,} samples, its index.json says {samples:,}; the two do not belong together"
        )
    if rows == 0 or frames != -(-count // rows):
        raise DataError(f"{path}: its header says {frames:,} frames of {rows:,} samples for {count:,}; {damaged}")
    table = PREFIX.size + 4 * (count + 1)
    payload = table + FRAME.size * frames
    if payload > size:
        raise DataError(
            f"{path}: its header, offsets and frame table take {payload:,} bytes, the chunk has {size:,}; {damaged}"
        )
    f0, f1 = first // rows, (stop - 1) // rows + 1  # the frames [f0, f1) hold the samples [first, stop)
    lo, hi = f0 * rows, min(count, f1 * rows)
    offsets = np.frombuffer(read(PREFIX.size + 4 * lo, 4 * (hi - lo + 1), "the sample offsets"), "<u4")
    offsets = offsets.astype(np.int64)
    if np.any(np.diff(offsets) < 0) or (lo == 0 and offsets[0] != 0):
        raise DataError(f"{path}: the offsets of samples {lo}..{hi - 1} are out of order; {damaged}")
    entries = read(table + FRAME.size * f0, FRAME.size * (f1 - f0), f"frames {f0}..{f1 - 1} of the frame table")
    spans: list[tuple[int, int, int, int]] = []  # frame, file offset, compressed, uncompressed
    for f in range(f0, f1):
        start, n, at, packed, raw = FRAME.unpack_from(entries, FRAME.size * (f - f0))
        want_n = min(rows, count - f * rows)
        want_raw = int(offsets[min(hi, f * rows + want_n) - lo] - offsets[f * rows - lo])
        follows = spans[-1][1] + spans[-1][2] if spans else payload if f == 0 else at
        if (
            (start, n, raw) != (f * rows, want_n, want_raw)
            or at != follows
            or at < payload
            or packed == 0
            or at + packed > size
        ):
            raise DataError(
                f"{path} frame {f}: the frame table says samples {start:,}+{n:,}, {raw:,} bytes, {packed:,} "
                f"compressed at byte {at:,}; the header and offsets say samples {f * rows:,}+{want_n:,}, "
                f"{want_raw:,} bytes, in a chunk of {size:,}; {damaged}"
            )
        spans.append((f, at, packed, raw))
    begin = spans[0][1]
    blob = read(begin, spans[-1][1] + spans[-1][2] - begin, f"frames {f0}..{f1 - 1}")
    data = b"".join(
        inflate(
            blob[at - begin : at - begin + packed], "zstd", raw, f"{path} frame {f}", "its frame table states", rewrite
        )
        for f, at, packed, raw in spans
    )
    base = int(offsets[0])
    block = offsets[first - lo : stop - lo + 1]
    return data[int(block[0]) - base : int(block[-1]) - base], block
