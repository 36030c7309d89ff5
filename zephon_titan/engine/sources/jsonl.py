"""JSON Lines: one JSON object per line, cut into fixed byte ranges.

Block b of a file holds the lines that *start* in bytes [b*B, (b+1)*B) (B =
block_bytes), the rule Hadoop uses for text splits. The block count is known from
the file size alone, so startup reads no data, and a lane reads only its own
byte ranges (plus the tail of one line that crosses its end).

Compressed files (.gz, .zst, .zstd; decompressed with pyarrow's codecs) cannot be
read from the middle, so each is one block; their rows are byte offsets in the
decompressed text. Keep such files moderately sized: a lane reads a whole one.
"""

from __future__ import annotations

import io
import json
import os

import pyarrow as pa

from zephon_titan.errors import DataError
from zephon_titan.engine.sources.base import BlockDocuments, FileBlocks, Source


class JsonlSource(Source):
    row_unit = "byte offset"
    format_name = "jsonl"

    def __init__(self, name: str, files: list[str], text_field: str, block_bytes: int, max_document_chars: int):
        self.block_bytes = block_bytes
        super().__init__(name, files, text_field, max_document_chars)

    def _scan(self, path: str) -> FileBlocks:
        st = os.stat(path)
        blocks = min(st.st_size, 1) if _compression(path) else -(-st.st_size // self.block_bytes)
        return FileBlocks(path, st.st_size, st.st_mtime_ns, blocks)

    def describe(self) -> dict:
        return {**super().describe(), "block_bytes": self.block_bytes}

    def _read(self, file_index: int, local_block: int) -> BlockDocuments:
        path = self.files[file_index].path
        start = local_block * self.block_bytes
        end = start + self.block_bytes
        texts: list[str] = []
        rows: list[int] = []
        codec = _compression(path)
        if codec:
            start, end = 0, float("inf")
        with _open_binary(path, codec) as f:
            if start > 0:
                # The line holding byte start-1 belongs to an earlier block; skip
                # to the first line that starts at or after `start`.
                f.seek(start - 1)
                f.readline()
            pos = f.tell()
            while pos < end:
                line = f.readline()
                if not line:
                    break
                if line.strip():
                    texts.append(self._text_of(line, path, pos))
                    rows.append(pos)
                pos += len(line)
        return BlockDocuments(path, texts, rows)

    def _text_of(self, line: bytes, path: str, offset: int) -> str:
        where = f"{path} at byte {offset}"
        try:
            record = json.loads(line)
        except UnicodeDecodeError as e:
            raise DataError(f"{where}: line is not valid UTF-8 ({e}); re-encode the file as UTF-8") from None
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: line is not valid JSON ({e.msg}, column {e.colno}); fix or remove it") from None
        if not isinstance(record, dict):
            raise DataError(f"{where}: expected a JSON object per line, got {type(record).__name__}")
        if self.text_field not in record:
            keys = ", ".join(sorted(record)[:10])
            raise DataError(
                f"{where}: no field {self.text_field!r} (fields: {keys}); "
                f"set text_field for source {self.name!r}"
            )
        text = record[self.text_field]
        if not isinstance(text, str):
            raise DataError(f"{where}: field {self.text_field!r} is {type(text).__name__}, expected a string")
        self.check_size(text, where)
        return text


_COMPRESSION = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}


def _compression(path: str) -> str | None:
    return _COMPRESSION.get(os.path.splitext(path)[1])


def _open_binary(path: str, codec: str | None):
    if codec is None:
        return open(path, "rb")
    try:
        with pa.input_stream(path, compression=codec) as stream:
            return io.BytesIO(stream.read())  # one block: the whole file, decompressed
    except (pa.ArrowInvalid, OSError) as e:
        raise DataError(f"{path}: cannot decompress as {codec} ({e}); check the file") from None
