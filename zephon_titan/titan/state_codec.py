"""The loader's DCP entries: JSON text in zero-padded uint8 tensors (torch only, no torchtitan)."""

from __future__ import annotations

import json

import torch

from zephon_titan.errors import ResumeError


# State entries are JSON text in zero-padded uint8 tensors, not Python objects: DCP stores
# tensors as raw bytes but unpickles any other value on load, and a checkpoint must be data,
# not code. Capacities depend only on the number of sources (part of the fingerprint), so a
# resume asks DCP for exactly the shapes that were saved.
def lane_capacity(num_sources: int) -> int:
    return 256 + 64 * num_sources


def header_capacity(num_sources: int) -> int:
    return 1024 + 256 * num_sources


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
