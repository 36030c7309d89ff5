"""Checks on paths and files that come from configs, globs and indexes: none of them is trusted.

- Only regular files are read. Opening a FIFO for reading waits for a writer (a hang), a
  device can be endless (/dev/zero) and /proc or /sys files report sizes that are not
  the bytes they hold, so each is refused by name before anything is opened.
- One file reached through several paths (a symlink, a symlink loop under `**`) would be
  read once per path: refused, naming the file and the paths.
- Credentials never go in a URL (zephon_titan/urls.py): refused, never printed.
"""

from __future__ import annotations

import itertools
import os
import posixpath
import stat
from collections import Counter, defaultdict
from typing import BinaryIO

from zephon_titan.errors import ConfigError, DataError, ZephonError
from zephon_titan.urls import redact as redact  # re-exported for sources
from zephon_titan.urls import refuse_credentials as refuse_credentials
from zephon_titan.urls import userinfo as userinfo

# Kernel pseudo-filesystems: their files are "regular", but sizes are not what reading returns.
PSEUDO_ROOTS = ("/proc/", "/sys/")


def _kind(mode: int) -> str | None:
    """What a non-regular file is, or None for a regular file."""
    for test, name in (
        (stat.S_ISREG, None),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


SOURCE_FIX = "point the source at regular files (or narrow its glob)"


def check_regular(path: str, st: os.stat_result, error: type[ZephonError] = DataError, fix: str = SOURCE_FIX) -> None:
    """Refuse anything but a regular file on a real filesystem (one line naming the path; `fix`: what to do)."""
    kind = _kind(st.st_mode)
    if kind is not None:
        raise error(f"{path} is {kind}, not a regular file: zephon reads only regular files; {fix}")
    real = os.path.realpath(path)
    if real.startswith(PSEUDO_ROOTS):
        raise error(
            f"{path} is not a regular file: it is {real}, on a kernel pseudo-filesystem whose sizes are not "
            "the bytes it holds; copy the data to a regular file"
        )


def open_regular(path: str, error: type[ZephonError] = DataError, fix: str = SOURCE_FIX) -> int:
    """A read-only descriptor of `path`, checked to be a regular file before and after opening.

    The stat comes first so that no device is ever opened; O_NONBLOCK closes the race with a
    swap to a FIFO between the stat and the open (such an open returns at once instead of
    waiting for a writer), and the fstat checks what was actually opened.
    """
    check_regular(path, os.stat(path), error, fix)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        check_regular(path, os.fstat(fd), error, fix)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_bounded(
    path: str, max_bytes: int, what: str, error: type[ZephonError] = ConfigError, fix: str = SOURCE_FIX
) -> BinaryIO:
    """A regular file (open_regular) of at most `max_bytes`, opened for streaming reads; `what` names it in
    the refusal of a larger one (a sparse file of gigabytes would otherwise be read whole)."""
    fd = open_regular(path, error, fix)
    size = os.fstat(fd).st_size
    if size > max_bytes:
        os.close(fd)
        raise error(
            f"{what} {path} has {size:,} bytes, more than the {max_bytes:,} such a file may have; "
            "is it the file you meant?"
        )
    return os.fdopen(fd, "rb")


def refuse_duplicate_targets(source_name: str, paths: list[str], what: str = "matched paths") -> None:
    """Refuse local paths that resolve to the same file (each copy would be read as data)."""
    local = [path for path in paths if "://" not in path]
    targets = real_paths(local)
    if len(set(targets)) == len(targets):  # each file reached once: the common case, decided by one set
        return
    by_target: defaultdict[str, list[str]] = defaultdict(list)
    for path, target in zip(local, targets):
        by_target[target].append(path)
    for target, same in sorted((t, same) for t, same in by_target.items() if len(same) > 1):
        same = sorted(same, key=lambda p: (len(p), p))
        shown = ", ".join(same[:3]) + (f", ... ({len(same) - 3} more)" if len(same) > 3 else "")
        raise ConfigError(
            f"source {source_name!r}: {len(same)} {what} are one file, {target} ({shown}): a symlink (or a "
            "symlink loop under `**`) reaches it more than once, and each copy would be read as data; remove "
            "the symlink or narrow the glob"
        )


# A folder holding at least this many of the paths is listed once rather than lstat-ed per path; the listing reads at
# most LISTED_PER_PATH entries per path, so a folder of millions of other files costs no more than the lstats would.
LIST_FOLDER_AT = 64
LISTED_PER_PATH = 4


def real_paths(paths: list[str], list_folder_at: int = LIST_FOLDER_AT) -> list[str]:
    """[os.path.realpath(p) for p in paths]: each folder resolved once (_realpath), and whether a file is itself a
    symlink read from one listing of a folder that holds many of the paths (the entry's type comes with it), not
    from one lstat per path: 100,000 files of an index cost a set lookup each."""
    split = [path.rpartition("/") for path in paths]
    counts = Counter(folder for folder, _, _ in split)
    real_folders: dict[str, str] = {}
    listed = {
        folder: _listed_folder(folder, count, real_folders)
        for folder, count in counts.items()
        if count >= list_folder_at and folder and posixpath.normpath(folder) == folder
    }  # a folder as written: "a/../b" or "a/." would be resolved otherwise by the kernel and by _realpath
    out = []
    for path, (folder, _, name) in zip(paths, split):
        prefix, plain = listed.get(folder, _UNLISTED)
        out.append(prefix + name if name in plain else _realpath(path, real_folders))
    return out


_UNLISTED: tuple[str, frozenset[str]] = ("", frozenset())


def _listed_folder(folder: str, wanted: int, real_folders: dict[str, str]) -> tuple[str, frozenset[str]]:
    """The real path of `folder` (ending in "/"), as _realpath resolves it for a file in it, and the names in it that
    are not symlinks: up to LISTED_PER_PATH * `wanted` entries of its listing (the rest are lstat-ed by _realpath)."""
    absolute = folder if folder.startswith("/") else os.path.abspath(folder)
    plain = []
    try:
        with os.scandir(folder) as entries:
            for entry in itertools.islice(entries, LISTED_PER_PATH * wanted):
                if not entry.is_symlink():  # from the listing's entry type; an lstat where the filesystem gives none
                    plain.append(entry.name)
    except OSError:  # unreadable or gone: each path is resolved on its own, as before
        return _UNLISTED
    real = real_folders.get(absolute)
    if real is None:
        real = real_folders[absolute] = os.path.realpath(absolute or "/")
    return f"{real.rstrip('/')}/", frozenset(plain)


def _realpath(path: str, real_folders: dict[str, str]) -> str:
    """os.path.realpath(path), resolving each folder once (`real_folders`): 100,000 files of a few folders cost one
    lstat each (is the file itself a symlink?) instead of one per component of every path."""
    absolute = path if path.startswith("/") else os.path.abspath(path)
    folder, _, name = absolute.rpartition("/")
    try:
        linked = stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        linked = True  # missing or unreadable: the full resolution decides, as before
    if linked or name in ("", ".", ".."):
        return os.path.realpath(path)
    real = real_folders.get(folder)
    if real is None:
        real = real_folders[folder] = os.path.realpath(folder or "/")
    return f"{real.rstrip('/')}/{name}"


def refuse_credentials_in_path(path: str, where: str) -> None:
    """Paths: only URIs (`scheme://...`) have an authority; a local name may contain '@'."""
    if "://" in path:
        refuse_credentials(path, where)
