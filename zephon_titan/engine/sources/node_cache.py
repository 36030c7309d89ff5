"""A node-local cache of whole objects read from object storage (a compressed JSONL file, or an MDS or LitData
shard compressed whole, is one block, read whole), shared by the processes of a node through a folder and file
locks: no service.

`<key>.data` holds an object's bytes, key = a digest of (URI, size, mtime_ns) as listed, the identity the loader
already checks (the fingerprint's `mtimes`): an object rewritten since has another key, so its old bytes are never
served for it. A hit costs no request. `<key>.lock` is the entry's lock (flock): shared while a process reads the
entry, exclusive while one downloads it to a temporary file in the folder and renames it into place (no reader
ever sees part of it); the others wait on it, then read the local copy.

After a download, entries are evicted, least recently used first (each use touches the entry's mtime: atime is often
not kept), until the folder holds at most `max_bytes`; an entry whose lock any process holds is skipped. An evicted
entry leaves `<key>.gone` (its size), so fetching it again soon after is seen: when that keeps happening the working
set does not fit, and one log line says so with the numbers. A folder that cannot be used (not writable, full) is
one warning line; this process then reads from the object store as it would without a cache.
"""

from __future__ import annotations

import errno
import fcntl
import glob
import hashlib
import json
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from functools import lru_cache

from zephon_titan.engine.sources import storage
from zephon_titan.engine.sources.storage import StorageOptions

log = logging.getLogger("zephon_titan")

THRASH_SECONDS = 600.0
"""An entry fetched again within this long of its eviction counts as thrash."""
THRASH_REFETCHES = 3
"""Refetches (by this process) before the note: one can be chance, several mean the working set does not fit."""


def for_path(path: str, options: StorageOptions) -> NodeCache | None:
    """The node cache whole objects at `path` go through, or None (no cache_dir, or a local file)."""
    if not options.cache_dir or not storage.is_uri(path):
        return None
    return _cache(os.path.abspath(options.cache_dir), options.cache_max_bytes)


@lru_cache(maxsize=8)
def _cache(folder: str, max_bytes: int) -> NodeCache:
    return NodeCache(folder, max_bytes)


def key_of(uri: str, size: int, mtime_ns: int) -> str:
    return hashlib.sha256(json.dumps([uri, size, mtime_ns]).encode()).hexdigest()[:40]


class NodeCache:
    """One cache folder, as this process uses it (thread-safe: read-ahead threads fetch too)."""

    def __init__(self, folder: str, max_bytes: int):
        self.folder, self.max_bytes = folder, max_bytes
        self.stats: Counter[str] = Counter()
        """This process's hits, downloads, evictions, refetches (and refetched_bytes)."""
        self.off = ""
        """Why this process stopped using the folder ("" while it uses it)."""
        self._noted_thrash = False
        self._lock = threading.Lock()

    def fetch(self, uri: str, size: int, mtime_ns: int, download: Callable[[], bytes]) -> bytes:
        """The object's bytes: the node's copy, else `download()` (its errors are raised as they are), stored for
        the node's other processes."""
        if self.off or size > self.max_bytes:  # a larger object would evict everything, and still not fit
            return download()
        key = key_of(uri, size, mtime_ns)
        try:
            entry, data = self._open_entry(key, size)
        except OSError as e:
            self._stop_using(e)
            return download()
        if data is not None:
            entry.release()
            self._count("hits")
            return data
        try:  # the entry is locked exclusively: the node's other processes wait for this download
            self._note_refetch(key, size)
            data = download()
            self._count("downloads")
            self._store(key, data)
        finally:
            entry.release()
        if not self.off:
            self._evict()
        return data

    def _open_entry(self, key: str, size: int) -> tuple[_EntryLock, bytes | None]:
        """The entry's lock, held, and its bytes; with no bytes yet the lock is exclusive (this process downloads)."""
        os.makedirs(self.folder, exist_ok=True)
        entry = _EntryLock(self._path(key, "lock"), fcntl.LOCK_SH).__enter__()
        try:
            data = self._read(key, size)
            if data is None:
                entry.exclusive()  # not atomic: another process may have stored it meanwhile
                data = self._read(key, size)
        except BaseException:
            entry.release()
            raise
        return entry, data

    def _store(self, key: str, data: bytes) -> None:
        tmp = f"{self._path(key, 'tmp')}.{os.getpid()}.{threading.get_ident()}"
        try:
            for stale in glob.glob(glob.escape(self._path(key, "tmp")) + ".*"):  # a writer that died (the lock is ours)
                _remove(stale)
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, self._path(key, "data"))
        except OSError as e:
            _remove(tmp)
            self._stop_using(e)

    def _read(self, key: str, size: int) -> bytes | None:
        """The entry's bytes (its use touched), or None if there is none. Called with the entry's lock held."""
        path = self._path(key, "data")
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        if len(data) != size:  # cut short by something outside the cache (never by its own writes): fetch anew
            _remove(path)
            return None
        os.utime(path)
        return data

    def _evict(self) -> None:
        """Least recently used entries out until the folder holds at most max_bytes (one process at a time)."""
        try:
            with _EntryLock(os.path.join(self.folder, ".evict.lock"), fcntl.LOCK_EX, keep=True):
                entries, total, now = [], 0, time.time()
                with os.scandir(self.folder) as listing:
                    for item in listing:
                        name, st = item.name, _stat(item)
                        if st is None:
                            continue
                        if name.endswith(".data"):
                            entries.append((st.st_mtime, name[: -len(".data")], st.st_size))
                            total += st.st_size
                        elif name.endswith(".gone") and now - st.st_mtime > THRASH_SECONDS:
                            _remove(item.path)
                for _, key, size in sorted(entries):
                    if total <= self.max_bytes:
                        break
                    if self._evict_entry(key, size):
                        total -= size
        except OSError as e:
            self._stop_using(e)

    def _evict_entry(self, key: str, size: int) -> bool:
        """Remove an entry no process holds; False if one does."""
        lock = _EntryLock(self._path(key, "lock"), fcntl.LOCK_EX | fcntl.LOCK_NB)
        try:
            lock.__enter__()
        except BlockingIOError:
            return False
        try:
            _remove(self._path(key, "data"))
            with open(self._path(key, "gone"), "w") as f:
                f.write(str(size))
            self._count("evictions")
            lock.remove()
            return True
        finally:
            lock.release()

    def _note_refetch(self, key: str, size: int) -> None:
        gone = self._path(key, "gone")
        try:
            evicted_at = os.stat(gone).st_mtime
            _remove(gone)
        except OSError:
            return
        if time.time() - evicted_at > THRASH_SECONDS:
            return
        self._count("refetches")
        self._count("refetched_bytes", size)
        with self._lock:
            if self._noted_thrash or self.stats["refetches"] < THRASH_REFETCHES:
                return
            self._noted_thrash = True
        need = self._working_set()
        log.warning(
            f"zephon_titan: node cache {self.folder}: {self.stats['refetches']} objects "
            f"({self.stats['refetched_bytes']:,} bytes) were evicted and fetched again within "
            f"{THRASH_SECONDS:.0f} s: the working set (about {need:,} bytes) does not fit [dataloader] "
            f"cache_max_bytes = {self.max_bytes:,}; raise it to at least {need:,} (or give the cache a larger disk)"
        )

    def _working_set(self) -> int:
        """Bytes cached now plus bytes evicted within THRASH_SECONDS: what the node used lately."""
        total = 0
        for path in glob.glob(os.path.join(glob.escape(self.folder), "*.data")):
            total += _size_or_zero(path)
        for path in glob.glob(os.path.join(glob.escape(self.folder), "*.gone")):
            try:
                with open(path) as f:
                    total += int(f.read() or 0)
            except (OSError, ValueError):
                continue
        return total

    def _without_cache(self, error: OSError, download: Callable[[], bytes]) -> bytes:
        self._stop_using(error)
        return download()

    def _stop_using(self, error: OSError) -> None:
        with self._lock:
            if self.off:
                return
            self.off = os.strerror(error.errno) if error.errno else str(error)
        why = "it is full" if error.errno == errno.ENOSPC else f"{self.off}"
        log.warning(
            f"zephon_titan: node cache {self.folder} cannot be used ({why}); this process reads from the object "
            "store without it. Make [dataloader] cache_dir a writable node-local folder with free space, or set it empty"
        )

    def _count(self, what: str, n: int = 1) -> None:
        with self._lock:
            self.stats[what] += n

    def _path(self, key: str, kind: str) -> str:
        return os.path.join(self.folder, f"{key}.{kind}")


class _EntryLock:
    """flock on a lock file, re-opened if the file was removed (an eviction) between its open and its lock, so two
    processes never believe they hold the same entry. `keep`: a lock file that is never removed."""

    def __init__(self, path: str, mode: int, keep: bool = False):
        self.path, self.mode, self.keep = path, mode, keep
        self.fd = -1

    def __enter__(self) -> _EntryLock:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, self.mode)
                if self.keep or os.fstat(fd).st_ino == os.stat(self.path).st_ino:
                    self.fd = fd
                    return self
            except FileNotFoundError:
                pass  # removed after the lock was taken: open the new one
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)

    def exclusive(self) -> None:
        """From shared to exclusive (flock releases, then waits: check what the entry holds again)."""
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        if os.fstat(self.fd).st_ino != _inode(self.path):
            self.release()
            self.mode = fcntl.LOCK_EX
            self.__enter__()

    def remove(self) -> None:
        """Remove the lock file (held exclusively): a process waiting on it re-opens the path."""
        _remove(self.path)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __exit__(self, *exc: object) -> None:
        self.release()


def _inode(path: str) -> int:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return -1


def _stat(item: os.DirEntry[str]) -> os.stat_result | None:
    """An entry's or marker's stat (None for other files, or one removed since the folder was listed)."""
    if not item.name.endswith((".data", ".gone")):
        return None
    try:
        return item.stat()
    except FileNotFoundError:
        return None


def _size_or_zero(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
