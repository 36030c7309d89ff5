"""The batch ledger: one JSON line per optimizer step, to prove two runs saw the same data.

    {"step": 3, "sha256": "...", "rows": 16, "tokens": {"code": 610, "prose": 1454}, "padding": 0}

`sha256` is the global batch digest of engine/digest.py (over the ordered lane
digests), so it can be computed without gathering tokens, and predicted offline.
`tokens` counts the step's slots per source (its (input, label) pairs under
labels = "document"; its tokens, the last label of each row included, under
"stream"; see engine/packing.py), `padding` its padding slots.

A crash or a full disk can stop an append halfway. Each entry is therefore written with
one write() of the whole line, a short write is cut off again, and a restart drops an
incomplete last line (saying so) instead of failing forever; a bad line anywhere else
is corruption, refused naming the file and line.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass

from zephon_titan.engine.spec import EngineSpec
from zephon_titan.errors import DataError

log = logging.getLogger("zephon_titan")

_FIELDS = {"step": int, "sha256": str, "rows": int, "tokens": dict, "padding": int}
_OPTIONAL = {"weights": dict}  # runs with a mixture schedule: the weights in force at the step


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    step: int
    sha256: str
    rows: int
    tokens: dict[str, int]
    padding: int
    weights: dict[str, float] | None = None

    @classmethod
    def of(
        cls,
        step: int,
        sha256: str,
        rows: int,
        source_names: list[str],
        counts: list[int],
        weights: dict[str, float] | None = None,
    ) -> LedgerEntry:
        """From `tally()` counts: per source, then padding (last)."""
        tokens = dict(zip(source_names, counts[:-1]))
        return cls(step=step, sha256=sha256, rows=rows, tokens=tokens, padding=counts[-1], weights=weights)

    def to_json(self) -> str:
        data = asdict(self)
        if self.weights is None:
            del data["weights"]
        return json.dumps(data, sort_keys=True)


def step_weights(spec: EngineSpec, step: int) -> dict[str, float] | None:
    """What the ledger records of the mixture at `step`: its weights under a schedule, else nothing."""
    return spec.schedule.weights_by_name(step) if spec.schedule.scheduled else None


def _entry(raw: bytes) -> LedgerEntry:
    """One line as an entry; ValueError saying what is wrong with it."""
    data = json.loads(raw.decode("utf-8"))  # UnicodeDecodeError and JSONDecodeError are ValueErrors
    if not isinstance(data, dict) or not set(_FIELDS) <= set(data) <= set(_FIELDS) | set(_OPTIONAL):
        raise ValueError(f"expected an object with the fields {', '.join(_FIELDS)}, got {str(data)[:80]}")
    for key, kind in {**_FIELDS, **_OPTIONAL}.items():
        if key in data and type(data[key]) is not kind:  # bool is not an int here
            raise ValueError(f"{key} must be {kind.__name__}, got {data[key]!r:.40}")
    if not all(isinstance(k, str) and type(v) is int for k, v in data["tokens"].items()):
        raise ValueError("tokens must map source names to integers")
    if not all(isinstance(k, str) and type(v) in (int, float) for k, v in data.get("weights", {}).items()):
        raise ValueError("weights must map source names to numbers")
    return LedgerEntry(**data)


def _read(path: str, drop_torn_tail: bool) -> tuple[list[LedgerEntry], int]:
    """The entries, and the number of the incomplete last line that was dropped (0 if none)."""
    entries, bad = [], None
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            if bad is not None:  # a bad line with more after it: not a torn append
                raise DataError(
                    f"{path} line {bad[0]}: not a ledger entry ({bad[1]}); the ledger is corrupt there "
                    "(not an interrupted append, which only ever tears the last line): fix or delete "
                    "that line, or delete the file (`zephon-titan plan` recomputes the entries)"
                )
            if raw.strip():  # NUL bytes (what a crash can leave of an unflushed append) are a bad line
                try:
                    entries.append(_entry(raw))
                except ValueError as e:
                    bad = (number, e)
    if bad is not None and not drop_torn_tail:
        raise DataError(
            f"{path} line {bad[0]}: not a ledger entry ({bad[1]}); it is the last line: a run was "
            "interrupted while appending it? Delete that line to compare the steps before it"
        )
    return entries, bad[0] if bad else 0


def read_ledger(path: str) -> list[LedgerEntry]:
    return _read(path, drop_torn_tail=False)[0]


class LedgerWriter:
    """Appends entries; on resume keeps only the steps up to the checkpoint's step."""

    def __init__(self, path: str, resume_step: int):
        self.path = path
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        kept = []
        if resume_step > 0 and os.path.exists(path):  # a fresh run keeps nothing: no need to read
            entries, torn = _read(path, drop_torn_tail=True)
            if torn:
                log.warning(
                    "zephon: %s line %d was incomplete (a crash or a full disk while appending it); dropped "
                    "it, the run resumes at step %d and writes that step again",
                    path,
                    torn,
                    resume_step,
                )
            kept = [e for e in entries if e.step <= resume_step]
            if not kept or kept[-1].step != resume_step:
                log.warning(
                    "zephon: %s ends at step %d but the run resumes after step %d: the steps between are "
                    "missing from it (`zephon-titan plan` computes them)",
                    path,
                    kept[-1].step if kept else 0,
                    resume_step,
                )
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:  # replaced whole: a crash leaves the old or the new file
            f.writelines(e.to_json() + "\n" for e in kept)
        os.replace(tmp, path)

    def write(self, entry: LedgerEntry) -> None:
        line = (entry.to_json() + "\n").encode("utf-8")
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            try:
                written = os.write(fd, line)  # one write of the whole line
            except OSError:
                os.ftruncate(fd, size)  # a full disk may have taken part of it
                raise
            if written != len(line):
                os.ftruncate(fd, size)  # never leave half a line for the next append to follow
                raise OSError(
                    f"{self.path}: only {written} of the {len(line)} bytes of step {entry.step}'s "
                    "ledger line could be written (disk full?); removed them"
                )
        finally:
            os.close(fd)
