"""The batch ledger: one JSON line per optimizer step, to prove two runs saw the same data.

    {"step": 3, "sha256": "...", "rows": 16, "tokens": {"code": 610, "prose": 1454}, "padding": 0}

`sha256` is the global batch digest of engine/digest.py (over the ordered lane
digests), so it can be computed without gathering tokens, and predicted offline.
`tokens` counts the step's slots per source (its (input, label) pairs under
labels = "document"; its tokens, the last label of each row included, under
"stream"; see engine/rows.py), `padding` its padding slots.

A crash or a full disk can stop an append halfway: the ledger is an append-only record
(engine/jsonl_log.py, shared with validation.jsonl): one write() per line, a short write cut
off again, an incomplete last line dropped at a restart (saying so), a bad line anywhere else
refused as corruption naming the file and line.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace

from zephon_titan.engine.document_counts import COUNTS, PER_SOURCE, by_source
from zephon_titan.engine.jsonl_log import AppendOnlyLog, RecordFormat, read_entries
from zephon_titan.engine.spec import EngineSpec
from zephon_titan.errors import DataError

log = logging.getLogger("zephon_titan")

_FIELDS = {"step": int, "sha256": str, "rows": int, "tokens": dict, "padding": int}
# weights: runs with a mixture schedule, the weights in force at the step; seq_len: runs whose seq_len changed at
# a resume (EngineSpec.eras), the step's row length, from the first resume that changed it.
# excluded: runs with `[dataloader] exclude`, the SHA-256 of the exclusion list, at each step from exclude_from_step.
# best_fit_mixing: best_fit runs that mix per window (resumed from a checkpoint saved before per_step existed, or
# set so): "per_window" at each step, so the ledger alone says which rule made its rows (docs/mixture.md).
# pipeline: runs whose keep, repeat or transforms change by step (pipeline_from_step), the SHA-256 of those in
# force, at each step from the first change.
# targets: runs with chat sources, the step's trained targets per source (labels other than -100).
# membership: runs under torchft (loader/ft_steps.py), who trained the committed step: {"participants": n,
# "groups": replica groups in participating order, "attempt": the attempt that committed, "ranks": live ranks (DP
# ranks of the groups together)}. A record of the run,
# not of its data: `verify` ignores it, so a run with deaths compares equal to its plan.
# documents: runs that may drop or repeat documents (EngineSpec.counts_documents), per source what the step's rows
# read, repeated and dropped (engine/document_counts.py).
_OPTIONAL = {
    "weights": dict,
    "seq_len": int,
    "excluded": str,
    "best_fit_mixing": str,
    "pipeline": str,
    "documents": dict,
    "targets": dict,
    "membership": dict,
}


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    step: int
    sha256: str
    rows: int
    tokens: dict[str, int]
    padding: int
    weights: dict[str, float] | None = None
    seq_len: int | None = None
    excluded: str | None = None
    best_fit_mixing: str | None = None
    pipeline: str | None = None
    documents: dict[str, dict[str, int]] | None = None
    targets: dict[str, int] | None = None
    membership: dict[str, object] | None = None

    @classmethod
    def of(
        cls,
        step: int,
        sha256: str,
        rows: int,
        source_names: list[str],
        counts: list[int],
        weights: dict[str, float] | None = None,
        seq_len: int | None = None,
        excluded: str | None = None,
        best_fit_mixing: str | None = None,
        pipeline: str | None = None,
        documents: bool = False,
        targets: bool = False,
    ) -> LedgerEntry:
        """From `step_tally()` counts: tokens per source, padding, the documents' counts (recorded when
        `documents`), the trained targets per source (recorded when `targets`)."""
        n = len(source_names)
        counted = counts[n + 1 : n + 1 + n * PER_SOURCE]
        return cls(
            step=step,
            sha256=sha256,
            rows=rows,
            tokens=dict(zip(source_names, counts[:n])),
            padding=counts[n],
            weights=weights,
            seq_len=seq_len,
            excluded=excluded,
            best_fit_mixing=best_fit_mixing,
            pipeline=pipeline,
            documents=by_source(counted, source_names) if documents else None,
            targets=dict(zip(source_names, counts[n + 1 + n * PER_SOURCE :])) if targets else None,
        )

    def to_json(self) -> str:
        data = asdict(self)
        for key in _OPTIONAL:
            if data[key] is None:
                del data[key]
        return json.dumps(data, sort_keys=True)


def step_entry(
    spec: EngineSpec, step: int, sha256: str, rows: int, counts: list[int], membership: dict[str, object] | None = None
) -> LedgerEntry:
    """Step `step`'s entry from its global-batch digest and step_tally counts, with every optional field the spec
    calls for at that step: the one recipe of `plan` and of the loaders, so a prediction and a run compare."""
    entry = LedgerEntry.of(
        step,
        sha256,
        rows,
        spec.source_names,
        counts,
        step_weights(spec, step),
        step_seq_len(spec, step),
        step_exclusion(spec, step),
        step_mixing(spec),
        step_pipeline(spec, step),
        spec.counts_documents_at(step),
        spec.counts_targets,
    )
    return entry if membership is None else replace(entry, membership=membership)


def step_weights(spec: EngineSpec, step: int) -> dict[str, float] | None:
    """What the ledger records of the mixture at `step`: its weights under a schedule, else nothing."""
    return spec.schedule.weights_by_name(step) if spec.schedule.phased else None


def step_seq_len(spec: EngineSpec, step: int) -> int | None:
    """What the ledger records of the row length at `step`: in a run whose seq_len changed at a resume, the step's
    (its era's), else nothing (every step has the job's seq_len, and ledgers keep the form they had)."""
    return spec.era_of(step).seq_len if spec.eras else None


def step_pipeline(spec: EngineSpec, step: int) -> str | None:
    """What the ledger records of the pipelines at `step`: in a run where they change by step, the SHA-256 of those
    in force (keep and repeat, and the transforms where they change) from the first change on, else nothing
    (ledgers keep the form they had)."""
    eras = spec.pipeline_eras
    if not spec.pipelines_change:
        return None
    first_change = next(e.start for e in eras[1:] if not e.same_pipelines(eras[0]))
    if step < first_change:
        return None
    era = eras[spec.pipeline_era_of(step)]
    decided: object = era.expressions
    if spec.transforms_change or spec.chats_change:
        decided = [era.expressions, era.transforms, *([era.chats] if spec.chats_change else [])]
    return hashlib.sha256(json.dumps(decided, sort_keys=True).encode("utf-8")).hexdigest()[:16]


def step_exclusion(spec: EngineSpec, step: int) -> str | None:
    """What the ledger records of the exclusion at `step`: the list's SHA-256 from exclude_from_step on, else
    nothing."""
    exclusion = spec.exclusion
    return exclusion.digest if exclusion is not None and step >= exclusion.from_step else None


def step_mixing(spec: EngineSpec) -> str | None:
    """What the ledger records of best_fit's mixing rule: "per_window" where it applies (a run resumed from a
    checkpoint saved before per_step existed keeps it: EngineSpec.resumed), else nothing (ledgers keep their form)."""
    config = spec.config
    return "per_window" if config.packing == "best_fit" and config.best_fit_mixing == "per_window" else None


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
    if not all(isinstance(k, str) and type(v) is int for k, v in data.get("targets", {}).items()):
        raise ValueError("targets must map source names to integers")
    membership = data.get("membership", {})
    if not all(type(v) is int or (type(v) is list and all(type(x) is int for x in v)) for v in membership.values()):
        raise ValueError("membership must map names to integers or lists of integers")
    for name, counts in data.get("documents", {}).items():
        if (
            not isinstance(counts, dict)
            or set(counts) != set(COUNTS)
            or any(type(v) is not int for v in counts.values())
        ):
            raise ValueError(f"documents of {name!r} must map {', '.join(COUNTS)} to integers")
    return LedgerEntry(**data)


LEDGER: RecordFormat[LedgerEntry] = RecordFormat(
    record="the ledger",
    entry="ledger entry",
    parse=_entry,
    to_line=LedgerEntry.to_json,
    step=lambda e: e.step,
    remedy="fix or delete that line, or delete the file (`zephon-titan plan` recomputes the entries)",
)


def read_ledger(path: str) -> list[LedgerEntry]:
    return read_entries(path, LEDGER)[0]


class LedgerWriter:
    """Appends entries (engine/jsonl_log.py); on resume keeps only the steps up to the checkpoint's step."""

    def __init__(self, path: str, resume_step: int):
        self.path = path
        existed = os.path.exists(path)
        self._log = AppendOnlyLog(path, LEDGER, resume_step)
        kept = self._log.kept
        if resume_step > 0 and existed and (not kept or kept[-1].step != resume_step):
            log.warning(
                "zephon: %s ends at step %d but the run resumes after step %d: the steps between are "
                "missing from it (`zephon-titan plan` computes them)",
                path,
                kept[-1].step if kept else 0,
                resume_step,
            )

    def write(self, entry: LedgerEntry) -> None:
        self._log.append(entry)


def union_ledger(ledgers: Iterable[Iterable[LedgerEntry]]) -> list[LedgerEntry]:
    """The run's ledger from the replica groups' ledgers: each step once, in step order. A group's ledger holds the
    steps it committed, so a group left out of a step (see FtSteps.healed) lacks it while the others hold it; every
    group that committed a step made the same entry from the same summed table, so two that differ are refused."""
    steps: dict[int, LedgerEntry] = {}
    for ledger in ledgers:
        for entry in ledger:
            held = steps.setdefault(entry.step, entry)
            if held != entry:
                raise DataError(
                    f"two replica groups recorded step {entry.step} differently (SHA-256 {held.sha256[:12]} and "
                    f"{entry.sha256[:12]}, membership {held.membership} and {entry.membership})"
                )
    return [steps[step] for step in sorted(steps)]
