"""A JSON Lines file as a whole, before any of its blocks is read: whether it is compressed (then it is one
block), how many blocks it has, whether an index record of it holds, and the first lines `zephon-titan init`
samples. All of it follows from the file's name and size, or reads the file from its start as a stream (init);
it stands apart from jsonl.py, which reads a block's lines for the lanes.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from zephon_titan.config import SourceConfig
from zephon_titan.engine.sources import storage
from zephon_titan.engine.sources.base import FileBlocks
from zephon_titan.engine.sources.init_sample import SAMPLE_ROWS, Sample
from zephon_titan.engine.sources.storage import FileStat
from zephon_titan.errors import ConfigError

_COMPRESSION = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}


def num_blocks(path: str, size: int, block_bytes: int) -> int:
    """The blocks of a JSONL file of `size` bytes (a compressed file is one block)."""
    return min(size, 1) if compression(path) else -(-size // block_bytes)


def compression(path: str) -> str | None:
    """The codec of a compressed JSONL file, by its ending (None: not compressed)."""
    name = path[path.rfind("/") + 1 :].lstrip(".")  # os.path.splitext's extension, without its per-call cost
    dot = name.rfind(".")
    return _COMPRESSION.get(name[dot:]) if dot != -1 else None


def check_record(f: FileBlocks, source: SourceConfig) -> str:
    expected = num_blocks(f.path, f.size, source.block_bytes)
    if f.num_blocks != expected:
        return (
            f"num_blocks is {f.num_blocks}, but {f.size:,} bytes of JSONL in blocks of "
            f"{source.block_bytes:,} bytes make {expected}"
        )
    return "block_rows must be empty for JSONL (its blocks are byte ranges)" if f.block_rows else ""


INIT_SAMPLE_BYTES = 1 << 20  # bytes of JSONL parsed per file init samples
INIT_COUNT_BYTES = 16 << 20  # bytes of a file (compressed) whose lines init counts; the rest is scaled from them


def init_sample(file: FileStat) -> Sample:
    """The first lines (INIT_SAMPLE_BYTES, or up to the end of the first line) parsed; the file's lines counted.
    A handle of its own: the sample reads it as a stream and closes it (a shared, cached one would be left
    closed, or at another position, for the next reader in this process)."""
    with storage.open_own_file(file.path) as handle:
        codec = compression(file.path)
        stream = pa.CompressedInputStream(handle, codec) if codec else handle
        data, whole = b"", False
        while not whole and (len(data) < INIT_SAMPLE_BYTES or b"\n" not in data) and len(data) < 64 * INIT_SAMPLE_BYTES:
            chunk = stream.read(INIT_SAMPLE_BYTES)
            data, whole = data + chunk, not chunk
        lines = data.split(b"\n")
        if not whole:
            lines.pop()  # the line the last read cut off
        records = [_record(line, file.path, n) for n, line in enumerate(lines, 1) if line.strip()]
        documents = len(records) if whole else _count_lines(stream, handle, data.count(b"\n"), file.size)
    texts: dict[str, list[str]] = {}
    others: dict[str, str] = {}
    for record in records[:SAMPLE_ROWS]:
        for key, value in record.items():
            if isinstance(value, str):
                texts.setdefault(key, []).append(value)
            else:
                others.setdefault(key, type(value).__name__)
    read = min(len(records), SAMPLE_ROWS)
    others.update({k: "not a string in every line" for k, v in texts.items() if len(v) < read})
    return Sample({k: v for k, v in texts.items() if len(v) == read}, others, read, documents)


def _count_lines(stream: pa.NativeFile, handle: pa.NativeFile, seen: int, size: int) -> float:
    """The lines of a file `seen` of which were read: counted to its end within INIT_COUNT_BYTES of `handle`
    (the file's own bytes, compressed or not), else scaled from the bytes read."""
    last = b"\n"
    while handle.tell() < INIT_COUNT_BYTES:
        chunk = stream.read(INIT_SAMPLE_BYTES)
        if not chunk:
            return seen + (last != b"\n")  # a last line without a newline is a line too
        seen, last = seen + chunk.count(b"\n"), chunk[-1:]
    return float(seen * size / handle.tell())  # tell() is untyped


def unreadable_json(e: ValueError | RecursionError) -> str | None:
    """What is wrong with a line Python's json refuses although it is JSON (None for any other error): a number of
    more digits than Python converts, or arrays and objects nested deeper than its parser recurses."""
    if isinstance(e, RecursionError):
        return "line nests arrays or objects too deeply for Python's json to read; flatten the record or remove it"
    if isinstance(e, (UnicodeDecodeError, json.JSONDecodeError)):
        return None
    return f"line cannot be read by Python's json ({e}); write the value as a string or remove it"


def _record(line: bytes, path: str, number: int) -> dict[str, Any]:
    try:
        record = json.loads(line.decode("utf-8-sig", "surrogatepass"))  # UTF-8 only, as the lanes read it
    except (ValueError, RecursionError) as e:
        problem = unreadable_json(e) or f"not valid JSON ({e}); fix the line or leave the file out"
        raise ConfigError(f"{path} line {number}: {problem}") from None
    if not isinstance(record, dict):
        raise ConfigError(f"{path} line {number}: a JSON {type(record).__name__}, expected an object per line")
    return record
