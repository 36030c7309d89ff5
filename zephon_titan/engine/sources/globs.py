"""Glob patterns as Python's glob means them, for local paths and object keys alike.

A pattern as a regex (`*`, `?` and `[...]` within a path segment, a whole `**` segment across any number of them,
a hidden name matched only by a segment that starts with "."), so that an object store's one listing is filtered
as glob.glob would match the same names on disk; and a local `**` glob that visits each directory once, so that
a symlink loop cannot make it run for minutes. It stands apart from storage.py (filesystems, opening and reading)
because it is pure pattern logic, checked against glob.glob by a property test.
"""

from __future__ import annotations

import functools
import glob
import logging
import os
import re

GLOB_CHARS = re.compile(r"[*?\[]")
log = logging.getLogger("zephon_titan")


def glob_each_directory_once(pattern: str) -> list[str]:
    """`glob.glob(pattern, recursive=True)` for a local pattern with a `**` segment, visiting each directory once
    (by device and inode): glob follows every symlink to a directory, so a loop (`loop -> .`) repeats the tree
    below it until paths get too long, and two loops branch at every level (minutes and gigabytes before
    anything is checked). A directory reached again is skipped, and a warning names the paths skipped; the
    walk is in name order, so which path reaches a directory first is the same on every rank."""
    segments = pattern.split(os.sep)
    first = next(i for i, segment in enumerate(segments) if GLOB_CHARS.search(segment) or segment == "**")
    root = os.sep.join(segments[:first]) or (os.sep if pattern.startswith(os.sep) else "")
    hidden_wanted = any(segment.startswith(".") for segment in segments[first:])
    regex = glob_regex(pattern)
    found: list[str] = []
    skipped: list[str] = []
    visited: set[tuple[int, int]] = set()
    stack = [root]
    while stack:
        directory = stack.pop()
        try:
            st = os.stat(directory or ".")
            entries = sorted(os.scandir(directory or "."), key=lambda e: e.name)
        except OSError:  # unreadable, or gone since it was listed: glob skips it too
            continue
        if (st.st_dev, st.st_ino) in visited:
            skipped.append(directory)
            continue
        visited.add((st.st_dev, st.st_ino))
        below = []
        for entry in entries:
            if entry.name.startswith(".") and not hidden_wanted:
                continue  # `*` and `**` never match a hidden name
            path = os.path.join(directory, entry.name) if directory else entry.name
            try:
                is_directory = entry.is_dir()  # follows a symlink, as glob does
            except OSError:
                is_directory = False
            if is_directory:
                below.append(path)
            if regex.fullmatch(path) and not is_directory:
                found.append(path)
        stack.extend(reversed(below))
    if skipped:
        shown = ", ".join(skipped[:3]) + (f" and {len(skipped) - 3} more" if len(skipped) > 3 else "")
        log.warning(
            f"zephon_titan: {pattern!r}: {len(skipped)} symlinked directories reach a directory already listed and "
            f"were skipped ({shown}); each file is read once, by its first path"
        )
    return found


@functools.lru_cache(maxsize=256)  # an index's every record is checked against its source's few patterns
def glob_regex(pattern: str) -> re.Pattern[str]:
    """The standard library's glob as a regex where it has one (Python 3.13+), else ours; the property
    test checks whichever runs against glob.glob on disk."""
    translate = getattr(glob, "translate", None)
    if translate is not None:
        return re.compile(translate(pattern, recursive=True, include_hidden=False))
    return _own_glob_regex(pattern)


def _own_glob_regex(pattern: str) -> re.Pattern[str]:
    """Python's glob semantics (recursive=True) as a regex over object keys: `*`, `?` and `[...]` stay
    within a path segment; a whole `**` segment spans any number of segments (including none); a name
    that starts with "." is matched only by a segment that starts with "." (`**` never matches one)."""
    visible = r"(?!\.)[^/]+"
    out = []
    segments = pattern.split("/")
    for k, segment in enumerate(segments):
        last = k == len(segments) - 1
        if segment == "**":
            out.append(f"(?:{visible}(?:/{visible})*)?" if last else f"(?:{visible}/)*")
            continue
        hidden_ok = segment.startswith(".")
        out.append(("" if hidden_ok else r"(?!\.)") + _segment_regex(segment) + ("" if last else "/"))
    return re.compile("".join(out))


def _segment_regex(segment: str) -> str:
    out, i = [], 0
    while i < len(segment):
        c = segment[i]
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[" and "]" in segment[i + 2 :]:
            end = segment.index("]", i + 2)
            body = segment[i + 1 : end]
            body = "^" + body[1:] if body.startswith("!") else body
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)
