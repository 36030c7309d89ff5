"""The loader's DCP entries: JSON text in zero-padded uint8 tensors (torch only, no torchtitan).

Every entry is sealed: a SHA-256 over its canonical JSON, its key and (for lanes) the header's
seal, which covers the fingerprint and the global batch size. So one changed byte, an edited
field, or a lane entry copied to another lane is refused on load, naming the entry; then every
field's type and range is checked. This promises integrity (corruption and mismatch are found),
not authenticity: whoever can write the checkpoint can also recompute a seal.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any

import torch

from zephon_titan.engine.state import LaneState
from zephon_titan.errors import ResumeError

HEADER_KEY = "header"
HEADER_VERSION = 2


def lane_key(lane_id: int) -> str:
    return f"lane_{lane_id:05d}"


# State entries are JSON text in zero-padded uint8 tensors, not Python objects: DCP stores
# tensors as raw bytes but unpickles any other value on load, and a checkpoint must be data,
# not code. DCP reads a tensor only into a template of the saved shape, so capacities must not
# depend on anything a resume may change. The header slot is one fixed size (replicated, stored
# once): any checkpoint's header can be read, and a changed config is named, not a shape error.
# It fits config.MAX_SOURCES sources with names of up to config.MAX_SOURCE_NAME characters (both
# enforced when the config is read, so no header overflows at the first save; test_state_codec
# encodes the largest header). A lane entry grows with the number of sources (part of the
# fingerprint), with room for 64-bit counters.
HEADER_CAPACITY = 1 << 17


def lane_capacity(num_sources: int) -> int:
    return 512 + 96 * num_sources


def stored_lane_capacity(checkpoint_id: str, metadata: Any = None) -> int | None:
    """The size of the lane entries a DCP checkpoint folder holds (None if it has no `.metadata`): DCP
    loads into a template of the saved size, and a resume that adds sources has bigger entries of its own.
    Reads the index (or takes `metadata`, read so before) with the allow-listed unpickler of
    titan/checkpoint.py: a `.metadata` that names anything else is a ResumeError, never run."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from zephon_titan.titan.checkpoint import read_checkpoint_metadata

    if metadata is None:
        if "://" not in str(checkpoint_id) and not os.path.isfile(os.path.join(checkpoint_id, ".metadata")):
            return None  # no folder or an incomplete save: the load itself reports it
        metadata = read_checkpoint_metadata(checkpoint_id)
    for key, meta in metadata.state_dict_metadata.items():
        if key.startswith("dataloader.lane_") and isinstance(meta, TensorStorageMetadata) and len(meta.size) == 1:
            return int(meta.size[0])
    return None


def _canonical(obj: dict) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode("utf-8")


def _seal_of(obj: dict, key: str, bound_to: str) -> str:
    body = {k: v for k, v in obj.items() if k != "seal"}
    return hashlib.sha256(f"{key}\n{bound_to}\n".encode() + _canonical(body)).hexdigest()[:32]


def seal(obj: dict, key: str, bound_to: str = "") -> dict:
    return {**obj, "seal": _seal_of(obj, key, bound_to)}


def _check_seal(obj: Any, key: str, bound_to: str) -> dict:
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


def encode_entry(obj: dict, capacity: int) -> torch.Tensor:
    data = _canonical(obj)
    if len(data) > capacity:
        raise ResumeError(f"dataloader state entry of {len(data)} bytes exceeds its {capacity}-byte slot: {obj}")
    out = torch.zeros(capacity, dtype=torch.uint8)
    out[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return out


def decode_entry(value: torch.Tensor, key: str) -> dict:
    try:
        return json.loads(value.cpu().numpy().tobytes().rstrip(b"\0").decode("utf-8"))
    except (AttributeError, TypeError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ResumeError(f"dataloader state {key!r} is not a zephon_titan state entry ({e})") from None


def _field(entry: dict, name: str, kind: type, where: str) -> Any:
    value = entry.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ResumeError(f"{where}: field {name!r} must be {kind.__name__}, got {value!r}; the checkpoint is damaged")
    return value


def _counts(value: Any, length: int, field: str, where: str) -> list[int]:
    ok = (
        isinstance(value, list)
        and len(value) == length
        and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 63 for v in value)
    )
    if not ok:
        raise ResumeError(
            f"{where}: field {field!r} must be {length} counts >= 0, got {value!r}; the checkpoint is damaged"
        )
    return value


def read_header(state: dict[str, Any]) -> dict:
    """The checked header of a checkpoint's dataloader entries (decoded tensors or raw JSON dicts)."""
    header = _check_seal(_entry(state, HEADER_KEY), HEADER_KEY, "")
    where = f"dataloader state {HEADER_KEY!r}"
    fingerprint = _field(header, "fingerprint", dict, where)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in fingerprint.items()):
        raise ResumeError(f"{where}: field 'fingerprint' must map names to strings; the checkpoint is damaged")
    num_lanes = fingerprint.get("num_lanes", "")
    if not re.fullmatch(r"[1-9][0-9]{0,8}", num_lanes):
        raise ResumeError(
            f"{where}: field 'fingerprint' has no num_lanes (a lane count), got {num_lanes!r:.40}; the checkpoint "
            "is damaged"
        )
    lanes = int(num_lanes)
    batch = _field(header, "global_batch_size", int, where)
    if not lanes <= batch < 1 << 40 or batch % lanes:
        raise ResumeError(
            f"{where}: field 'global_batch_size' is {batch}, not a multiple of its {lanes} lanes (at least one row "
            "per lane per step); the checkpoint is damaged"
        )
    if "step" in header:  # absent in checkpoints written before the global batch size could change
        step = _field(header, "step", int, where)
        if not 0 <= step < 1 << 63:
            raise ResumeError(f"{where}: field 'step' must be a step >= 0, got {step}; the checkpoint is damaged")
    return header


def read_lane(
    state: dict[str, Any], lane: int, header: dict, source_names: list[str]
) -> tuple[LaneState, list[int], int]:
    """(state, tokens per source, padding) of one lane, checked against its seal, its key and the
    checkpoint's sources, then matched by name to this run's `source_names` (a resume may add sources)."""
    key = lane_key(lane)
    entry = _check_seal(_entry(state, key), key, header["seal"])
    where = f"dataloader state of lane {lane} ({key!r})"
    raw = _field(entry, "state", dict, where)
    lane_state = LaneState.from_dict(raw, where)
    if lane_state.lane_id != lane:
        raise ResumeError(f"{where}: field 'lane_id' is {lane_state.lane_id}, not {lane}; the checkpoint is damaged")
    saved = saved_sources(header)
    if len(lane_state.cursors) != len(saved):
        raise ResumeError(
            f"{where}: field 'cursors' has {len(lane_state.cursors)} sources, the checkpoint has "
            f"{len(saved)}; the checkpoint is damaged"
        )
    tokens = _counts(entry.get("tokens"), len(saved), "tokens", where)
    padding = _counts([entry.get("padding")], 1, "padding", where)[0]
    if lane_state.rows < header.get("step", 0):
        raise ResumeError(
            f"{where}: field 'rows' is {lane_state.rows}, fewer than the header's {header['step']} steps (each "
            "step takes at least one row of every lane); the checkpoint is damaged"
        )
    if lane_state.mix is not None and lane_state.mix.segment > header.get("step", lane_state.rows) + 1:
        raise ResumeError(
            f"{where}: field 'mix.segment' is step {lane_state.mix.segment}, after the checkpoint's step "
            f"{header.get('step', lane_state.rows)}; the checkpoint is damaged"
        )
    if saved != source_names:
        by_name = dict(zip(saved, tokens))
        lane_state = lane_state.with_sources(saved, source_names)
        tokens = [by_name.get(name, 0) for name in source_names]
    return lane_state, tokens, padding


def saved_sources(header: dict) -> list[str]:
    """The names of the sources a checkpoint was saved with (its fingerprint's `sources`)."""
    return header["fingerprint"].get("sources", "").split(",")


def _entry(state: dict[str, Any], key: str) -> Any:
    if key not in state:
        raise ResumeError(f"the checkpoint's dataloader state has no {key!r}")
    value = state[key]
    return decode_entry(value, key) if isinstance(value, torch.Tensor) else value
