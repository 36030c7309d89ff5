"""The loader's checkpoint state in DCP: its keys, the entry codec, and the one resume sequence (`restore`) that
the loader, `plan`, data_run and ZephonCheckpointManager go through (torch only, no torchtitan). What the state
means and what a resume may change (the header, the lane entries, their seals and checks): engine/resume.py.

Under `dataloader` a checkpoint holds a header (replicated on every rank, stored once) and one entry per lane,
so a rank that owns other lanes after a resize loads exactly the entries it now owns. Entries are JSON text in
zero-padded uint8 tensors, never Python objects: DCP stores tensors as raw bytes but unpickles any other value.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import warnings
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from zephon_titan.config import MAX_SOURCES
from zephon_titan.engine.fingerprint import Fingerprint
from zephon_titan.engine.resume import (
    HEADER_CAPACITY,
    HEADER_KEY,
    START_OVER,
    Header,
    LaneEntry,
    Restored,
    canonical,
    lane_capacity,
    lane_key,
    read_state,
)
from zephon_titan.errors import ResumeError
from zephon_titan.loader.checkpoint import DATALOADER, TRAIN_STATE, read_checkpoint_metadata, refuse_objects, safe_load

# ---- the entry codec ---------------------------------------------------------------------------


def encode_entry(obj: Any, capacity: int) -> torch.Tensor:
    data = canonical(obj)
    if len(data) > capacity:
        raise ResumeError(f"dataloader state entry of {len(data)} bytes exceeds its {capacity}-byte slot: {obj}")
    out = torch.zeros(capacity, dtype=torch.uint8)
    out[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return out


def decode_entry(value: torch.Tensor, key: str) -> Any:
    try:
        return json.loads(value.cpu().numpy().tobytes().rstrip(b"\0").decode("utf-8"))
    except (AttributeError, TypeError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ResumeError(f"dataloader state {key!r} is not a zephon_titan state entry ({e})") from None


class Decoded(Mapping[str, Any]):
    """DCP's loader entries (tensors, or JSON objects already) as the JSON objects engine/resume.py reads, each
    decoded when it is read, so a damaged entry is named where the checks reach it."""

    def __init__(self, state: Mapping[str, Any]):
        self._state = state

    def __getitem__(self, key: str) -> Any:
        value = self._state[key]
        return decode_entry(value, key) if isinstance(value, torch.Tensor) else value

    def __contains__(self, key: object) -> bool:
        return key in self._state

    def __iter__(self) -> Iterator[str]:
        return iter(self._state)

    def __len__(self) -> int:
        return len(self._state)


def encode_header(header: Header) -> torch.Tensor:
    return encode_entry(header.to_entry(), HEADER_CAPACITY)


def encode_state(header: Header, lanes: dict[int, LaneEntry], num_sources: int) -> dict[str, torch.Tensor]:
    """The loader's DCP entries: the header and one entry per lane."""
    entry = header.to_entry()
    state = {HEADER_KEY: encode_entry(entry, HEADER_CAPACITY)}
    capacity = lane_capacity(num_sources)
    state.update({lane_key(lane): encode_entry(e.to_entry(entry["seal"]), capacity) for lane, e in lanes.items()})
    return state


# ---- the checks of a resume ---------------------------------------------------------------------


def check_index(metadata: Metadata, checkpoint_id: str, lane_ids: Any, num_lanes: int) -> tuple[int, int]:
    """Before DCP reads anything: the checkpoint's index must hold this loader's entries, as tensors, of sizes
    a loader state has. Returns the (header, lane) entry sizes to load into (a resume may add sources, whose
    entries are bigger: DCP loads a tensor only into a template of its saved size)."""
    refuse_objects(metadata, checkpoint_id, [DATALOADER])
    sizes = {
        key[len(DATALOADER) + 1 :]: tuple(meta.size) if meta.properties.dtype == torch.uint8 else None
        for key, meta in metadata.state_dict_metadata.items()
        if key.startswith(f"{DATALOADER}.") and isinstance(meta, TensorStorageMetadata)
    }
    if HEADER_KEY not in sizes:
        raise ResumeError(
            f"{checkpoint_id}: the checkpoint holds no dataloader state (it was saved model-only: TorchTitan's "
            "last_save_model_only = true, the default, writes the final checkpoint without it). Resume from an "
            "earlier step-N checkpoint, or load the model only and start the data stream over with "
            "--checkpoint.exclude_from_loading dataloader; set [checkpoint] last_save_model_only = false "
            "to keep the loader state in future final checkpoints"
        )
    missing = [lane for lane in lane_ids if lane_key(lane) not in sizes]
    saved_lanes = sorted(int(key[len("lane_") :]) for key in sizes if key.startswith("lane_") and key[5:].isdigit())
    if missing and saved_lanes != list(range(len(saved_lanes))):  # a gap: not a smaller lane count
        gap = next(lane for lane in range(saved_lanes[-1] + 1) if lane not in saved_lanes)
        raise ResumeError(
            f"{checkpoint_id}: its .metadata has no entry for lane {gap} but has lanes up to {saved_lanes[-1]}: "
            "the checkpoint is damaged or incomplete (an entry removed from its .metadata?); resume from another "
            f"checkpoint, or {START_OVER}"
        )
    if missing:
        saved = len(saved_lanes)
        raise ResumeError(
            f"{checkpoint_id} has no dataloader state for lane {missing[0]} of this run's {num_lanes} lanes (it "
            f"holds {saved}); it was saved with fewer [dataloader] num_lanes. Lanes are fixed for a run: set "
            f"num_lanes back to the checkpoint's value, or {START_OVER}"
        )
    lane_sizes = {sizes[lane_key(lane)] for lane in lane_ids}
    header, lane = sizes[HEADER_KEY], lane_sizes.pop() if len(lane_sizes) == 1 else None
    valid = (
        header is not None
        and len(header) == 1
        and 0 < header[0] <= HEADER_CAPACITY
        and lane is not None
        and len(lane) == 1
        and lane_capacity(0) <= lane[0] <= lane_capacity(MAX_SOURCES)
        and (lane[0] - lane_capacity(0)) % (lane_capacity(1) - lane_capacity(0)) == 0
    )
    if not valid:
        found = ", ".join(f"{key} {sizes[key]}" for key in [HEADER_KEY, *map(lane_key, lane_ids)][:3])
        raise ResumeError(
            f"{checkpoint_id}: its dataloader entries have other sizes than a zephon_titan state of this version "
            f"({found}): it was saved by another zephon_titan version, or it is damaged. `zephon-titan plan JOB "
            f"--from-checkpoint DIR --steps 0` names what changed; resume with the version that wrote it, or "
            + START_OVER
        )
    assert header is not None and lane is not None
    return header[0], lane[0]


def check_step(checkpoint_id: str, step: int, train_step: object) -> None:
    """The loader state's step must be the train_state's and the folder name's (`step-N`), when known. A whole
    loader state of another step of the same run passes every other check, and every later batch differs."""
    if isinstance(train_step, torch.Tensor) and train_step.numel() == 1:
        train_step = int(train_step.item())
    if train_step is not None and train_step != step:
        if not isinstance(train_step, int) or isinstance(train_step, bool):
            raise ResumeError(f"{checkpoint_id}: its train_state step is {train_step!r:.40}, not a step")
        raise ResumeError(
            f"{checkpoint_id}: its dataloader state is of step {step}, its train_state of step {train_step}; the "
            "loader entries were copied from another checkpoint: restore it from a good copy or resume from "
            "another step"
        )
    named = re.fullmatch(r"step-(\d+)", os.path.basename(os.path.normpath(str(checkpoint_id))))
    if named and int(named.group(1)) != step:
        raise ResumeError(
            f"{checkpoint_id}: its dataloader state is of step {step}, the folder is named for step "
            f"{int(named.group(1))}; the loader entries were copied from another checkpoint (or the folder was "
            "renamed): restore it from a good copy"
        )


# ---- the resume sequence ---------------------------------------------------------------------------


class LaneTarget(Protocol):
    """What restore() loads the loader state into: a RankSteps (the loaders), or PlannedLanes (plan). Its
    load_state_dict() sets `restored` (read_state)."""

    lane_ids: list[int]
    num_lanes: int
    restored: Restored | None

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


class _Loading:
    """A loader as DCP loads it: as its state_dict, templates sized from the checkpoint's index (only their size
    counts); its load_state_dict, the loader's. The loader's own state_dict() always means its state."""

    def __init__(self, loader: LaneTarget, sizes: tuple[int, int]):
        self.loader, self.sizes = loader, sizes

    def state_dict(self) -> dict[str, Any]:
        return templates(self.loader.lane_ids, self.sizes)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.loader.load_state_dict(state_dict)


def templates(lane_ids: Any, sizes: tuple[int, int]) -> dict[str, torch.Tensor]:
    """Entries to load a checkpoint's loader state into (only their size counts)."""
    header, lane = sizes
    return {HEADER_KEY: torch.zeros(header, dtype=torch.uint8)} | {
        lane_key(lane_id): torch.zeros(lane, dtype=torch.uint8) for lane_id in lane_ids
    }


def restore(
    states: dict[str, Any], checkpoint_id: str, loader: LaneTarget | None, metadata: Metadata | None = None
) -> Metadata:
    """Load `states` (as dcp.load would: Stateful values are restored in place) from a DCP checkpoint, running
    none of its bytes (loader/checkpoint.py). With `loader` (states' `dataloader`, a zephon_titan loader state):
    the index is checked first (check_index: a model-only checkpoint, fewer lanes, entries of another size are
    named before DCP runs), the templates sized from it, and after the load the loader state's step bound to
    the train_state's and the folder's (check_step). Without: any other `dataloader` (TorchTitan's own) loads
    as its owner stored it. Returns the checkpoint's index."""
    if metadata is None:
        metadata = read_checkpoint_metadata(checkpoint_id)
    if loader is None:
        with _quiet():
            safe_load(states, checkpoint_id, metadata=metadata, tensors_only=())
        return metadata
    assert any(value is loader for value in states.values()), "restore() loads the loader it is given in states"
    sizes = check_index(metadata, checkpoint_id, loader.lane_ids, loader.num_lanes)
    loader.restored = None
    loading = {key: _Loading(loader, sizes) if value is loader else value for key, value in states.items()}
    with _quiet():
        try:
            safe_load(loading, checkpoint_id, metadata=metadata)
        except ResumeError as e:  # the resume's checks (engine/resume.py) speak of the state: say which checkpoint
            raise e if str(checkpoint_id) in str(e) else ResumeError(f"{checkpoint_id}: {e}") from None
    # DCP loads tensors in place and replaces other values in the dict it is given: those go back to `states`.
    states.update({key: value for key, value in loading.items() if not isinstance(value, _Loading)})
    assert loader.restored is not None, "DCP restores the loader state it loaded"
    check_step(checkpoint_id, loader.restored.step, _train_step(states.get(TRAIN_STATE)))
    return metadata


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Without a process group (plan), DCP warns that it assumes one process: it is."""
    with warnings.catch_warnings():
        if not dist.is_initialized():
            warnings.simplefilter("ignore")
        yield


def _train_step(train_state: Any) -> object:
    """The step of a loaded train_state: TorchTitan's TrainState, data_run's counter, or plan's template."""
    if isinstance(train_state, dict):
        return train_state.get("step")
    return getattr(train_state, "step", None)


class PlannedLanes:
    """The loader state of every lane of a job, restored without building a loader (plan): a LaneTarget."""

    def __init__(self, lane_ids: Any, fingerprint: Fingerprint, allow: Any = ()):
        self.lane_ids = list(lane_ids)
        self.num_lanes = len(self.lane_ids)
        self.fingerprint, self.allow = fingerprint, allow
        self.restored: Restored | None = None

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.restored = read_state(Decoded(state_dict), self.lane_ids, self.fingerprint, self.allow)


def train_state_template(metadata: Metadata) -> dict[str, Any]:
    """A template of the checkpoint's train_state step (TorchTitan's: an int stored as bytes; data_run's: a
    tensor), to bind the loader state to it ({} when the checkpoint has none)."""
    meta = metadata.state_dict_metadata.get(f"{TRAIN_STATE}.step")
    if meta is None:
        return {}
    template = torch.zeros((), dtype=torch.int64) if isinstance(meta, TensorStorageMetadata) else None
    return {TRAIN_STATE: {"step": template}}
