"""Checkpoints as an adversary crafts them: a `.metadata` payload that runs code and returns the real
index, entries copied from another checkpoint, a loader entry stored as a Python object."""

from __future__ import annotations

import os
import pickle
import warnings
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from zephon_titan.loader.checkpoint import read_checkpoint_metadata, safe_load


class Payload:
    """Plain pickle rebuilds this by calling eval: it writes `marker`, then returns the genuine object
    pickled in `inner`, so whoever unpickles it sees nothing wrong."""

    def __init__(self, inner: bytes, marker: str):
        self.inner, self.marker = inner, marker

    def __reduce__(self):
        code = (
            f"(__import__('pathlib').Path({self.marker!r}).write_text('ran'), "
            f"__import__('pickle').loads({self.inner!r}))[1]"
        )
        return (eval, (code,))


def plant_payload(checkpoint: str, marker: str) -> None:
    """Replace a checkpoint's `.metadata` by a payload that runs code and returns the genuine index."""
    path = os.path.join(checkpoint, ".metadata")
    with open(path, "rb") as f:
        genuine = f.read()
    with open(path, "wb") as f:
        f.write(pickle.dumps(Payload(genuine, marker), protocol=4))


def recorded_globals(checkpoint: str) -> set[tuple[str, str]]:
    """Every global a checkpoint's `.metadata` names (read by plain pickle: only for checkpoints we wrote)."""

    class Recorder(pickle.Unpickler):
        def find_class(self, module, name):
            seen.add((module, name))
            return super().find_class(module, name)

    seen: set[tuple[str, str]] = set()
    with open(os.path.join(checkpoint, ".metadata"), "rb") as f:
        Recorder(f).load()
    return seen


def load_entries(checkpoint: str) -> dict[str, Any]:
    """Every entry of a checkpoint, flat (`dataloader.lane_00003`, `train_state.step`, model and optimizer)."""
    metadata = read_checkpoint_metadata(checkpoint)
    state: dict[str, Any] = {
        key: torch.zeros(tuple(meta.size), dtype=meta.properties.dtype)
        if isinstance(meta, TensorStorageMetadata)
        else None
        for key, meta in metadata.state_dict_metadata.items()
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        safe_load(state, checkpoint, metadata=metadata, tensors_only=())
    return state


def save_entries(entries: dict[str, Any], checkpoint: str) -> None:
    """Write flat entries as a DCP checkpoint (the keys TorchTitan's load asks for). Not flattened further:
    an entry given as a dict is stored as one Python object under its key."""
    from torch.distributed.checkpoint import DefaultSavePlanner

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(entries, checkpoint_id=checkpoint, planner=DefaultSavePlanner(flatten_state_dict=False))


def with_loader_of(checkpoint: str, donor: str, target: str) -> None:
    """`checkpoint`'s entries with the whole `dataloader` state of `donor` (another step of the same run),
    written to `target`: what copying one checkpoint's loader files into another amounts to."""
    entries = load_entries(checkpoint)
    loader = {k: v for k, v in load_entries(donor).items() if k.startswith("dataloader.")}
    assert set(loader) == {k for k in entries if k.startswith("dataloader.")}
    save_entries({**entries, **loader}, target)


def with_header_edited(checkpoint: str, target: str, edit) -> str:
    """`checkpoint` with its loader header edited and resealed, every lane resealed to it, written to `target`:
    what a writer that knows the format (another version, a bug) could produce."""
    from zephon_titan.engine.resume import HEADER_KEY, seal
    from zephon_titan.loader.state import decode_entry, encode_entry

    entries = load_entries(checkpoint)
    header = decode_entry(entries[f"dataloader.{HEADER_KEY}"], HEADER_KEY)
    edit(header)
    header = seal({k: v for k, v in header.items() if k != "seal"}, HEADER_KEY)
    for key, value in list(entries.items()):
        name = key.split(".", 1)[1]
        if name == HEADER_KEY:
            entries[key] = encode_entry(header, value.numel())
        elif key.startswith("dataloader."):
            entry = {k: v for k, v in decode_entry(value, name).items() if k != "seal"}
            entries[key] = encode_entry(seal(entry, name, header["seal"]), value.numel())
    save_entries(entries, target)
    return target
