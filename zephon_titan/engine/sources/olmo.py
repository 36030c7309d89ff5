"""OLMo token files: the flat arrays of token ids OLMo and OLMo-core train from (`dolma tokens` writes them;
`*.npy` by name, but raw `np.memmap`s without a NumPy header). Every document ends with the EOS id it was
written with (OLMo-core: "these arrays should include all special tokens already -- such as EOS"), set as
`eos_token_id`; the integer type is `token_dtype` (a raw memmap does not say it).

Blocks follow JSONL's rule, in tokens: block b of a file holds the documents that *start* in tokens
[b*T, (b+1)*T) (T = block_bytes / the token size; a document starts at token 0 or right after an EOS).
The block count is known from the file size alone, so startup reads only each file's first bytes (to refuse
a real `.npy`, whose header would be read as tokens), and a block reads its byte range plus the tail of the
document crossing its end. No tokenization: a document is its ids, its own EOS included; BOS/EOS are added
as configured and never doubled (Source.specials_in_tokens). Rows are the token offsets of the documents.

Metadata: `dolma tokens` writes `<name>.csv.gz` beside each `<name>.npy`, one line per document whose first
two columns are its start and end token (end exclusive; then its id and origin). Where that file is present,
startup reads it (the whole file: ~20 bytes a document, compressed) and checks that its documents tile the
token file exactly, which a wrong `token_dtype` or a truncated file cannot pass. Documents still end at
their EOS (the metadata is not needed to read them, and is not in the fingerprint).
"""

from __future__ import annotations

import gzip
import io
from itertools import accumulate
from typing import Any

import numpy as np
import pyarrow as pa

from zephon_titan.config import SourceConfig
from zephon_titan.engine.sources import storage
from zephon_titan.engine.sources.base import FileBlocks, Listing, Source
from zephon_titan.engine.sources.block_documents import BlockDocuments
from zephon_titan.engine.sources.columns import TokenLists
from zephon_titan.engine.sources.formats import Format
from zephon_titan.engine.sources.init_sample import SAMPLE_FILES, InitSampling, OpenWith, TokenCount
from zephon_titan.engine.sources.storage import FileStat, StorageOptions
from zephon_titan.errors import ConfigError, DataError

NUMPY_MAGIC = b"\x93NUMPY"
# Startup reads each file's first bytes (up to this many) to check that the configured token_dtype and
# eos_token_id can be the ones the file was written with: a raw memmap does not say its type.
SAMPLE_BYTES = 64 << 10
# Fewer ids than this in the sample say nothing about a pattern of zeros.
MIN_PATTERN_IDS = 16
# Dolma metadata: a line per document of at least one token, ~20-200 bytes ("start,end,id,origin").
METADATA_BYTES_PER_TOKEN = 256
METADATA_LINE_BYTES = 64 << 10
# The document crossing a block's end is completed in reads of this many bytes (as JSONL's last line).
TAIL_READ_BYTES = 64 << 10


def metadata_path(npy_path: str) -> str:
    """Where `dolma tokens` writes a token file's metadata."""
    return npy_path[: -len(".npy")] + ".csv.gz" if npy_path.endswith(".npy") else npy_path + ".csv.gz"


def tokens_per_block(block_bytes: int, dtype: np.dtype[Any]) -> int:
    return max(1, block_bytes // dtype.itemsize)


def num_blocks(size: int, block_bytes: int, dtype: np.dtype[Any]) -> int:
    return -(-(size // dtype.itemsize) // tokens_per_block(block_bytes, dtype))


class OlmoSource(Source):
    format_name = "olmo"
    row_unit = "token offset"
    specials_in_tokens = True

    def __init__(
        self,
        name: str,
        files: Listing,
        block_bytes: int,
        token_dtype: str,
        eos_token_id: int,
        max_document_chars: int,
        storage_options: StorageOptions = StorageOptions(),
    ):
        self.block_bytes = block_bytes
        self.token_dtype = token_dtype
        self.dtype = np.dtype(token_dtype).newbyteorder("<")
        self.eos = eos_token_id
        super().__init__(name, files, "", max_document_chars, storage_options)

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "block_bytes": self.block_bytes,
            "token_dtype": self.token_dtype,
            "eos_token_id": self.eos,
        }

    def token_count(self) -> int:
        return sum(f.size for f in self.files) // self.dtype.itemsize

    def _scan(self, file: FileStat) -> FileBlocks:
        if file.size % self.dtype.itemsize:
            raise DataError(
                f"{file.path}: {file.size:,} bytes is not a whole number of {self.token_dtype} tokens (a truncated "
                f"file, or another token_dtype); set token_dtype for source {self.name!r} or re-tokenize the file"
            )
        if file.size:
            self._check_sample(file)
        self._check_metadata(file)
        return FileBlocks(file.path, file.size, file.mtime_ns, num_blocks(file.size, self.block_bytes, self.dtype))

    def _check_sample(self, file: FileStat) -> None:
        """Refuse a file whose first ids (and last) cannot be of the configured token_dtype and eos_token_id:
        a real .npy (its header would be read as ids), ids wider than the dtype (every other id 0: uint32
        ids read as uint16), or no EOS at all where documents must end. Without this a wrong dtype or EOS
        gives each file as one long document of wrong ids, and nothing is said."""
        handle = storage.open_input_file(file.path, (file.size, file.mtime_ns), self.storage_options)
        size = self.dtype.itemsize
        sample = storage.read_range(handle, file.path, 0, min(file.size, SAMPLE_BYTES), "the first bytes")
        if sample[: len(NUMPY_MAGIC)] == NUMPY_MAGIC:
            raise DataError(
                f"{file.path}: a NumPy .npy file with a header, not an OLMo token file (a raw np.memmap of "
                f"token ids); write the ids with np.memmap, or load it and save arr.tofile()"
            )
        ids = np.frombuffer(sample[: len(sample) // size * size], dtype=self.dtype)
        if size < 8 and len(ids) >= MIN_PATTERN_IDS and ids[0::2].any() and not ids[1::2].any():
            raise DataError(
                f"{file.path}: every other {self.token_dtype} id of its first {len(ids):,} is 0, the pattern of "
                f"wider ids (uint{16 * size}) read as {self.token_dtype}; set token_dtype for source {self.name!r} "
                "to the type the file was written with"
            )
        tokens = file.size // size
        if tokens > len(ids) and not (ids == self.eos).any():
            last = np.frombuffer(
                storage.read_range(handle, file.path, file.size - size, size, "the last id"), self.dtype
            )
            if int(last[0]) != self.eos:
                raise DataError(
                    f"{file.path}: no eos_token_id {self.eos} in its first {len(ids):,} {self.token_dtype} ids nor "
                    f"at its end (the last id is {int(last[0])}), where documents must end; set eos_token_id and "
                    f"token_dtype for source {self.name!r} to the ones the file was written with"
                )

    def _check_metadata(self, file: FileStat) -> None:
        """Dolma's metadata, where present: its documents must run from token 0 to the file's last token. The
        file is inflated a line at a time and never past METADATA_BYTES_PER_TOKEN per token of the token file
        (a line per document, each of at least one token): a gzip that inflates to gigabytes is refused
        after that much, not held whole on every rank."""
        path = metadata_path(file.path)
        tokens = file.size // self.dtype.itemsize
        bound = (1 << 20) + METADATA_BYTES_PER_TOKEN * tokens
        data = storage.read_bytes(path, self.storage_options, max_bytes=bound)
        if data is None:
            return
        at, inflated, line = 0, 0, 0
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as lines:
                while raw := lines.readline(METADATA_LINE_BYTES + 1):
                    line, inflated = line + 1, inflated + len(raw)
                    if len(raw) > METADATA_LINE_BYTES or inflated > bound:
                        raise DataError(
                            f"{path} line {line}: "
                            + (
                                f"longer than {METADATA_LINE_BYTES:,} bytes"
                                if len(raw) > METADATA_LINE_BYTES
                                else f"the metadata inflates past {bound:,} bytes for {tokens:,} tokens"
                            )
                            + f"; not dolma metadata of {file.path}: remove or fix it"
                        )
                    if not raw.strip():
                        continue
                    fields = raw.split(b",", 2)
                    start, end = int(fields[0]), int(fields[1])
                    if start != at or end < start:
                        raise DataError(
                            f"{path} line {line}: a document from token {start:,} to {end:,}, but the previous one "
                            f"ended at {at:,}; the metadata does not describe {file.path}"
                        )
                    if end > tokens:
                        raise self._short_of_metadata(path, file, end, tokens)
                    at = end
        except (OSError, EOFError, ValueError, IndexError) as e:  # not gzip, truncated, not start,end,...
            raise DataError(
                f"{path} line {line}: not dolma metadata (gzip CSV of start,end,...: {type(e).__name__}); remove or "
                "fix it"
            ) from None
        if at != tokens:
            raise self._short_of_metadata(path, file, at, tokens)

    def _short_of_metadata(self, path: str, file: FileStat, end: int, tokens: int) -> DataError:
        return DataError(
            f"{path}: its documents end at token {end:,}, but {file.path} holds {tokens:,} {self.token_dtype} "
            "tokens (another token_dtype, or a truncated file?); set token_dtype to the files' type"
        )

    def _read(self, file_index: int, local_block: int) -> BlockDocuments:
        f = self.files[file_index]
        tokens, first = self._block_tokens(f, local_block)
        ends = np.flatnonzero(tokens == self.eos) + 1  # each document ends after its EOS ...
        inner = ends[ends < len(tokens)]  # ... or, the last one, at the file's end
        offsets = np.concatenate([[0], inner, [len(tokens)]]) if len(tokens) else np.zeros(1, dtype=np.int64)
        return BlockDocuments(f.path, TokenLists(tokens, offsets), (first + offsets[:-1]).tolist())

    def _block_tokens(self, f: FileBlocks, block: int) -> tuple[np.ndarray, int]:
        """The tokens of the documents starting in `block`, from the first one's start to the last one's end
        (its EOS, or the file's end), and the token offset of the first. Reads the block's range (and the
        token before it, to know whether a document starts at its first token), then the tail of the last
        document, never the whole file."""
        handle = storage.open_input_file(f.path, (f.size, f.mtime_ns), self.storage_options)
        self.check_unchanged(f, handle)
        n, per_block = f.size // self.dtype.itemsize, tokens_per_block(self.block_bytes, self.dtype)
        start = block * per_block
        end = min(start + per_block, n)
        first = max(start - 1, 0)
        data = self._tokens(handle, f, first, end)
        if start > 0:  # the document holding token start-1 belongs to an earlier block
            ends = np.flatnonzero(data == self.eos)
            if not len(ends) or first + ends[0] + 1 >= end:
                return data[:0], start  # no document starts in this block
            data, first = data[ends[0] + 1 :], first + int(ends[0]) + 1
        if not len(data) or data[-1] == self.eos or end == n:
            return data, first
        inside = np.flatnonzero(data == self.eos)
        last_start = first + (int(inside[-1]) + 1 if len(inside) else 0)
        tail, pos = [data], end
        while pos < n:
            more = self._tokens(handle, f, pos, min(pos + TAIL_READ_BYTES // self.dtype.itemsize, n))
            hit = np.flatnonzero(more == self.eos)
            tail.append(more[: hit[0] + 1] if len(hit) else more)
            pos += len(more)
            if len(hit):
                break
            if pos - last_start > self.max_document_chars:  # stop: the rest of the file may be gigabytes
                raise DataError(
                    f"{f.path} token offset {last_start:,}: no document end (eos_token_id {self.eos}) in "
                    f"{pos - last_start:,} tokens, more than [dataloader] max_document_chars = "
                    f"{self.max_document_chars:,}; is eos_token_id (or token_dtype) the one the file was written with?"
                )
        return np.concatenate(tail), first

    def _tokens(self, handle: pa.NativeFile, f: FileBlocks, start: int, end: int) -> np.ndarray:
        size = self.dtype.itemsize
        data = storage.read_range(handle, f.path, start * size, (end - start) * size, "tokens")
        return np.frombuffer(data, dtype=self.dtype)


def _open(source: SourceConfig, files: Listing, max_chars: int, options: StorageOptions) -> OlmoSource:
    if source.eos_token_id < 0:
        raise ConfigError(
            f"[dataloader.sources.{source.name}] OLMo token files need eos_token_id, the id that ends each "
            "document in them (the EOS of the tokenizer that wrote them: 50279 for OLMo's GPT-NeoX tokenizer, "
            "100257 for dolma2)"
        )
    largest = int(np.iinfo(np.dtype(source.token_dtype)).max)
    if source.eos_token_id > largest:
        raise ConfigError(
            f"[dataloader.sources.{source.name}] eos_token_id = {source.eos_token_id} does not fit token_dtype = "
            f"{source.token_dtype!r} (at most {largest:,}): no document of these files could end; set the "
            "token_dtype the files were written with (uint32 for vocabularies of 65,536 ids or more)"
        )
    return OlmoSource(
        source.name, files, source.block_bytes, source.token_dtype, source.eos_token_id, max_chars, options
    )


def _check_record(f: FileBlocks, source: SourceConfig) -> str:
    dtype = np.dtype(source.token_dtype)
    expected = num_blocks(f.size, source.block_bytes, dtype)
    if f.num_blocks != expected:
        return (
            f"num_blocks is {f.num_blocks}, but {f.size:,} bytes of {source.token_dtype} tokens in blocks of "
            f"{source.block_bytes:,} bytes make {expected}"
        )
    return "block_rows must be empty for OLMo token files (their blocks are byte ranges)" if f.block_rows else ""


def _init_count(where: str, tokenizer: Any, open_with: OpenWith) -> TokenCount:
    """eos_token_id and token_dtype from the tokenizer; tokens from the file sizes, documents from the mean length
    of the documents in the first blocks of up to SAMPLE_FILES files."""
    if tokenizer.eos_id is None:
        raise ConfigError(
            f"{where}: OLMo token files end each document with the tokenizer's EOS, and this "
            "tokenizer adds none; write the job by hand with eos_token_id (docs/configuration.md)"
        )
    dtype = "uint16" if tokenizer.vocab_size <= 1 << 16 else "uint32"
    settings = {
        "eos_token_id": (tokenizer.eos_id, "the tokenizer's EOS: each document of the files ends with it"),
        "token_dtype": (dtype, f"as OLMo-core picks it for a vocabulary of {tokenizer.vocab_size:,} ids"),
    }
    source = open_with({k: v for k, (v, _) in settings.items()})
    assert isinstance(source, OlmoSource)
    tokens = source.token_count()
    starts = list(accumulate(f.num_blocks for f in source.files))  # each file's first block, + its blocks
    firsts = [start - f.num_blocks for start, f in zip(starts, source.files) if f.num_blocks]
    sampled = firsts[:: max(1, len(firsts) // SAMPLE_FILES)][:SAMPLE_FILES]
    lengths = [len(t) for block in map(source.read_block, sampled) for t in block.texts]
    return TokenCount(tokens / max(1.0, sum(lengths) / max(1, len(lengths))), tokens, settings)


OLMO = Format(
    name="olmo",
    extensions=(".npy",),
    open=_open,
    check_record=_check_record,
    index_keys=("block_bytes", "token_dtype"),
    init=InitSampling("OLMo", (".npy",), count_tokens=_init_count),
)
