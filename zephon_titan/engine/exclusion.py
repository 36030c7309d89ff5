"""Documents excluded from a step on (`[dataloader] exclude` and `exclude_from_step`).

The list names one document a line, in either form (blank lines and lines starting with # are skipped):

    <source> <file> <row>      e.g.  web data/part-0001.parquet 1234   (fields split on tabs, else on spaces;
                               the file is everything between the source and the row, so it may hold spaces)
    sha256:<64 hex digits>     the SHA-256 of the document's UTF-8 text (text sources only)

<file> is the file as `inspect` and `where` print it (the source's path, or a unique ending of it) and <row>
is the source's row unit (Parquet row; JSONL byte offset). From step k = exclude_from_step on, a listed
document is skipped where the lane would read it (feed.py): every other document keeps its place in its
source's order. What was drawn before k is handled by the packers (packing.py): a piece already in a row
before step k stays; the rest of a document open at step k is dropped (wrap), and the rows of a best_fit
window drawn before k leave its pieces out (padding in their place) from step k on. Steps before k are
unchanged, byte for byte.

The list's digest (SHA-256 of its normalized entries: sorted, one per line) is part of what defines the rows
from step k: the fingerprint keeps it with k (a resume may set or change an exclusion only after the
checkpoint's step) and the ledger records it at every step from k.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

from zephon_titan.engine.sources import guards
from zephon_titan.engine.sources.base import Source, file_blocks
from zephon_titan.errors import ConfigError

_HEX = re.compile(r"[0-9a-f]{64}")
TEXT_KEY = "sha256:"
# A list of 10^6 entries is ~60 MB; this bound refuses a device-sized or sparse file before reading it.
MAX_LIST_BYTES = 1 << 30
# Rows are byte offsets or row numbers: 19 digits hold any int64.
MAX_ROW_DIGITS = 19


@dataclass(frozen=True, slots=True)
class Entry:
    """One line of the list: a document by place (source, file, row) or by the SHA-256 of its text."""

    line: int
    source: str = ""
    file: str = ""
    row: int = -1
    text_sha256: str = ""

    def normalized(self) -> str:
        return TEXT_KEY + self.text_sha256 if self.text_sha256 else f"{self.source}\t{self.file}\t{self.row}"


def parse_list(path: str) -> list[Entry]:
    """The entries of an exclusion list; ConfigError naming the file and line of a malformed one. The list is a
    regular file of at most MAX_LIST_BYTES, read a line at a time; no message quotes its content (a wrong path
    may name a file that is not a list, /etc/passwd say, whose lines do not belong in a log)."""
    entries: list[Entry] = []
    names: dict[str, str] = {}  # one string per distinct source and file name: a long list names few files
    n = 0
    try:
        with guards.open_bounded(
            path, MAX_LIST_BYTES, "[dataloader] exclude:", fix="point exclude at a list file"
        ) as f:
            for n, raw in enumerate(f, 1):
                entry = _parse_line(path, n, raw.decode("utf-8"))
                if entry is not None:
                    if entry.file:
                        source, file = (
                            names.setdefault(entry.source, entry.source),
                            names.setdefault(entry.file, entry.file),
                        )
                        entry = Entry(n, source, file, entry.row)
                    entries.append(entry)
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"[dataloader] exclude: {path} line {n} is not UTF-8 text (byte {e.start} of the line); give a "
            "UTF-8 text file of entries"
        ) from None
    except OSError as e:
        raise ConfigError(
            f"[dataloader] exclude: cannot read {path} ({e.strerror or e}); give a UTF-8 text file"
        ) from None
    return entries


def _parse_line(path: str, n: int, text: str) -> Entry | None:
    line = text.strip()
    if not line or line.startswith("#"):
        return None
    if line.lower().startswith(TEXT_KEY):
        digest = line[len(TEXT_KEY) :].strip().lower()
        if not _HEX.fullmatch(digest):
            raise ConfigError(
                f"{path} line {n}: 'sha256:' is followed by {len(digest)} characters, not 64 hex digits (the "
                "SHA-256 of a text); fix or remove the line"
            )
        return Entry(n, text_sha256=digest)
    fields = [f.strip() for f in line.split("\t")] if "\t" in line else line.split()
    if len(fields) > 3 and "\t" not in line:  # a file name with spaces: everything between source and row
        fields = [fields[0], line[len(fields[0]) : line.rindex(fields[-1])].strip(), fields[-1]]
    row = fields[-1]
    if len(fields) != 3 or not all(fields) or not (row.isascii() and row.isdigit() and len(row) <= MAX_ROW_DIGITS):
        what = (
            f"{len(fields)} fields"
            if len(fields) != 3 or not all(fields)
            else f"its row ({len(row)} characters) is not a whole number of at most {MAX_ROW_DIGITS} digits 0-9"
        )
        raise ConfigError(
            f"{path} line {n}: not '<source> <file> <row>' (row a whole number >= 0) or 'sha256:<64 hex "
            f"digits>': {what}; fix or remove the line"
        )
    return Entry(n, source=fields[0], file=fields[1], row=int(fields[2]))


def list_digest(entries: Iterable[Entry]) -> str:
    """SHA-256 of the list's normalized entries (sorted, without duplicates): the same documents, the same digest,
    whatever the order, spacing or comments of the file."""
    text = "\n".join(sorted({e.normalized() for e in entries}))
    return hashlib.sha256(text.encode()).hexdigest()


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def files_named(paths: list[str], file: str) -> list[str]:
    """The source's paths a user's `file` may name: the path as listed, the same path spelled otherwise, or the
    paths ending with it (one: found; several: ambiguous)."""
    if file in paths:
        return [file]
    same = [p for p in paths if "://" not in p and os.path.abspath(p) == os.path.abspath(file)]
    return same or [p for p in paths if p.endswith("/" + file.lstrip("/"))]


def resolve_file(paths: list[str], file: str) -> str | None:
    """The source's path for a listed file (None: no such file, or several)."""
    found = files_named(paths, file)
    return found[0] if len(found) == 1 else None


@dataclass(frozen=True, slots=True)
class Exclusion:
    """The documents skipped from step `from_step` on: per source index, its (file, row) keys; and text digests."""

    from_step: int
    digest: str
    places: tuple[frozenset[tuple[str, int]], ...]
    """Per source (the spec's order), the (path, row) of each listed document (paths as the source lists them)."""
    texts: frozenset[str]
    """SHA-256 of the texts listed by digest (matched against every text source)."""
    unplaced_note: str = ""
    """A warning when some entries name no source or file of this job (they match nothing); empty: none."""

    def excludes(self, source: int, file: str, row: int) -> bool:
        return (file, row) in self.places[source]

    def lists_text(self, text: object) -> bool:
        """Whether a document's text is on the list by its SHA-256 (text sources only)."""
        return bool(self.texts) and isinstance(text, str) and text_sha256(text) in self.texts

    def describe(self) -> str:
        """The fingerprint's and the ledger's record: from which step, and which list."""
        return f"from step {self.from_step}, list sha256 {self.digest}"


def build_exclusion(path: str, from_step: int, sources: list[tuple[str, list[str]]]) -> Exclusion:
    """The exclusion of the list at `path` for `sources` ((name, file paths) each, in the spec's order). Entries
    naming no source or file of these sources match nothing: `unplaced_note` says so (a list shared by several
    jobs may name other jobs' sources; a typo must not pass unheard), and `validate` names every one."""
    entries = parse_list(path)
    index = {name: i for i, (name, _) in enumerate(sources)}
    places: list[set[tuple[str, int]]] = [set() for _ in sources]
    unplaced: list[Entry] = []
    resolved: dict[tuple[str, str], str | None] = {}  # (source, file as listed) -> the source's path
    for e in entries:
        if e.text_sha256:
            continue
        key = (e.source, e.file)
        if key not in resolved:
            resolved[key] = resolve_file(sources[index[e.source]][1], e.file) if e.source in index else None
        file = resolved[key]
        if file is None:
            unplaced.append(e)
        else:
            places[index[e.source]].add((file, e.row))
    texts = frozenset(e.text_sha256 for e in entries if e.text_sha256)
    note = ""
    if unplaced:
        first = unplaced[0]
        note = (
            f"[dataloader] exclude: {len(unplaced)} of {len(entries)} entries of {path} name no source or single "
            f"file of this job and exclude nothing (first: line {first.line}, {first.source} {first.file} "
            f"{first.row}); `zephon-titan validate JOB` names every entry it cannot find"
        )
    return Exclusion(from_step, list_digest(entries), tuple(map(frozenset, places)), texts, note)


def missing_entries(entries: list[Entry], sources: list[Source]) -> list[tuple[Entry, str]]:
    """The listed documents none of `sources` holds, each with why (what `validate` reports). Reads the blocks
    of the files named by place, and every block when the list names texts."""
    by_name = {s.name: s for s in sources}
    wanted: dict[tuple[str, str], set[int]] = {}  # (source, path) -> rows listed
    missing: list[tuple[Entry, str]] = []
    placed: list[tuple[Entry, str, str]] = []
    paths_of = {name: [f.path for f in source.files] for name, source in by_name.items()}
    resolved: dict[tuple[str, str], str | None] = {}
    for e in entries:
        if e.text_sha256:
            continue
        if e.source not in by_name:
            missing.append((e, f"no source {e.source!r} (sources: {', '.join(by_name)})"))
            continue
        key = (e.source, e.file)
        if key not in resolved:
            resolved[key] = resolve_file(paths_of[e.source], e.file)
        path = resolved[key]
        if path is None:
            missing.append((e, f"no single file {e.file!r} in source {e.source!r}"))
            continue
        placed.append((e, e.source, path))
        wanted.setdefault((e.source, path), set()).add(e.row)
    texts = {e.text_sha256 for e in entries if e.text_sha256}
    rows_seen: dict[tuple[str, str], set[int]] = {key: set() for key in wanted}
    for source in sources:
        for f in source.files:
            key = (source.name, f.path)
            if key not in wanted and not texts:
                continue
            for block in file_blocks(source, f.path):
                rows_seen.get(key, set()).update(r for r in block.rows if r in wanted.get(key, ()))
                texts -= {text_sha256(t) for t in block.texts if isinstance(t, str)} if texts else set()
    for e, name, path in placed:
        if e.row not in rows_seen[(name, path)]:
            missing.append((e, f"{path} has no document at {by_name[name].row_unit} {e.row}"))
    missing += [(e, "no text with this SHA-256") for e in entries if e.text_sha256 in texts]
    return sorted(missing, key=lambda m: m[0].line)
