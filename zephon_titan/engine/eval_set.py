"""An eval set: a finite, fixed sequence of steps of the lane engine, the same bytes for every W.

Step t of the eval set is, as in training, lane 0's rows [tR, (t+1)R), then lane 1's, ...
(engine/lanes.py), from the lanes' initial state: every validation starts at the beginning, so
nothing is carried between validations or stored in a checkpoint. A lane that runs out (a
finite source, `exhaustion = "redistribute"`) gives padding rows (labels -100) from then on,
so the eval set is every row of every lane once; it ends after the first step in which no lane
of the run had a row left, or after a fixed number of steps. Whether any lane of the run still
has rows is a global question: the caller answers it (one all-reduce per step under torchrun).
An eval set without a single row (an eval_fraction too small for its corpus) is a ConfigError,
never a silent loss of 0.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from zephon_titan.engine.digest import lane_digest
from zephon_titan.engine.jsonl_log import RecordFormat
from zephon_titan.engine.rows import IGNORE_INDEX, Row, RowShape
from zephon_titan.engine.spec import EngineSpec
from zephon_titan.engine.stream import LaneStream
from zephon_titan.errors import ConfigError, LaneExhausted


@dataclass(frozen=True, slots=True)
class EvalStep:
    """One eval step's rows of this rank's lanes, in lane order."""

    lanes: list[list[Row]]

    @property
    def rows(self) -> list[Row]:
        return [row for rows in self.lanes for row in rows]

    def lane_digests(self) -> list[bytes]:
        return [lane_digest(rows) for rows in self.lanes]


def slot_sources(row: Row) -> np.ndarray:
    """The source index of each input position of `row` (-1: padding); a label is counted for the
    source of its input (under labels = "stream" the two differ only where a piece ends)."""
    out = np.full(len(row.inputs), -1, dtype=np.int64)
    at = 0
    for piece in row.pieces:
        out[at : at + piece.length] = piece.source
        at += piece.length
    return out


def label_counts(rows: Iterable[Row], num_sources: int) -> list[int]:
    """Targets (labels other than -100) per source over `rows`: what each source's eval loss averages."""
    counts = np.zeros(num_sources, dtype=np.int64)
    for row in rows:
        sources = slot_sources(row)[row.labels != IGNORE_INDEX]
        counts += np.bincount(sources[sources >= 0], minlength=num_sources)
    return counts.tolist()


def eval_steps(
    spec: EngineSpec,
    lane_ids: Sequence[int],
    rows_per_lane: int,
    max_steps: int = -1,
    any_lane_live: Callable[[bool], bool] = lambda live: live,
) -> Iterator[EvalStep]:
    """The eval set's steps for `lane_ids`: at most `max_steps` (-1: until no lane of the run has rows).

    `any_lane_live(local)` turns "one of my lanes gave a row this step" into "one lane of the run
    did"; every rank must call it once per step (it is a collective under torchrun)."""
    streams = [LaneStream(spec, lane) for lane in lane_ids]
    ended = [False] * len(streams)
    padding = RowShape.of(spec).make_row([])
    step = 0
    while max_steps < 0 or step < max_steps:
        lanes, live = [], False
        for i, stream in enumerate(streams):
            rows = []
            for _ in range(rows_per_lane):
                if not ended[i]:
                    try:
                        rows.append(stream.next_row())
                        live = True
                        continue
                    except LaneExhausted:
                        ended[i] = True
                rows.append(padding)
            lanes.append(rows)
        if not any_lane_live(live):
            if step == 0:
                raise ConfigError(empty_eval_set_message(spec))
            return
        yield EvalStep(lanes)
        step += 1


def empty_eval_set_message(spec: EngineSpec) -> str:
    """Why an eval set without a single row is empty, and the fix."""
    config = spec.config
    if config.split == "eval":
        held = ", ".join(f"{s.name} (eval_fraction {s.eval_fraction:g})" for s in config.sources)
        return (
            f"[validator] the eval set is empty: the sources {held} hold out no document under split_seed "
            f"{config.split_seed} (each document is held out with probability eval_fraction); raise eval_fraction "
            "in their [dataloader.sources.<name>] tables or add eval files as [validator.dataloader.sources.<name>]"
        )
    names = ", ".join(s.name for s in config.sources)
    return (
        f"[validator] the eval set is empty: its sources ({names}) give no row; "
        "point [validator.dataloader.sources.<name>] at files with documents"
    )


def eval_set_digest(step_digests: Iterable[str]) -> str:
    """SHA-256 of a whole eval set, over its steps' global batch digests (engine/digest.py)."""
    return hashlib.sha256("".join(step_digests).encode("ascii")).hexdigest()


# validation.jsonl: one entry per validation (titan/validator.py), an append-only record like the ledger.
_VALIDATION_FIELDS: dict[str, tuple[type, ...]] = {
    "step": (int,),
    "sha256": (str,),
    "steps": (int,),
    "rows": (int,),
    "tokens": (dict,),
    "loss": (float, int),
    "loss_per_source": (dict,),
}
_OPTIONAL_FIELDS: dict[str, tuple[type, ...]] = {"seq_len": (int,)}  # absent in entries written before it


def _validation_entry(raw: bytes) -> dict[str, Any]:
    """One line of validation.jsonl; ValueError saying what is wrong with it."""
    data = json.loads(raw.decode("utf-8"))  # UnicodeDecodeError and JSONDecodeError are ValueErrors
    if not isinstance(data, dict) or not set(_VALIDATION_FIELDS) <= set(data) <= {
        *_VALIDATION_FIELDS,
        *_OPTIONAL_FIELDS,
    }:
        fields = ", ".join(_VALIDATION_FIELDS)
        raise ValueError(f"expected an object with the fields {fields} (and seq_len), got {str(data)[:80]}")
    for key, kinds in {**_VALIDATION_FIELDS, **_OPTIONAL_FIELDS}.items():
        if key in data and type(data[key]) not in kinds:  # bool is not an int here
            raise ValueError(f"{key} must be {kinds[0].__name__}, got {data[key]!r:.40}")
    if not all(isinstance(k, str) and type(v) is int for k, v in data["tokens"].items()):
        raise ValueError("tokens must map source names to integers")
    if not all(isinstance(k, str) and type(v) in (int, float) for k, v in data["loss_per_source"].items()):
        raise ValueError("loss_per_source must map source names to numbers")
    return data


VALIDATION_RECORD: RecordFormat[dict[str, Any]] = RecordFormat(
    record="the eval record",
    entry="validation entry",
    parse=_validation_entry,
    to_line=lambda entry: json.dumps(entry, sort_keys=True),
    step=lambda entry: int(entry["step"]),
    remedy="fix or delete that line, or delete the file (it only records the run's earlier validations)",
)
