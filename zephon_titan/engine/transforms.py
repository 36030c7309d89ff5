"""Your own transforms: a Python function per source that rewrites a record's text or drops the record.

    [dataloader.sources.web]
    transform = ["my_cleanup.text:strip_boilerplate"]     # module:function, applied in order

A transform takes the record (a dict of its columns or JSON fields, the text included) and returns the new text
(a str), a new record (a dict: its text field is the text), or None to drop the document. It runs where the lane
reads its documents (in the worker processes when num_workers > 0, which import it by the same name), after
`keep` and `repeat` have decided on the record's columns.

Rows must stay a pure function of the files and the config, so a transform is held to it:
- its identity is in the fingerprint (`transform.<source>`): module, name and a SHA-256 of its source code, or the
  `version` attribute the function declares (`fn.version = "2"`) for code whose source cannot be read or that
  should be versioned by hand;
- when the job starts, every transform runs on a sample of real documents twice, forwards and backwards (the same
  output for a record whatever came before it: no state carried across documents), and once more in a fresh
  Python process with another hash seed (no dependence on set or dict order, id() or the process); any difference
  is one line naming the function and the document.
A checkpoint never runs code: a job that names a transform runs it in every tool that reads rows (the trainer,
`validate`, `plan`, `inspect`, `where`), as TorchTitan's `[model] module` does.

The batched form, for work that pays per call (a classifier): a function that declares `fn.batched = True` takes a
list of records and returns a list as long, each item what the per-record form returns. It is called once per
block (a Parquet row group, a JSONL block) over the block's documents that some keep lets through, and its results
are held while the block is. Which records share a call depends on blocks and keeps, never on lanes or ranks, but
the declaration promises more: a record's result does not depend on the others in its list. The startup check holds
it to that: the sample in one call against each record alone, in reverse order.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import os
import pickle
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from zephon_titan.errors import ConfigError, DataError, ResumeError

# Documents of a source each transform is checked on when the job starts (from its first blocks).
SAMPLE_DOCUMENTS = 16
FRESH_TIMEOUT_S = 120  # the fresh process's run of the sample (its start and imports included)
_checked: set[tuple[str, str]] = set()  # (reference, digest) checked in this process


@dataclass(frozen=True)
class Transform:
    reference: str
    """`module:function` as the config names it."""
    function: Callable[[dict[str, Any]], Any]
    digest: str
    """What identifies its code: `version <v>` or the SHA-256 of its source (16 hex digits)."""
    batched: bool = False
    """The function takes a list of records and returns a list as long (`fn.batched = True`)."""

    def describe(self) -> str:
        return f"{self.reference} ({self.digest})" + (" batched" if self.batched else "")

    def apply(self, record: dict[str, Any], text_field: str, where: str) -> str | None:
        """The document's new text, or None to drop it; DataError naming the function and `where`."""
        return self._text(self._call(record, where), text_field, where)

    def apply_batch(self, records: list[dict[str, Any]], text_field: str, wheres: list[str], block: str) -> list[Any]:
        """A batched transform over `records`: each one's new text or None; DataError naming the function and the
        record (`wheres`), or the `block` where the call as a whole failed."""
        out = self._call(records, block)
        if not isinstance(out, (list, tuple)) or len(out) != len(records):
            got = f"{len(out)} results" if isinstance(out, (list, tuple)) else type(out).__name__
            raise DataError(
                f"{block}: batched transform {self.reference} returned {got} for {len(records)} records; return a "
                "list with one result per record, in order"
            )
        return [self._text(item, text_field, where) for item, where in zip(out, wheres)]

    def _call(self, argument: Any, where: str) -> Any:
        try:
            return self.function(argument)
        except (Exception, SystemExit) as e:  # the user's code: any error (an exit too), said as one line
            first = str(e).splitlines()[0] if str(e) else ""
            raise DataError(f"{where}: transform {self.reference} raised {type(e).__name__}: {first}") from None

    def _text(self, out: Any, text_field: str, where: str) -> str | None:
        if out is None or isinstance(out, str):
            return out
        if isinstance(out, dict) and isinstance(out.get(text_field), str):
            return str(out[text_field])
        what = f"a dict without a string {text_field!r}" if isinstance(out, dict) else type(out).__name__
        raise DataError(
            f"{where}: transform {self.reference} returned {what}; return the new text (str), a record (dict) "
            f"with its text in {text_field!r}, or None to drop the document"
        )


def load_transform(reference: str, where: str) -> Transform:
    """Import `module:function` (ConfigError in one line if it cannot be)."""
    module_name, _, name = reference.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # ImportError, or the module's own error while importing
        raise ConfigError(
            f"{where} transform {reference!r}: cannot import {module_name!r} ({type(e).__name__}: {e}); it must be "
            "importable by every process of the job (on PYTHONPATH, or installed)"
        ) from None
    function = getattr(module, name, None)
    if not callable(function):
        raise ConfigError(f"{where} transform {reference!r}: module {module_name!r} has no function {name!r}")
    version = getattr(function, "version", None)
    if version is not None:
        digest = f"version {version}"
    else:
        try:
            source = inspect.getsource(function)
        except (OSError, TypeError):
            raise ConfigError(
                f"{where} transform {reference!r}: its source code cannot be read to fingerprint it; give the "
                'function a version of its own (function.version = "1")'
            ) from None
        digest = "sha256 " + hashlib.sha256(source.encode("utf-8")).hexdigest()[:16]
    return Transform(reference, function, digest, getattr(function, "batched", False) is True)


def describe_all(transforms: Sequence[Transform]) -> str:
    """A source's transforms as the fingerprint names them (`transform.<source>`, and each pipeline era's)."""
    return "; ".join(t.describe() for t in transforms)


def era_transforms(source: Any, eras: Sequence[Any]) -> tuple[tuple[Transform, ...], ...]:
    """A source's transforms in each pipeline era (pipeline.PipelineEra): the config's where an era names them, and
    an earlier era's imported by name, which must still have the code they had then (ResumeError otherwise: a unit
    drawn before a change is replayed with them)."""
    current = describe_all(source.transforms)
    out = []
    for era in eras:
        text = era.transforms.get(source.name, "")
        if text == current:
            out.append(tuple(source.transforms))
            continue
        where = f"[dataloader.sources.{source.name}] (the run's transforms from step {era.start})"
        references = [part.split(" (")[0] for part in text.split("; ")] if text else []
        # The checkpoint names them, and a checkpoint never chooses code: only functions of modules the job's own
        # transforms of this source import are looked up (and then checked against the recorded digest).
        modules = {t.reference.partition(":")[0] for t in source.transforms}
        foreign = [r for r in references if r.partition(":")[0] not in modules]
        if foreign:
            raise ResumeError(
                f"source {source.name!r}: the run's steps from {era.start} were made by {text}, and {foreign[0]} is not "
                f"in a module this job's transforms name ({', '.join(sorted(modules)) or 'none'}); keep the old "
                "function beside the new one, in its module, or resume from a checkpoint of these transforms"
            )
        chain = tuple(load_transform(reference, where) for reference in references)
        if describe_all(chain) != text:
            raise ResumeError(
                f"source {source.name!r}: the run's steps from {era.start} were made by {text}, but this code has "
                f"{describe_all(chain)}; a document drawn before the transforms changed is drawn again by them at a "
                "resume: keep that code importable unchanged (give new code a new name) or resume from a checkpoint "
                "of these transforms"
            )
        out.append(chain)
    return tuple(out)


def check_deterministic(transforms: Sequence[Transform], records: list[dict[str, Any]], where: str) -> None:
    """Run the transforms (in order, as the source applies them) on `records` twice, forwards and backwards, and
    in a fresh process with another hash seed: the same outputs, or ConfigError naming the function and record."""
    todo = [t for t in transforms if (t.reference, t.digest) not in _checked]
    if not todo or not records:
        return
    for t in todo:
        # The fresh process first: it has a time limit, so a transform that never returns is said in one line
        # here instead of hanging the job.
        fresh = _in_fresh_process(t, records, where)
        first = _outputs(t, records, where)
        if t.batched:  # each record alone, last first: neither the other records of a call nor the order count
            backwards = [_outputs(t, [r], where)[0] for r in reversed(records)][::-1]
        else:
            backwards = _outputs(t, records[::-1], where)[::-1]
        for i, (a, b) in enumerate(zip(first, backwards)):
            if a != b and t.batched:
                raise ConfigError(
                    f"{where} batched transform {t.reference} gave sample record {i} {_short(a)} among the "
                    f"{len(records)} sample records and {_short(b)} alone; a record's result must not depend on the "
                    "other records in its call"
                )
            if a != b:
                raise ConfigError(
                    f"{where} transform {t.reference} is not a pure function of its record: sample record {i} gave "
                    f"{_short(a)} after the records before it and {_short(b)} after the ones after it; it must not "
                    "keep state across documents (stateful transforms are not supported)"
                )
        for i, (a, b) in enumerate(zip(first, fresh)):
            if a != b:
                raise ConfigError(
                    f"{where} transform {t.reference} gave another result in a fresh process with another hash seed "
                    f"for sample record {i} ({_short(a)} here, {_short(b)} there); it must depend only on the record "
                    "(no set or dict iteration order, random numbers, time, id() or process state)"
                )
        _checked.add((t.reference, t.digest))


def _outputs(t: Transform, records: list[dict[str, Any]], where: str) -> list[str]:
    """What the function gives each record, as text (a raise is compared like a result: deterministic errors are
    said when reached); a batched one in one call."""
    if not t.batched:
        return [_safe(t.function, dict(r)) for r in records]
    out = _safe(lambda batch: t.function(batch), [dict(r) for r in records], raw=True)
    if isinstance(out, str):  # it raised: every record shares the error
        return [out] * len(records)
    if not isinstance(out, (list, tuple)) or len(out) != len(records):
        got = f"{len(out)} results" if isinstance(out, (list, tuple)) else type(out).__name__
        raise ConfigError(
            f"{where} batched transform {t.reference} returned {got} for {len(records)} sample records; return a "
            "list with one result per record, in order"
        )
    return [repr(item) for item in out]


def _safe(function: Callable[[Any], Any], argument: Any, raw: bool = False) -> Any:
    """repr() of the function's result (the result itself if `raw`), or the error it raised, as text."""
    try:
        out = function(argument)
        return out if raw else repr(out)
    except (Exception, SystemExit) as e:
        return f"raised {type(e).__name__}: {e}"


def _short(value: Any) -> str:
    text = str(value)
    return repr(text[:60] + "..." if len(text) > 60 else text)


_FRESH = """
import importlib, json, pickle, sys
module, _, name = sys.argv[1].partition(":")
function = getattr(importlib.import_module(module), name)
records = pickle.load(sys.stdin.buffer)
if getattr(function, "batched", False) is True:
    try:
        out = [repr(item) for item in function(records)]
    except (Exception, SystemExit) as e:
        out = [f"raised {type(e).__name__}: {e}"] * len(records)
else:
    out = []
    for record in records:
        try:
            out.append(repr(function(record)))
        except (Exception, SystemExit) as e:
            out.append(f"raised {type(e).__name__}: {e}")
json.dump(out, sys.stdout)
"""


def _in_fresh_process(t: Transform, records: list[dict[str, Any]], where: str) -> list[str]:
    env = {**os.environ, "PYTHONHASHSEED": str(1 + (hash("zephon") & 0xFFFF)), "PYTHONPATH": os.pathsep.join(sys.path)}
    try:
        done = subprocess.run(
            [sys.executable, "-c", _FRESH, t.reference],
            input=pickle.dumps(records),  # the records as Arrow or JSON gave them (dates, bytes, decimals)
            capture_output=True,
            timeout=FRESH_TIMEOUT_S,
            env=env,
        )
    except subprocess.TimeoutExpired:
        raise ConfigError(
            f"{where} transform {t.reference} did not finish {len(records)} sample records in {FRESH_TIMEOUT_S} s in a fresh "
            "process; does it return for every record?"
        ) from None
    if done.returncode != 0:
        last = (done.stderr.decode("utf-8", "replace").strip().splitlines() or ["(no output)"])[-1]
        raise ConfigError(f"{where} transform {t.reference} cannot run in a fresh process: {last}")
    out: list[str] = json.loads(done.stdout)
    return out
