"""JSON Lines: one JSON object per line, cut into fixed byte ranges.

Block b of a file holds the lines that *start* in bytes [b*B, (b+1)*B) (B =
block_bytes), the rule Hadoop uses for text splits. The block count is known from
the file size alone, so startup reads no data, and a lane reads only its own
byte ranges (plus the tail of one line that crosses its end).

Compressed files (.gz, .zst, .zstd; decompressed with pyarrow's codecs) cannot be
read from the middle, so each is one block; their rows are byte offsets in the
decompressed text. Keep such files moderately sized: a lane reads a whole one.

This module reads a block's lines for the lanes; what a file is as a whole (compressed or not, its block count,
an index record of it, init's sample of it) is jsonl_files.py's.
"""

from __future__ import annotations

import json
import os
import stat
import threading
import weakref
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa

from zephon_titan.engine.sources import node_cache, storage
from zephon_titan.engine.sources.base import FileBlocks, Listing, Source, shown_names
from zephon_titan.engine.sources.block_documents import BlockDocuments, LazyTexts
from zephon_titan.engine.sources.formats import Format
from zephon_titan.engine.sources.init_sample import InitSampling
from zephon_titan.engine.sources.jsonl_files import check_record, compression, init_sample, num_blocks, unreadable_json
from zephon_titan.engine.sources.storage import FileStat
from zephon_titan.errors import DataError

# The line crossing a block's end is completed in reads of this size, so a block costs at
# most block_bytes + 1 + (its last line's tail rounded up to this) bytes of requests.
TAIL_READ_BYTES = 64 << 10
# Raw bytes of local blocks a process may keep while lanes hold them (see JsonlSource._read).
HELD_BYTES_BUDGET = 128 << 20


class JsonlSource(Source):
    row_unit = "byte offset"
    format_name = "jsonl"

    def __init__(
        self,
        name: str,
        files: Listing,
        text_field: str,
        block_bytes: int,
        max_document_chars: int,
        storage_options: storage.StorageOptions = storage.StorageOptions(),
    ):
        self.block_bytes = block_bytes
        super().__init__(name, files, text_field, max_document_chars, storage_options)

    def _scan(self, file: FileStat) -> FileBlocks:
        return FileBlocks(file.path, file.size, file.mtime_ns, num_blocks(file.path, file.size, self.block_bytes))

    @property
    def max_line_bytes(self) -> int:
        """The longest line that can hold a document within max_document_chars: JSON may spell one
        character in up to 12 bytes (an escaped surrogate pair), plus room for the record's other
        fields. A longer line is refused as soon as this many bytes of it are read, never read whole."""
        return 12 * self.max_document_chars + TAIL_READ_BYTES

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "block_bytes": self.block_bytes}

    def _read(self, file_index: int, local_block: int) -> BlockDocuments:
        f = self.files[file_index]
        codec = compression(f.path)
        data, offset = self._decompressed(f, codec) if codec else self._block_lines(f, local_block)
        start = offset

        def line_number(at: int) -> int:  # only for errors: counts the newlines before `at`
            return data.count(b"\n", 0, at - start) + 1 if codec else self._line_number(f, at)

        # The lines as data.split(b"\n") cuts them, found at once over the block's bytes (not a find per line, nor a
        # copy of each line out); each document's line: its byte offset in the file, and its length.
        too_long, rows, lengths = _document_lines(data, start, self.max_line_bytes)
        if too_long is not None:
            raise self._long_line(f, too_long, line_number(too_long))

        def line(i: int) -> bytes:
            if held is None:
                return self._read_line(f, rows[i], lengths[i])
            return held[rows[i] - start : rows[i] - start + lengths[i]]

        def text(i: int) -> str:
            return self._text_of(line(i), f.path, rows[i], line_number)

        def texts(indices: list[int]) -> list[str]:
            # text(i) for each, with the common line (an object holding the text field as a string, within the
            # size limit) decoded inline: ten calls fewer per document, the cost of short documents (issue 47).
            # Anything else goes through text(i), which decodes it the same way or raises its error.
            out, field, most, scan = [], self.text_field, self.max_document_chars, _SCAN
            for i in indices:
                raw = line(i) if held is None else held[rows[i] - start : rows[i] - start + lengths[i]]
                if raw[:1] == b"{" and raw[1:2] != b"\0":
                    try:
                        decoded = raw.decode("utf-8", "surrogatepass")
                        record, end = scan(decoded, 0)
                    except Exception:  # text(i) raises the line's error in its words
                        decoded, record, end = "", None, -1
                    if end == len(decoded) and type(record) is dict:
                        value = record.get(field)
                        if type(value) is str and len(value) <= most:
                            out.append(value)
                            continue
                out.append(text(i))
            return out

        def record(i: int) -> dict[str, Any]:
            return self._record_of(line(i), f.path, rows[i], line_number)

        # A compressed file cannot be read from the middle, and a request per document to object storage
        # would be slow: those blocks keep their bytes. A local file's block keeps them too while the
        # process's held blocks stay within HELD_BYTES_BUDGET (a few lanes: a read per document costs ~15 %
        # of their tokens/s); past it, a block keeps only where its lines are, and each line is read again
        # when its document is due (from the page cache, usually), so thousands of lanes never hold bytes
        # they have not reached. Either way a document's text is the same.
        fields = self._fields(f.path, data, start, rows, lengths, line_number) if self.pipeline_fields else None
        keep = bool(codec) or storage.is_uri(f.path) or _held_bytes.take(len(data))
        held = data if keep else None
        if held is None:
            del data  # an uncompressed file's line numbers are counted from the file, only on error
        records = record if self.reads_records else None
        block = BlockDocuments(f.path, LazyTexts(len(rows), text, texts), rows, fields=fields, records=records)
        if held is not None and not codec and not storage.is_uri(f.path):
            weakref.finalize(block, _held_bytes.give_back, len(held))
        return block

    def _fields(
        self, path: str, data: bytes, start: int, rows: list[int], lengths: list[int], line_number: Callable[[int], int]
    ) -> pa.Table:
        """The fields the source's pipeline reads, one row per line (a field a record lacks is null)."""
        names = self.pipeline_fields
        derived = {d for p in self.era_pipelines if p is not None for d in p.derived}
        values: dict[str, list[Any]] = {name: [] for name in names}
        present: set[str] = set()
        for offset, length in zip(rows, lengths):
            line = data[offset - start : offset - start + length]
            try:
                record = _decode_json(line)
            except (ValueError, RecursionError):
                record = None
            if not isinstance(record, dict):
                self._text_of(line, path, offset, line_number)  # its one-line error
                raise AssertionError("a line that is not a JSON object parsed")
            present.update(name for name in names if name in record)
            if derived and not derived.isdisjoint(record):
                (name,) = sorted(derived & set(record))[:1]
                raise DataError(
                    f"{path} (byte {offset:,}): source {self.name!r}'s keep or repeat uses {name}, the text's length, "
                    f"but the records have a field {name!r} too; write `{name}` (in backquotes) for the field"
                )
            for name in names:
                values[name].append(record.get(name))
        missing = [name for name in names if name not in present]
        if missing and rows:
            raise DataError(
                f"{path} (from byte {rows[0]:,}): no record of this block has the field {missing[0]!r} that source "
                f"{self.name!r}'s keep or repeat reads; check its name (a record without it gives null)"
            )
        columns = {}
        for name, column in values.items():
            try:
                columns[name] = pa.array(column)
            except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
                raise DataError(
                    f"{path} (from byte {rows[0]:,}): field {name!r} holds values of different types ({e}); "
                    f"source {self.name!r}'s keep or repeat reads it"
                ) from None
        return pa.table(columns) if columns else pa.table({"_": pa.nulls(len(rows))})

    def _read_line(self, f: FileBlocks, offset: int, length: int) -> bytes:
        """One line of a local file, read when its document is due (checked unchanged since it was listed)."""
        handle = _local_handle(f.path, f.size, f.mtime_ns, self.storage_options)
        try:  # one stat per document (check_unchanged's realpath too was ~8 % of a lane's time)
            st = os.stat(f.path)
            same = stat.S_ISREG(st.st_mode) and (st.st_size, st.st_mtime_ns) == (f.size, f.mtime_ns)
        except OSError:
            same = False
        if not same:
            self.check_unchanged(f, handle)  # says what changed (a FIFO now, other size, modified)
        return self._read_exactly(handle, f, offset, offset + length)

    def _block_lines(self, f: FileBlocks, block: int) -> tuple[bytes, int]:
        """The bytes of the lines that start in block `block`, and the offset of the first.

        Reads the block's byte range (plus the byte before it, to know whether a line starts
        at its first byte) and then the tail of the last line, never the whole file.
        """
        start = block * self.block_bytes
        end = min(start + self.block_bytes, f.size)
        first = max(start - 1, 0)
        handle = self._open_checked(f)
        data = self._read_exactly(handle, f, first, end)
        if start > 0:
            # The line holding byte start-1 belongs to an earlier block.
            newline = data.find(b"\n")
            if newline < 0:
                return b"", start
            data, first = data[newline + 1 :], first + newline + 1
        last = data.rfind(b"\n") + 1  # where the line crossing the block's end starts, in data
        tail: list[bytes] = []
        pos, length = end, len(data) - last
        while data and not (tail[-1] if tail else data).endswith(b"\n") and pos < f.size:
            more = self._read_exactly(handle, f, pos, min(pos + TAIL_READ_BYTES, f.size))
            newline = more.find(b"\n")
            tail.append(more if newline < 0 else more[: newline + 1])
            pos += len(more)
            length += len(tail[-1])
            if length > self.max_line_bytes:  # stop here: the rest of the line may be gigabytes
                raise self._long_line(f, first + last, self._line_number(f, first + last))
        return data + b"".join(tail), first

    def _read_exactly(self, handle: pa.NativeFile, f: FileBlocks, start: int, end: int) -> bytes:
        try:
            data: bytes = handle.read_at(end - start, start)
        except OSError as e:
            raise DataError(f"{f.path}: cannot read bytes {start:,}..{end:,} ({e})") from None
        if len(data) != end - start:
            raise self.changed_file(f, f"reading bytes {start:,}..{end:,} returned {len(data):,} bytes")
        return data

    def _decompressed(self, f: FileBlocks, codec: str) -> tuple[bytes, int]:
        """A compressed file is one block: all of it, decompressed."""
        cache = node_cache.for_path(f.path, self.storage_options)
        if cache is None:
            compressed = self._read_exactly(self._open_checked(f), f, 0, f.size)
        else:
            compressed = cache.fetch(f.path, f.size, f.mtime_ns, lambda: self._download(f))
        chunks: list[bytes] = []
        total = line = 0  # line: bytes of the unfinished last line so far
        try:
            with pa.input_stream(pa.py_buffer(compressed), compression=codec) as stream:
                while chunk := stream.read(16 * TAIL_READ_BYTES):
                    newline = chunk.rfind(b"\n")
                    line = len(chunk) - newline - 1 if newline >= 0 else line + len(chunk)
                    if line > self.max_line_bytes:  # stop decompressing: the line may be gigabytes
                        start = total + len(chunk) - line
                        before = sum(c.count(b"\n") for c in chunks) + chunk.count(b"\n", 0, max(start - total, 0))
                        raise self._long_line(f, start, before + 1)
                    chunks.append(chunk)
                    total += len(chunk)
        except (pa.ArrowInvalid, OSError) as e:
            raise DataError(f"{f.path}: cannot decompress as {codec} ({e}); check the file") from None
        return b"".join(chunks), 0

    def _download(self, f: FileBlocks) -> bytes:
        """A whole object for the node's cache: checked, after it is read, to be the one listed (the node's other
        processes will read these bytes without asking the object store)."""
        data = self._read_exactly(self._open_checked(f), f, 0, f.size)
        self._same_object(f, "since it was listed")
        return data

    def _line_number(self, f: FileBlocks, offset: int) -> int:
        """The line starting at byte `offset` of an uncompressed file (for errors: reads the bytes
        before it in bounded chunks, never the whole file at once)."""
        handle, count, pos = self._open_checked(f), 0, 0
        while pos < offset:
            step = min(offset - pos, 64 * TAIL_READ_BYTES)
            count += self._read_exactly(handle, f, pos, pos + step).count(b"\n")
            pos += step
        return count + 1

    def _long_line(self, f: FileBlocks, offset: int, number: int) -> DataError:
        where = " of its decompressed text" if compression(f.path) else ""
        return DataError(
            f"{f.path} line {number:,} (at byte {offset:,}{where}): the line is longer than {self.max_line_bytes:,} "
            f"bytes, more than a document of [dataloader] max_document_chars = {self.max_document_chars:,} can take "
            "(reading stopped there); split the document, or raise the limit if you mean it"
        )

    def _open_checked(self, f: FileBlocks) -> pa.NativeFile:
        handle = storage.open_input_file(f.path, (f.size, f.mtime_ns), self.storage_options)
        self.check_unchanged(f, handle)
        return handle

    def _text_of(self, line: bytes, path: str, offset: int, line_number: Callable[[int], int]) -> str:
        try:
            return self._parse_line(line)
        except _BadLine as e:  # name the line too (counting lines costs a read, so only on error)
            raise DataError(f"{path} line {line_number(offset):,} (at byte {offset:,}): {e}") from None

    def _record_of(self, line: bytes, path: str, offset: int, line_number: Callable[[int], int]) -> dict[str, Any]:
        try:
            return self._parse_record(line)
        except _BadLine as e:
            raise DataError(f"{path} line {line_number(offset):,} (at byte {offset:,}): {e}") from None

    def _parse_record(self, line: bytes) -> dict[str, Any]:
        try:
            record = _decode_json(line)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            if b"\0" in line[:4]:  # what UTF-16 or UTF-32 text looks like, read as UTF-8
                raise _BadLine(
                    "line is not UTF-8 text: the file looks UTF-16 or UTF-32; re-encode it as UTF-8"
                ) from None
            if isinstance(e, UnicodeDecodeError):
                raise _BadLine(f"line is not valid UTF-8 ({e}); re-encode the file as UTF-8") from None
            raise _BadLine(f"line is not valid JSON ({e.msg}, column {e.colno}); fix or remove it") from None
        except (ValueError, RecursionError) as e:  # JSON that Python's json cannot hold
            raise _BadLine(unreadable_json(e) or str(e)) from None
        if not isinstance(record, dict):
            raise _BadLine(f"expected a JSON object per line, got {type(record).__name__}")
        return record

    def _parse_line(self, line: bytes) -> str:
        record = self._parse_record(line)
        if self.text_field not in record:
            keys = shown_names(sorted(record)[:10])
            raise _BadLine(f"no field {self.text_field!r} (fields: {keys}); set text_field for source {self.name!r}")
        text = record[self.text_field]
        if not isinstance(text, str):
            raise _BadLine(f"field {self.text_field!r} is {type(text).__name__}, expected a string")
        problem = self.size_problem(text)
        if problem:
            raise _BadLine(problem)
        return text


_DECODER = json.JSONDecoder()
_SCAN = _DECODER.scan_once  # type: ignore[attr-defined]  # what _DECODER.decode runs: (value, end) from an index


def _decode_json(line: bytes) -> Any:
    """json.loads(line) of a UTF-8 line, without its per-call checks on the common line (an object, so `{` first,
    then no zero byte): the same decoding ("surrogatepass", as json.loads decodes bytes), the same errors. Any other
    line is UTF-8 too (a byte order mark at its start left out, as json.loads does): json.loads would take a line of
    a UTF-16 or UTF-32 file for its own encoding, read the lines whose bytes happen to pair up, and fail only at the
    file's last line, after the lanes trained the rest."""
    if line[:1] == b"{" and line[1:2] != b"\0":
        return _DECODER.decode(line.decode("utf-8", "surrogatepass"))
    return json.loads(line.decode("utf-8-sig", "surrogatepass"))


@lru_cache(maxsize=64)
def _local_handle(path: str, size: int, mtime_ns: int, options: storage.StorageOptions) -> pa.NativeFile:
    """A local file kept open for the documents read one by one (size and mtime in the key: a file
    rewritten under its name is opened anew; JsonlSource._read_line checks it before each read)."""
    return storage.open_input_file(path, (size, mtime_ns), options)


class _ByteBudget:
    """Bytes a process holds against a limit (thread-safe: remote read-ahead threads read blocks too)."""

    def __init__(self, limit: int):
        self.limit, self.used = limit, 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        with self._lock:
            if self.used + n > self.limit:
                return False
            self.used += n
            return True

    def give_back(self, n: int) -> None:
        with self._lock:
            self.used -= n


_held_bytes = _ByteBudget(HELD_BYTES_BUDGET)


class _BadLine(Exception):
    """What is wrong with one line; the caller adds where it is (file, line number, byte)."""


_BLANK = frozenset(b" \t\n\r\x0b\x0c")  # what bytes.strip() removes: a line of only these is blank
_BLANK_BYTES = np.array(sorted(_BLANK), dtype=np.uint8)


def _document_lines(data: bytes, offset: int, most: int) -> tuple[int | None, list[int], list[int]]:
    """The lines of `data` (as data.split(b"\n") cuts them) that are documents, i.e. not blank: each one's byte
    offset (`offset` for the first byte of data) and length without the newline; with the offset of the first
    line longer than `most` bytes, if one is (None if none)."""
    ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
    starts = np.concatenate(([0], ends + 1))
    ends = np.append(ends, len(data))
    sizes = ends - starts
    over = np.flatnonzero(sizes > most)
    if over.size:
        return offset + int(starts[over[0]]), [], []
    lines = np.flatnonzero(sizes)
    first_bytes = np.frombuffer(data, dtype=np.uint8)[starts[lines]]
    maybe_blank = np.isin(first_bytes, _BLANK_BYTES)
    if maybe_blank.any():  # a line that starts with white space is a document unless it is only that
        blank = [bool(i) and not data[starts[k] : ends[k]].strip() for k, i in zip(lines.tolist(), maybe_blank)]
        lines = lines[~np.array(blank, dtype=bool)]
    return None, (offset + starts[lines]).tolist(), sizes[lines].tolist()


JSONL = Format(
    fields=True,
    name="jsonl",
    extensions=tuple(f"{ext}{z}" for ext in (".jsonl", ".json", ".ndjson") for z in ("", ".gz", ".zst", ".zstd")),
    open=lambda source, files, max_chars, options: JsonlSource(
        source.name, files, source.text_field, source.block_bytes, max_chars, options
    ),
    check_record=check_record,
    index_keys=("block_bytes",),
    init=InitSampling("JSONL", (".jsonl", ".jsonl.gz", ".jsonl.zst"), sample_file=init_sample),
)
