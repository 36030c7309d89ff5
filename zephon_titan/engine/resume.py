"""What a checkpoint's loader state means and what a resume may change: the header, the lane entries, their
seals and checks, and the state a resume continues from (`read_state` -> `Restored`). No torch: storing it in
DCP (JSON text in uint8 tensors) and the resume sequence are loader/state.py's.

A checkpoint's loader state is a header (replicated on every rank, stored once) and one entry per lane, each a
JSON object under its key (HEADER_KEY, lane_key).

Every entry is sealed: a SHA-256 over its canonical JSON, its key and (for lanes) the header's seal, which
covers the fingerprint and the global batch size. So one changed byte, an edited field, or a lane entry copied
to another lane is refused on load, naming the entry; then every field's type and range is checked. This
promises integrity (corruption and mismatch are found), not authenticity: whoever can write the checkpoint can
also recompute a seal.

Header versions: 3 stores the fingerprint's `sources` as a list of names; 2 stored them joined by commas (no
source name could hold one) and is read by converting it. A checkpoint of any version resumes mixing as it was
written (read_state): its fingerprint's `mix_phases` and `best_fit_mixing`, absent in checkpoints written before
they existed (and in any whose run mixes as those did), which a reader that knows neither refuses by name.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, cast

from zephon_titan.engine.fingerprint import (
    Fingerprint,
    as_resumed,
    check_exclusion,
    check_fingerprint,
    check_mixture,
    check_pipelines,
    recorded_eras,
    saved_eras,
    saved_mixing,
    seq_len_checked_apart,
    source_names,
)
from zephon_titan.engine.mixing import added_offsets
from zephon_titan.engine.pipeline import PipelineEra
from zephon_titan.engine.seq_len_schedule import Era, era_at, eras_after
from zephon_titan.engine.spec import EngineSpec
from zephon_titan.engine.state import LaneState
from zephon_titan.errors import ResumeError

HEADER_KEY = "header"
HEADER_VERSION = 3
READ_VERSIONS = (2, 3)
START_OVER = "start the data stream over (--checkpoint.exclude_from_loading dataloader)"


def lane_key(lane_id: int) -> str:
    return f"lane_{lane_id:05d}"


# The sizes of the slots the entries are stored in (loader/state.py). DCP reads a tensor only into a
# template of the saved shape: loader/state.restore sizes the templates from the checkpoint's index, so a
# resume may add sources (bigger lane entries of its own). The header slot is one fixed size, so the first save
# cannot overflow: it fits config.MAX_SOURCES sources with names of up to config.MAX_SOURCE_NAME characters
# (enforced when the config is read; test_job encodes the largest header). A lane entry grows with the number
# of sources, with room for 64-bit counters.
HEADER_CAPACITY = 1 << 17


def lane_capacity(num_sources: int) -> int:
    return 512 + 96 * num_sources


# ---- entries ------------------------------------------------------------------------------------


def canonical(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode("utf-8")


def _seal_of(obj: dict[str, Any], key: str, bound_to: str) -> str:
    body = {k: v for k, v in obj.items() if k != "seal"}
    return hashlib.sha256(f"{key}\n{bound_to}\n".encode() + canonical(body)).hexdigest()[:32]


def seal(obj: dict[str, Any], key: str, bound_to: str = "") -> dict[str, Any]:
    return {**obj, "seal": _seal_of(obj, key, bound_to)}


def _check_seal(obj: Any, key: str, bound_to: str) -> dict[str, Any]:
    if not isinstance(obj, dict) or not isinstance(obj.get("seal"), str):
        raise ResumeError(
            f"dataloader state {key!r} is not a sealed zephon_titan entry (got "
            f"{type(obj).__name__}{' without a seal' if isinstance(obj, dict) else ''}); it was "
            "written by another version or damaged: resume from an earlier checkpoint"
        )
    if obj["seal"] != _seal_of(obj, key, bound_to):
        raise ResumeError(
            f"dataloader state {key!r} fails its integrity check: it was changed or damaged after it was written"
            + (", or copied from another lane" if key != HEADER_KEY else "")
            + "; restore the checkpoint from a good copy or resume from an earlier step"
        )
    return obj


def _entry(state: Mapping[str, Any], key: str) -> Any:
    if key not in state:
        raise ResumeError(f"the checkpoint's dataloader state has no {key!r}")
    return state[key]


def _field(entry: dict[str, Any], name: str, kind: type, where: str) -> Any:
    value = entry.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ResumeError(f"{where}: field {name!r} must be {kind.__name__}, got {value!r}; the checkpoint is damaged")
    return value


def _counts(value: Any, length: int, name: str, where: str) -> list[int]:
    ok = (
        isinstance(value, list)
        and len(value) == length
        and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 63 for v in value)
    )
    if not ok:
        raise ResumeError(
            f"{where}: field {name!r} must be {length} counts >= 0, got {value!r}; the checkpoint is damaged"
        )
    return cast("list[int]", value)


# ---- the header ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Header:
    """What every rank's loader state shares: the format version, the global batch size G, the steps consumed
    and the fingerprint of everything lane purity depends on."""

    version: int
    global_batch_size: int
    step: int | None
    """None in checkpoints written before G could change: then every step had G / L rows per lane."""
    fingerprint: Fingerprint
    seal: str = ""
    """The stored entry's seal (lane entries are bound to it); "" for a header not read from a checkpoint."""

    @property
    def sources(self) -> list[str]:
        return source_names(self.fingerprint)

    @property
    def num_lanes(self) -> int:
        return int(self.fingerprint["num_lanes"])  # type: ignore[arg-type]  # checked by from_entry

    def to_entry(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "version": self.version,
            "global_batch_size": self.global_batch_size,
            "fingerprint": self.fingerprint,
        }
        if self.step is not None:
            body["step"] = self.step
        return seal(body, HEADER_KEY)

    @classmethod
    def from_entry(cls, state: Mapping[str, Any]) -> Header:
        """The checked header of a checkpoint's dataloader entries (JSON objects by key); a version-2 header is
        converted (its `sources` were one comma-joined string)."""
        entry = _check_seal(_entry(state, HEADER_KEY), HEADER_KEY, "")
        where = f"dataloader state {HEADER_KEY!r}"
        version = entry.get("version")
        if version not in READ_VERSIONS or isinstance(version, bool):
            raise ResumeError(
                f"the checkpoint's dataloader state has format version {version!r:.40}, this zephon_titan reads "
                f"versions {', '.join(map(str, READ_VERSIONS))}; resume with the zephon_titan that wrote it, or "
                + START_OVER
            )
        fingerprint = dict(_field(entry, "fingerprint", dict, where))
        if version == 2 and isinstance(fingerprint.get("sources"), str):
            fingerprint["sources"] = fingerprint["sources"].split(",")
        sources = fingerprint.get("sources")
        if not isinstance(sources, list) or not all(isinstance(n, str) for n in sources):
            raise ResumeError(f"{where}: field 'fingerprint' has no list of source names; the checkpoint is damaged")
        if not all(isinstance(k, str) and (isinstance(v, str) or k == "sources") for k, v in fingerprint.items()):
            raise ResumeError(f"{where}: field 'fingerprint' must map names to strings; the checkpoint is damaged")
        num_lanes = fingerprint.get("num_lanes", "")
        if not re.fullmatch(r"[1-9][0-9]{0,8}", num_lanes):
            raise ResumeError(
                f"{where}: field 'fingerprint' has no num_lanes (a lane count), got {num_lanes!r:.40}; the "
                "checkpoint is damaged"
            )
        lanes = int(num_lanes)
        batch = _field(entry, "global_batch_size", int, where)
        if not lanes <= batch < 1 << 40 or batch % lanes:
            raise ResumeError(
                f"{where}: field 'global_batch_size' is {batch}, not a multiple of its {lanes} lanes (at least one "
                "row per lane per step); the checkpoint is damaged"
            )
        step = None
        if "step" in entry:
            step = _field(entry, "step", int, where)
            if not 0 <= step < 1 << 63:
                raise ResumeError(f"{where}: field 'step' must be a step >= 0, got {step}; the checkpoint is damaged")
        return cls(version, batch, step, fingerprint, entry["seal"])


# ---- lanes -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LaneEntry:
    """One lane's state as consumed by the trainer, and its tokens per source and padding so far."""

    state: LaneState
    tokens: list[int]
    padding: int

    def to_entry(self, header_seal: str) -> dict[str, Any]:
        """The sealed entry, bound to the header's seal."""
        body = {"state": self.state.to_dict(), "tokens": self.tokens, "padding": self.padding}
        return seal(body, lane_key(self.state.lane_id), header_seal)

    @classmethod
    def initial(cls, lane: int, num_sources: int) -> LaneEntry:
        return cls(LaneState.initial(lane, num_sources), [0] * num_sources, 0)


def read_lane(state: Mapping[str, Any], lane: int, header: Header, names: list[str]) -> LaneEntry:
    """One lane's entry, checked against its seal, its key and the checkpoint's sources, then matched by name
    to this run's source `names` (a resume may add sources)."""
    key = lane_key(lane)
    entry = _check_seal(_entry(state, key), key, header.seal)
    where = f"dataloader state of lane {lane} ({key!r})"
    lane_state = LaneState.from_dict(_field(entry, "state", dict, where), where)
    if lane_state.lane_id != lane:
        raise ResumeError(f"{where}: field 'lane_id' is {lane_state.lane_id}, not {lane}; the checkpoint is damaged")
    saved = header.sources
    if len(lane_state.feed.cursors) != len(saved):
        raise ResumeError(
            f"{where}: field 'feed.cursors' has {len(lane_state.feed.cursors)} sources, the checkpoint has "
            f"{len(saved)}; the checkpoint is damaged"
        )
    tokens = _counts(entry.get("tokens"), len(saved), "tokens", where)
    padding = _counts([entry.get("padding")], 1, "padding", where)[0]
    if header.step is not None and lane_state.rows < header.step:
        raise ResumeError(
            f"{where}: field 'rows' is {lane_state.rows}, fewer than the header's {header.step} steps (each "
            "step takes at least one row of every lane); the checkpoint is damaged"
        )
    step = lane_state.rows if header.step is None else header.step
    if lane_state.feed.mix is not None and lane_state.feed.mix.segment > step + 1:
        raise ResumeError(
            f"{where}: field 'feed.mix.segment' is step {lane_state.feed.mix.segment}, after the checkpoint's step {step}; "
            "the checkpoint is damaged"
        )
    if saved != names:
        by_name = dict(zip(saved, tokens))
        lane_state = lane_state.with_sources(saved, names)
        tokens = [by_name.get(name, 0) for name in names]
    return LaneEntry(lane_state, tokens, padding)


# ---- the checks of a resume ---------------------------------------------------------------------


@dataclass(frozen=True)
class Restored:
    """A checkpoint's loader state, checked against this run: what a resume continues from."""

    header: Header
    step: int
    lanes: dict[int, LaneEntry]
    added: list[str] = field(default_factory=list)
    """Sources this run has and the checkpoint had not (each starts from its beginning)."""
    mixture_change: str = ""
    """A line saying how the mixture changes after the checkpoint's step ("" if it does not)."""
    phase_offsets: dict[str, Fraction] = field(default_factory=dict)
    """Each source's mixing offset (engine/mixing.py): the checkpoint's, and for an added source a new one."""
    best_fit_mixing: str = "per_window"
    """The checkpoint's best_fit_mixing. The resumed run continues mixing as the checkpoint did
    (EngineSpec.resumed), whatever its config asks of a new run."""

    eras: tuple[Era, ...] = ()
    """The run's row lengths by step (EngineSpec.eras): the checkpoint's up to its step, then this config's from the
    next step (seq_len_schedule.eras_after); empty: one."""
    seq_len_change: str = ""
    """The line a seq_len change at this resume logs ("" if none)."""
    pipeline_eras: tuple[PipelineEra, ...] = ()
    """The sources' keep and repeat by step: the checkpoint's up to its step, then this config's (empty: the
    config's alone)."""
    pipeline_slots: dict[str, int] = field(default_factory=dict)
    """Each source's slots per document, as the checkpoint's windows have them."""

    def spec(self, spec: EngineSpec) -> EngineSpec:
        """`spec` (this run's) as it continues the checkpoint's run."""
        offsets = tuple(self.phase_offsets[n] for n in spec.source_names)
        resumed = spec.resumed(self.best_fit_mixing, offsets).with_eras(self.eras)
        return resumed.with_pipeline_eras(self.pipeline_eras, self.pipeline_slots) if self.pipeline_eras else resumed


def read_state(state: Mapping[str, Any], lane_ids: Any, current: Fingerprint, allow: Any = ()) -> Restored:
    """The loader entries of a checkpoint (JSON objects by key; loader/state.Decoded reads them from DCP's
    tensors) for `lane_ids`, checked against this run's fingerprint `current`: header, fingerprint (naming each
    change but `allow`ed kinds), every lane (all at the end of one step), the step, the mixture (only its future
    may change)."""
    header = Header.from_entry(state)
    # A run in progress never changes how it mixes: compare with this run mixing as the checkpoint's did (the
    # caller adopts it: Restored.spec). Added sources take offsets that move no other source's phase.
    names = source_names(current)
    kept, best_fit_mixing = saved_mixing(header.fingerprint)
    offsets = added_offsets(kept, names)
    expected = seq_len_checked_apart(header.fingerprint, as_resumed(current, offsets, best_fit_mixing))
    check_fingerprint(header.fingerprint, expected, allow, mixture_checked_apart=True)
    lanes = {lane: read_lane(state, lane, header, names) for lane in lane_ids}
    rows = {entry.state.rows for entry in lanes.values()}
    if len(rows) != 1:
        raise ResumeError(
            f"the checkpoint's lanes stand at rows {sorted(rows)}, not at the end of one step (every lane gives "
            "the same number of rows per step); the checkpoint is damaged"
        )
    step = _saved_step(header, rows.pop())
    pipeline_eras, pipeline_slots, pipeline_change = check_pipelines(header.fingerprint, current, step)
    changes = (
        check_mixture(header.fingerprint, current, step),
        check_exclusion(header.fingerprint, current, step),
        pipeline_change,
    )
    change = "; ".join(c for c in changes if c)
    added = [name for name in names if name not in header.sources]
    before = saved_eras(header.fingerprint, step, current)
    eras = eras_after(before, step, recorded_eras(current))
    seq_len_change = ""
    was, now = era_at(before, step + 1), era_at(eras or before, step + 1)
    if (was.seq_len, was.chunk) != (now.seq_len, now.chunk):  # this resume changes the row length from here
        seq_len_change = f"seq_len {was.seq_len} -> {now.seq_len} from step {step + 1}"
        follows = was.chunk == was.seq_len and now.chunk == now.seq_len  # mix_chunk_tokens unset: nothing more
        if was.chunk != now.chunk and not follows:
            seq_len_change += f" (mix_chunk_tokens {was.chunk} -> {now.chunk})"
    restored = Restored(header, step, lanes, added, change, offsets, best_fit_mixing, eras, seq_len_change)
    return dataclasses.replace(restored, pipeline_eras=pipeline_eras, pipeline_slots=pipeline_slots)


def _saved_step(header: Header, rows: int) -> int:
    """Steps consumed when the checkpoint was saved. Headers written before the global batch size could
    change have no `step`: then every step had the header's rows per lane."""
    if header.step is not None:
        return header.step
    per_step = header.global_batch_size // header.num_lanes  # >= 1: Header.from_entry
    if rows % per_step:
        raise ResumeError(
            f"the checkpoint's lanes stand at row {rows}, not at the end of a step of {per_step} rows per lane "
            "(its header has no step); the checkpoint is damaged"
        )
    return rows // per_step
