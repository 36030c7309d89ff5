"""The loader's DCP entries: JSON text in zero-padded uint8 tensors (torch only, no torchtitan)."""

from __future__ import annotations

import json

import torch

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


def encode_entry(obj: dict, capacity: int) -> torch.Tensor:
    data = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode("utf-8")
    if len(data) > capacity:
        raise ResumeError(f"dataloader state entry of {len(data)} bytes exceeds its {capacity}-byte slot: {obj}")
    out = torch.zeros(capacity, dtype=torch.uint8)
    out[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return out


def decode_entry(value: torch.Tensor, key: str) -> dict:
    try:
        return json.loads(value.cpu().numpy().tobytes().rstrip(b"\0").decode("utf-8"))
    except (AttributeError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ResumeError(f"dataloader state {key!r} is not a zephon_titan state entry ({e})") from None
