"""What every source format provides: a fixed list of blocks, and the documents of one block.

A block is the unit that is dealt to lanes (a Parquet row group, a byte range of a
JSONL file). Blocks are numbered 0..num_blocks-1 in (sorted file, position in file)
order, so the numbering is a pure function of the files.

Source holds the numbering, reads a block once per process for every lane that asks (block_documents.py: what a
block holds), puts it through the source's pipeline (block_pipeline.py), and checks that the files are still the
ones listed. expand_paths lists a source's files (storage.py: where they are).
"""

from __future__ import annotations

import bisect
import glob
import hashlib
import json
import os
import posixpath
import threading
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeAlias

import pyarrow as pa

from zephon_titan.engine.chat import ChatSetup
from zephon_titan.engine.pipeline import SourcePipeline
from zephon_titan.engine.sources import guards, storage
from zephon_titan.engine.sources.block_documents import BlockDocuments
from zephon_titan.engine.sources.block_pipeline import BlockPipeline
from zephon_titan.engine.sources.gc_pause import gc_paused
from zephon_titan.engine.sources.retry import read_with_retries
from zephon_titan.engine.sources.storage import FileStat, StorageOptions
from zephon_titan.engine.transforms import Transform
from zephon_titan.errors import ConfigError, DataError

SCAN_THREADS = 16


def _sha(obj: object) -> str:
    # check_circular=False: the same text at half the cost (lists of 100,000 files' records built here, never cyclic)
    return hashlib.sha256(json.dumps(obj, sort_keys=True, check_circular=False).encode("utf-8")).hexdigest()[:16]


def split_paths(paths: list[str]) -> tuple[list[str], list[str]]:
    """The directories and the names of `paths`, as posixpath.split gives them, each directory worked out once:
    split's answer for a directory depends only on the path up to its last "/", which 100,000 files share."""
    heads: dict[str, str] = {}
    directories, names = [], []
    for path in paths:
        head, sep, name = path.rpartition("/")
        directory = heads.get(head) if head else sep  # "x" has no directory, "/x" the root
        if directory is None:
            directory = heads[head] = posixpath.split(head + sep)[0]
        directories.append(directory)
        names.append(name)
    return directories, names


FileRecord: TypeAlias = list[Any]
"""FileBlocks as a JSON array, [path, size, mtime_ns, num_blocks, block_rows] (index files, worker
hand-off): parsed JSON, so its items are typed only once `index_records` has checked them."""


@dataclass(frozen=True, slots=True)
class FileBlocks:
    """One file's share of the block numbering (also one record of an index)."""

    path: str
    size: int
    mtime_ns: int
    num_blocks: int
    block_rows: tuple[int, ...] = ()
    """Rows per block, for formats whose blocks are row groups (Parquet); empty otherwise."""

    def record(self) -> FileRecord:
        return [self.path, self.size, self.mtime_ns, self.num_blocks, list(self.block_rows)]

    @classmethod
    def from_record(cls, record: FileRecord) -> FileBlocks:
        path, size, mtime_ns, num_blocks, block_rows = record
        return cls(path, size, mtime_ns, num_blocks, tuple(block_rows))


Listing: TypeAlias = list[FileStat] | list[FileBlocks] | list[str]
"""What a source is opened from: listed files to scan (FileStat), records of an index (FileBlocks),
or, for dataset formats (Lance), dataset names (str)."""


class Source(BlockPipeline, ABC):
    """A named collection of files, cut into blocks."""

    row_unit: str = "row"
    token_field: str = ""
    """Columnar formats: a column of token-id lists used instead of text_field."""
    decodes_in_threads: bool = False
    """Reading a block is mostly work that releases the GIL (Parquet's decoding): lanes started together
    read their first windows in threads (source_reader.py), which uses every core where one thread would be slower."""
    specials_in_tokens: bool = False
    """Token-file formats (Megatron, OLMo): a document may already start with the configured BOS or end
    with the configured EOS (written by the tool that tokenized it); it gets none added where it has one,
    so a special token is never doubled. A Parquet `token_field` keeps adding both (its rows predate this)."""

    def __init__(
        self,
        name: str,
        files: Listing,
        text_field: str,
        max_document_chars: int = 64 << 20,
        storage_options: StorageOptions = StorageOptions(),
    ):
        """`files`: the listed files, scanned here, or FileBlocks from an index (trusted as is)."""
        self.name = name
        self.text_field = text_field
        self.max_document_chars = max_document_chars
        self.storage_options = storage_options
        self.era_pipelines: tuple[SourcePipeline | None, ...] = ()
        """Its pipeline in each era of the run (set_pipelines); the last is the config's."""
        self.slots = 1
        """Slots per document in a training window: the largest copies its repeat can ask for in any era."""
        self.transforms: tuple[Transform, ...] = ()
        """Set by open_source from the source's transform list, before any block is read: the config's."""
        self.chat: ChatSetup | None = None
        """A chat source's template and mask rule (engine/chat.py; set by build_engine): its documents are
        conversations read from its records."""
        self.era_chats: tuple[ChatSetup | None, ...] = ()
        """A chat source's setup in each pipeline era where it changes by era (set_era_chats); empty: `chat`."""
        self.era_transforms: tuple[tuple[Transform, ...], ...] = ()
        """Its transforms in each pipeline era of the run (set_era_transforms); empty: `transforms` in every era."""
        self.pipeline_seconds = 0.0
        """CPU time this process spent evaluating it (`zephon-titan validate` reports it per document)."""
        self.files: list[FileBlocks] = self._scan_all(files)
        # first_block[i] is the global number of file i's first block.
        self._first_block: list[int] = []
        total = 0
        for f in self.files:
            self._first_block.append(total)
            total += f.num_blocks
        self.num_blocks = total
        # Blocks some lane of this process holds now (weakly: one goes when the last window holding it
        # does). Lanes whose windows meet the same block (a source with fewer blocks than lanes' windows,
        # or lanes in different epochs) share one copy instead of reading and holding it once each.
        self._held: weakref.WeakValueDictionary[int, BlockDocuments] = weakref.WeakValueDictionary()
        # Blocks being read now, by any thread: a second lane asking for one waits for that read instead
        # of reading (and decoding, and holding) the block a second time.
        self._reading: dict[int, Future[BlockDocuments]] = {}
        self._held_lock = threading.Lock()

    def _scan_all(self, files: Listing) -> list[FileBlocks]:
        if all(isinstance(f, FileBlocks) for f in files):
            return [f for f in files if isinstance(f, FileBlocks)]
        stats = [f for f in files if isinstance(f, FileStat)]
        if not any(storage.is_uri(f.path) for f in stats):
            return [self._scan(f) for f in stats]  # local reads are quicker than handing them to threads
        # Footer reads are latency-bound on object storage: overlap them (results keep file order).
        with ThreadPoolExecutor(max_workers=min(SCAN_THREADS, len(stats))) as pool:
            return list(pool.map(self._scan, stats))

    @abstractmethod
    def _scan(self, file: FileStat) -> FileBlocks:
        """Read just enough of the file to know its block count (no document is read)."""

    @abstractmethod
    def _read(self, file_index: int, local_block: int) -> BlockDocuments:
        """Read the documents of block `local_block` of file `file_index`."""

    @property
    def remote(self) -> bool:
        """Read over the network (object storage): worth reading ahead."""
        return bool(self.files) and storage.is_uri(self.files[0].path)

    def read_block(self, block_id: int) -> BlockDocuments:
        """The documents of a block: read now, or the copy another lane holds or is reading."""
        future, mine = self._claim(block_id)
        if mine:
            self._fill(block_id, future)
        return future.result()

    def read_block_soon(self, block_id: int, pool: Executor) -> Future[BlockDocuments]:
        """The documents of a block, read by a thread of `pool` unless held or being read already."""
        future, mine = self._claim(block_id)
        if mine:
            pool.submit(self._fill, block_id, future)
        return future

    def _claim(self, block_id: int) -> tuple[Future[BlockDocuments], bool]:
        """The block's future (done if a lane holds the block), and whether the caller must read it."""
        if not 0 <= block_id < self.num_blocks:
            raise IndexError(f"source {self.name!r} has {self.num_blocks} blocks, asked for {block_id}")
        with self._held_lock:  # lanes' threads share the cache and the reads under way
            held = self._held.get(block_id)
            if held is not None:
                done: Future[BlockDocuments] = Future()
                done.set_result(held)
                return done, False
            if block_id in self._reading:
                return self._reading[block_id], False
            future = self._reading[block_id] = Future()
            return future, True

    def _fill(self, block_id: int, future: Future[BlockDocuments]) -> None:
        # The last file starting at or before block_id (binary search: a source may have many files).
        file_index = bisect.bisect_right(self._first_block, block_id) - 1
        local = block_id - self._first_block[file_index]
        try:
            if self.remote:  # object storage: transient faults are read again (retry.py)
                f = self.files[file_index]
                block = read_with_retries(
                    lambda: self._read(file_index, local), f"{f.path} block {local}", lambda: self._same_object(f)
                )
            else:
                block = self._read(file_index, local)
            if any(p is not None for p in self.era_pipelines):
                block = self._with_pipeline(block)
            if self.reads_records:
                block = self._transformed(block)
        except BaseException as e:  # every caller waiting for this read gets its error; a later call reads again
            with self._held_lock:
                del self._reading[block_id]
            future.set_exception(e)
            return
        with self._held_lock:
            self._held[block_id] = block
            del self._reading[block_id]
        future.set_result(block)

    def set_pipelines(self, pipelines: tuple[SourcePipeline | None, ...], slots: int) -> None:
        """The source's pipeline in each of the run's eras (engine/pipeline.py), and its windows' slots per document.
        Blocks read before are forgotten: their decisions were for other eras."""
        self.era_pipelines, self.slots = pipelines, slots
        with self._held_lock:
            self._held.clear()

    def set_era_transforms(self, chains: tuple[tuple[Transform, ...], ...]) -> None:
        """The source's transforms in each of the run's eras (transforms.era_transforms). Blocks read before are
        forgotten: their texts were for other eras."""
        names = {tuple(t.describe() for t in chain) for chain in chains}
        self.era_transforms = chains if len(names) > 1 else ()
        with self._held_lock:
            self._held.clear()

    def set_era_chats(self, setups: tuple[ChatSetup | None, ...]) -> None:
        """A chat source's setup in each of the run's eras (chat.era_chats); blocks read before are forgotten."""
        records = {None if c is None else json.dumps(c.era_record(), sort_keys=True) for c in setups}
        self.era_chats = setups if len(records) > 1 else ()
        with self._held_lock:
            self._held.clear()

    @property
    def column(self) -> str:
        """The column holding each document (columnar formats)."""
        return self.token_field or self.text_field

    def check_column(self, path: str, names: list[str]) -> None:
        if self.column not in names:
            which = "token_field" if self.token_field else "text_field"
            raise DataError(
                f"{path}: no column {self.column!r} (columns: {shown_names(names)}); set {which} for source {self.name!r}"
            )
        _named_once(path, self.column, names)

    def check_field(self, path: str, name: str, names: list[str]) -> None:
        """A column the source's keep or repeat reads must be in the file; a derived value they use (chars, bytes)
        must not be the name of one of its columns (which would the expression mean?)."""
        shadowed = [d for p in self.era_pipelines if p is not None for d in p.derived if d in names]
        if shadowed:
            raise DataError(
                f"{path}: source {self.name!r}'s keep or repeat uses {shadowed[0]}, the text's length, but the file has "
                f"a column {shadowed[0]!r} too; write `{shadowed[0]}` (in backquotes) for the column"
            )
        if name not in names:
            raise DataError(
                f"{path}: no column {name!r}, which source {self.name!r}'s keep or repeat reads (columns: "
                f"{shown_names(names)}); fix the expression or the file"
            )
        _named_once(path, name, names)

    def check_size(self, text: str, where: str) -> None:
        problem = self.size_problem(text)
        if problem:
            raise DataError(f"{where}: {problem}")

    def size_problem(self, text: str) -> str:
        """What is wrong with a document's size ("" if nothing)."""
        if len(text) <= self.max_document_chars:
            return ""
        return (
            f"a document of {len(text):,} characters is over [dataloader] max_document_chars = "
            f"{self.max_document_chars:,} (tokenizing it at once needs ~10x its size in memory); "
            "raise the limit if you mean it, or split the document"
        )

    def describe(self) -> dict[str, Any]:
        """Everything about the files that the row stream depends on (for the fingerprint)."""
        return {
            "format": self.format_name,
            "text_field": self.text_field,
            "num_blocks": self.num_blocks,
            "files": [[f.path, f.size, f.mtime_ns, f.num_blocks] for f in self.files],
        }

    def fingerprint(self) -> dict[str, str]:
        """This source's fingerprint components by kind (the fingerprint names each `kind.source`): `files` (a
        summary), `layout` (everything describe() says but where the files are and when they were written),
        `locations` (their directories or prefixes) and `mtimes`. A format contributes through describe()
        (its settings that shape rows) or adds kinds of its own here; a resume may allow `locations` and
        `mtimes` to change (data copied or moved)."""
        with gc_paused():  # lists of 100,000 files' records, all kept until hashed (gc_pause.py)
            d = self.describe()
            files = d["files"]  # [path, size, mtime_ns, blocks] per file
            layout = {k: v for k, v in d.items() if k != "files"}
            directories, names = split_paths([f[0] for f in files])
            return {
                "files": f"{len(files)} files, {sum(f[1] for f in files):,} bytes, {self.num_blocks} blocks",
                "layout": _sha([layout, [[name, f[1], f[3]] for name, f in zip(names, files)]]),
                "locations": _sha(directories),
                "mtimes": _sha([f[2] for f in files]),
            }

    def _same_object(self, f: FileBlocks, when: str = "while a read of it was retried") -> None:
        """After a retried read (or a download for the node's cache): the object still has the listed size and
        last-modified time (to the second: a listing and a HEAD give it at different precisions), so the read got
        the generation listed."""
        size, mtime_ns = storage.remote_version(f.path, self.storage_options)
        if size != f.size or (mtime_ns and f.mtime_ns and mtime_ns // 10**9 != f.mtime_ns // 10**9):
            raise self.changed_file(f, f"it was replaced {when}")

    def check_unchanged(self, f: FileBlocks, handle: pa.NativeFile) -> None:
        """Refuse to read a file that is not the one listed (or indexed): its blocks would differ."""
        try:
            size, mtime_ns = storage.current_version(f.path, handle)
        except OSError as e:
            raise self.changed_file(f, f"it cannot be read any more ({e})") from None
        if size != f.size:
            raise self.changed_file(f, f"it now has {size:,} bytes")
        if mtime_ns is not None and mtime_ns != f.mtime_ns:
            raise self.changed_file(f, "it was modified")

    def changed_file(self, f: FileBlocks, what: str) -> DataError:
        return DataError(
            f"{f.path}: {what}, but it had {f.size:,} bytes and {f.num_blocks} blocks when the source was listed "
            "(or its index was written): the file changed during the run. Restore it, or start a new run "
            "(and rebuild the index with `zephon-titan index`)"
        )

    @property
    @abstractmethod
    def format_name(self) -> str: ...


def expand_paths(source_name: str, patterns: list[str], options: StorageOptions = StorageOptions()) -> list[FileStat]:
    """Expand globs (relative paths start from the current directory; or URIs) into a sorted,
    de-duplicated file list. Sorting makes the block numbering independent of listing order.
    """
    files: dict[str, FileStat] = {}
    for pattern in patterns:
        guards.refuse_credentials_in_path(pattern, f"[dataloader.sources.{source_name}] path")
        relative = not (os.path.isabs(pattern) or storage.is_uri(pattern))
        matches = storage.expand(pattern, options)
        _refuse_a_file_named_like_a_glob(source_name, pattern, matches)
        if not matches:
            if not storage.is_uri(pattern) and os.path.isdir(pattern):
                folder = pattern.rstrip("/")
                raise ConfigError(
                    f"source {source_name!r}: path {pattern!r} is a folder; name its files with a glob "
                    f"({folder + '/*.jsonl'!r}, {folder + '/**/*.parquet'!r}) or, for an MDS or LitData dataset, its "
                    f"index.json ({folder + '/index.json'!r})"
                )
            raise ConfigError(
                f"source {source_name!r}: path {pattern!r} matches no file"
                + (f" (relative to the current directory: {os.path.abspath(pattern)})" if relative else "")
                + "; fix the path or remove it from [dataloader.sources."
                + f"{source_name}] paths"
            )
        files.update((m.path, m) for m in matches)
    guards.refuse_duplicate_targets(source_name, list(files))
    return [files[path] for path in sorted(files)]


def shown_names(names: Iterable[str]) -> str:
    """Field or column names from a data file, for a one-line message: a name with a newline or a terminal escape
    in it is shown as its repr."""
    return ", ".join(n if n.isprintable() else repr(n) for n in names)


def _named_once(path: str, name: str, names: list[str]) -> None:
    """A file may hold two columns of one name (Arrow and Parquet allow it); which one a source means cannot be told."""
    if names.count(name) > 1:
        raise DataError(
            f"{path}: the file has {names.count(name)} columns named {name!r}, so which one to read cannot be told; "
            "rename or drop the others"
        )


def _refuse_a_file_named_like_a_glob(source_name: str, pattern: str, matches: list[FileStat]) -> None:
    """A local file whose name has glob characters (`data[1].jsonl`), named as it is: as a glob it matches other files
    (`data1.jsonl`, read instead of it) or none. Which one was meant cannot be told, so say both."""
    if storage.is_uri(pattern) or not any(c in pattern for c in "*?[") or not os.path.isfile(pattern):
        return
    others = [m.path for m in matches if os.path.abspath(m.path) != os.path.abspath(pattern)]
    if others or not matches:
        found = f"other files ({', '.join(others[:3])}{', ...' if len(others) > 3 else ''})" if others else "no file"
        raise ConfigError(
            f"source {source_name!r}: path {pattern!r} is a file, but as a glob it matches {found}; write "
            f"{glob.escape(pattern)!r} to name the file alone, or rename it"
        )


def file_blocks(source: Source, path: str) -> Iterator[BlockDocuments]:
    """The blocks of one file of the source, in file order (each read when asked for)."""
    first = 0
    for f in source.files:
        if f.path == path:
            yield from map(source.read_block, range(first, first + f.num_blocks))
            return
        first += f.num_blocks
