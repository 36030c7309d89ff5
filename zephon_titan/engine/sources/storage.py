"""Where source files live: the local disk or object storage, behind one small interface.

Every file access goes through a `pyarrow.fs.FileSystem`, so readers only ever ask for byte
ranges (JSONL blocks, Parquet footers and row groups) and never download a whole object to
read one block. A path with a scheme (`s3://bucket/key`, `gs://...`, `hdfs://...`) is resolved
by pyarrow; schemes pyarrow does not know go through fsspec when it is installed. Anything
else is a local path.

S3 settings come from the usual AWS environment (AWS_ENDPOINT_URL, AWS_REGION or
AWS_DEFAULT_REGION, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, AWS_PROFILE,
~/.aws), or from `[dataloader] s3_endpoint_url / s3_region / s3_anonymous`, which win.
GCS (`gs://`) and Azure Blob Storage (`az://`) are configured like their providers' own clients
(clouds.py). Credentials are never read from the job config: it ends up in logs and checkpoints. A listing's
glob patterns are matched as Python's glob matches them (globs.py).
"""

from __future__ import annotations

import glob
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, lru_cache

import pyarrow as pa
from pyarrow import fs as pafs

from zephon_titan.config import DataConfig
from zephon_titan.engine.sources import clouds, globs, guards
from zephon_titan.errors import ConfigError, DataError


@dataclass(frozen=True)
class StorageOptions:
    """Object-storage settings from the config (empty: the environment decides)."""

    s3_endpoint_url: str = ""
    s3_region: str = ""
    s3_anonymous: bool = False
    cache_dir: str = ""
    """A node-local folder for whole objects read from object storage (node_cache.py); empty: no cache."""
    cache_max_bytes: int = 64 << 30

    @classmethod
    def of(cls, config: DataConfig) -> StorageOptions:
        """The options of a DataConfig."""
        return cls(
            config.s3_endpoint_url, config.s3_region, config.s3_anonymous, config.cache_dir, config.cache_max_bytes
        )


@dataclass(frozen=True)
class FileStat:
    path: str
    size: int
    mtime_ns: int


def is_uri(path: str) -> bool:
    return "://" in path


def _scheme(path: str) -> str:
    return path.split("://", 1)[0].lower()


def s3_endpoint(options: StorageOptions) -> str:
    """The S3 endpoint URL: the config's, else the environment's, else "" (AWS)."""
    return options.s3_endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL", "")


def endpoint_of(scheme: str, options: StorageOptions) -> str:
    """The endpoint a scheme's requests go to when it is not the provider's default, or ""."""
    if scheme == "s3":
        return s3_endpoint(options)
    if scheme == "gs":
        return clouds.gcs_emulator()
    if scheme == "hf":
        return clouds.hub_endpoint()
    return clouds.azure_endpoint() if scheme == "az" else ""


@cache
def _filesystem(root: str, options: StorageOptions) -> pafs.FileSystem:
    """One filesystem (and connection pool) per scheme://bucket and settings, per process."""
    scheme = _scheme(root)
    if scheme == "gs":
        return clouds.gcs()
    if scheme == "az":
        return clouds.azure(root)
    if scheme == "hf":
        return clouds.hub()
    if scheme == "s3":
        kwargs: dict[str, str | bool] = {}
        endpoint = s3_endpoint(options)
        if endpoint:
            scheme_part, _, host = endpoint.rpartition("://")
            kwargs["endpoint_override"] = host or endpoint
            if scheme_part:
                kwargs["scheme"] = scheme_part
        region = options.s3_region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region:
            kwargs["region"] = region
        if options.s3_anonymous:
            kwargs["anonymous"] = True
        return pafs.S3FileSystem(**kwargs)
    try:
        return pafs.FileSystem.from_uri(root)[0]
    except Exception as pyarrow_error:  # pyarrow does not know the scheme: try fsspec
        try:
            import fsspec
            from pyarrow.fs import FSSpecHandler, PyFileSystem

            return PyFileSystem(FSSpecHandler(fsspec.filesystem(scheme)))
        except Exception as e:
            raise ConfigError(
                f"cannot open {root!r}: {pyarrow_error}; fsspec: {e}. Use a local path or a scheme pyarrow "
                "supports (s3://, gs://, hdfs://), or install the fsspec backend for this scheme"
            ) from None


def resolve(path: str, options: StorageOptions = StorageOptions()) -> tuple[pafs.FileSystem, str]:
    """The filesystem holding `path` and the path inside it."""
    if not is_uri(path):
        return _local(), os.path.abspath(path)
    guards.refuse_credentials(path, "path")  # never hand a secret to pyarrow, whose errors echo the URI
    scheme, rest = path.split("://", 1)
    if scheme.lower() == "hf":
        clouds.check_pinned(path)
    bucket = rest.split("/", 1)[0]
    return _filesystem(f"{scheme.lower()}://{bucket}", options), rest


@lru_cache(maxsize=1)
def _local() -> pafs.FileSystem:
    return pafs.LocalFileSystem()


def _uri(like: str, inner: str) -> str:
    """The URI of `inner` (a path inside the filesystem of the URI `like`)."""
    return f"{like.split('://', 1)[0]}://{inner}"


def _mtime_ns(info: pafs.FileInfo) -> int:
    return int(info.mtime_ns) if info.mtime_ns is not None else 0


def expand(pattern: str, options: StorageOptions = StorageOptions()) -> list[FileStat]:
    """The files matching `pattern` (`*`, `?`, `[...]`, `**` for any depth), with size and mtime.

    On object storage this is one listing of the longest prefix without wildcards (sizes and
    mtimes come with the listing: no request per file).
    """
    if not is_uri(pattern):
        out: list[FileStat] = []
        matched = (
            globs.glob_each_directory_once(pattern)
            if "**" in pattern.split(os.sep)
            else glob.glob(pattern, recursive=True)
        )
        for match in matched:
            try:
                st = os.stat(match)
            except OSError:  # a dangling symlink: nothing to read
                continue
            if stat.S_ISDIR(st.st_mode):  # `**` and `*` match directories too
                continue
            guards.check_regular(match, st, ConfigError)  # a FIFO or device matched by a glob
            out.append(FileStat(os.path.normpath(match), st.st_size, st.st_mtime_ns))
        return out
    filesystem, inner = resolve(pattern, options)
    try:
        return _expand_remote(pattern, filesystem, inner)
    except (OSError, pa.ArrowException) as e:  # a refused credential is ArrowInvalid, not an OSError
        scheme = _scheme(pattern)
        endpoint, word = endpoint_of(scheme, options), clouds.BUCKET_WORD.get(scheme, "bucket")
        raise ConfigError(
            f"cannot list {pattern!r}: {clouds.one_line(e)}; check the {word} name, the endpoint"
            + (f" ({guards.redact(endpoint)})" if endpoint else "")
            + f" and the credentials ({clouds.CREDENTIALS.get(scheme, 'the environment of its filesystem')})"
        ) from None


def _expand_remote(pattern: str, filesystem: pafs.FileSystem, inner: str) -> list[FileStat]:
    wildcard = globs.GLOB_CHARS.search(inner)
    if wildcard is None:
        info = filesystem.get_file_info(inner)
        if info.type == pafs.FileType.File:
            return [FileStat(pattern, info.size, _mtime_ns(info))]
        if info.type != pafs.FileType.Directory:
            return []
        prefix, regex = inner.rstrip("/"), None  # a "directory": every file under it
    else:
        prefix, regex = inner[: wildcard.start()].rpartition("/")[0], globs.glob_regex(inner)
    infos = filesystem.get_file_info(pafs.FileSelector(prefix, recursive=True, allow_not_found=True))
    top = clouds.top_level(_scheme(pattern), inner)
    if not infos and filesystem.get_file_info(top).type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"{clouds.BUCKET_WORD.get(_scheme(pattern), 'bucket')} {top!r} does not exist")
    return [
        FileStat(_uri(pattern, info.path), info.size, _mtime_ns(info))
        for info in infos
        if info.type == pafs.FileType.File and (regex is None or regex.fullmatch(info.path))
    ]


def matches(pattern: str, path: str) -> bool:
    """Whether `expand(pattern)` could list `path` (checks an index record without listing)."""
    return matcher(pattern)(path)


@lru_cache(maxsize=256)  # an index's every record is checked against its source's few patterns
def matcher(pattern: str) -> Callable[[str], bool]:
    """matches(pattern, path) for any path: `pattern` compiled once."""
    pattern = pattern.rstrip("/") if is_uri(pattern) else os.path.normpath(pattern)
    regex = globs.glob_regex(pattern) if globs.GLOB_CHARS.search(pattern) else None
    prefix = pattern + "/" if is_uri(pattern) else None  # an object-store prefix lists all under it

    def match(path: str) -> bool:
        if path == pattern:
            return True
        if regex is not None:
            return regex.fullmatch(path) is not None
        return prefix is not None and path.startswith(prefix)

    return match


@lru_cache(maxsize=64)
def open_input_file(path: str, listed: tuple[int, int], options: StorageOptions = StorageOptions()) -> pa.NativeFile:
    """A random-access file, kept open (cached) for the blocks that follow. On object storage,
    opening costs one metadata request; reads are range requests. `listed` (size, mtime_ns as
    listed) is part of the cache key, so a file rewritten under the same name is opened anew."""
    return open_own_file(path, options)


def open_own_file(path: str, options: StorageOptions = StorageOptions()) -> pa.NativeFile:
    """A random-access file of the caller's own (not shared: it may read it as a stream, and must close it)."""
    filesystem, inner = resolve(path, options)
    try:
        if not is_uri(path):
            return _open_local(inner)
        return filesystem.open_input_file(inner)
    except PermissionError:
        raise DataError(f"{path}: cannot open it: permission denied; make it readable by the job's user") from None
    except FileNotFoundError:
        raise DataError(f"{path}: cannot open it: it was listed at startup and is gone; check the data") from None
    except OSError as e:
        raise DataError(f"{path}: cannot open it ({e}); it was listed at startup, check that it can be read") from None


def _open_local(path: str) -> pa.NativeFile:
    """A local file checked to be regular (guards.open_regular). pyarrow opens the checked inode
    through /proc/self/fd where Linux has it, not the path, which may have been swapped since."""
    fd = guards.open_regular(path)
    try:
        via = f"/proc/self/fd/{fd}"
        return _local().open_input_file(via if os.path.exists(via) else path)
    finally:
        os.close(fd)


def read_range(handle: pa.NativeFile, path: str, start: int, length: int, what: str) -> bytes:
    """`length` bytes at `start` of an open file, all of them or a DataError naming `what` was read."""
    try:
        data: bytes = handle.read_at(length, start)
    except OSError as e:
        raise DataError(f"{path}: cannot read {what} at byte {start:,} ({e})") from None
    if len(data) != length:
        raise DataError(
            f"{path}: {what} at byte {start:,} is cut short: the file is truncated, or changed since listed"
        )
    return data


def current_version(path: str, handle: pa.NativeFile) -> tuple[int, int | None]:
    """(size, mtime_ns or None) of a file now. Locally one stat (the handle caches its size);
    on object storage the size the open request saw (objects are replaced whole)."""
    if not is_uri(path):
        st = os.stat(path)
        guards.check_regular(path, st)  # replaced by a FIFO or device since it was listed
        return st.st_size, st.st_mtime_ns
    return handle.size(), None


def remote_version(path: str, options: StorageOptions = StorageOptions()) -> tuple[int, int]:
    """(size, last-modified in ns, 0 if unknown) of an object now: one metadata request."""
    filesystem, inner = resolve(path, options)
    info = filesystem.get_file_info(inner)
    if info.type != pafs.FileType.File:
        raise DataError(f"{path}: the object is gone (it was listed at startup); check the bucket")
    return int(info.size or 0), _mtime_ns(info)


def write_bytes(path: str, data: bytes, options: StorageOptions = StorageOptions(), tmp_suffix: str = "") -> None:
    """Write a whole file atomically (object stores replace objects atomically; locally a rename)."""
    if not is_uri(path):
        tmp = f"{path}.tmp{tmp_suffix}{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return
    filesystem, inner = resolve(path, options)
    with filesystem.open_output_stream(inner) as f:
        f.write(data)


def read_bytes(path: str, options: StorageOptions = StorageOptions(), max_bytes: int = 1 << 30) -> bytes | None:
    """A whole (small) file of at most `max_bytes` (a larger one is refused before it is read), or None if it
    does not exist."""
    if not is_uri(path):
        try:
            f = guards.open_bounded(path, max_bytes, "the file")
        except FileNotFoundError:
            return None
        except OSError as e:
            raise ConfigError(f"cannot read {path}: {e}") from None
        with f:
            return f.read()
    filesystem, inner = resolve(path, options)
    try:
        with filesystem.open_input_stream(inner) as f:
            data: bytes = f.read(max_bytes + 1)  # pyarrow is untyped; one byte more tells a larger file
        if len(data) > max_bytes:
            raise ConfigError(
                f"the file {path} has more than the {max_bytes:,} bytes such a file may have; is it the file you meant?"
            )
        return data
    except FileNotFoundError:
        return None
    except OSError as e:
        if is_uri(path) and filesystem.get_file_info(inner).type == pafs.FileType.NotFound:
            return None
        raise ConfigError(f"cannot read {path}: {e}") from None
