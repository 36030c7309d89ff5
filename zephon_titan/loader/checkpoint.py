"""Reading a DCP checkpoint without running any of its bytes (torch only, no torchtitan).

DCP's `.metadata` index is a pickle, and DCP's default planner rebuilds every entry stored as bytes
(any value that is not a tensor) with `torch.load(weights_only=False)`: as shipped, loading a
checkpoint runs whatever code it names. Every load this project owns (the loader's resume sequence,
loader/state.restore, used by `plan --from-checkpoint`, data_run and ZephonTrainer) goes through `safe_load`:

- `.metadata` is read by an unpickler that rebuilds only the classes a DCP index holds (ALLOWED_GLOBALS:
  DCP's metadata classes, `torch.Size`, dtypes, layouts, memory formats, the checkpoint's path); any other
  global is refused, naming it, before anything is called;
- entries stored as bytes are read with `torch.load(weights_only=True)` (plain data: TorchTitan's
  train_state integers, optimizer hyperparameters), never by the full unpickler;
- a `dataloader.*` entry that the index declares as a Python object is refused before DCP reads it:
  zephon_titan stores its state as tensors only.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Iterable
from typing import IO, Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    StorageMeta,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import ReadItem

from zephon_titan.errors import ResumeError

# The checkpoint's keys of the loader state and the trainer's step (TorchTitan's DATALOADER and TRAIN_STATE; here
# as well so that the torch-only readers, plan and data_run, name them without importing TorchTitan).
DATALOADER = "dataloader"
TRAIN_STATE = "train_state"

_DCP_METADATA = "torch.distributed.checkpoint.metadata"

# What a DCP index holds, found by recording every global that real checkpoints' `.metadata` reference
# (tests/unit/test_checkpoint_safety.py keeps checking it): dcp.save of this loader's state with a
# train_state, and TorchTitan's trainer checkpoints (model, optimizer, lr scheduler, dataloader,
# train_state). Memory formats are pickled as DCP's _MEM_FORMAT_ENCODING enum, layouts through
# torch.serialization._get_layout (a lookup by name), dtypes as torch attributes, and the
# StorageMeta's checkpoint_id as the path it was saved to. No builtins, collections or copyreg
# names appear (protocol 4 rebuilds dataclasses with NEWOBJ + BUILD).
ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {
        (_DCP_METADATA, name)
        for name in (
            "Metadata",
            "StorageMeta",
            "MetadataIndex",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "_MEM_FORMAT_ENCODING",
        )
    }
    | {
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),
        ("pathlib", "PosixPath"),
    }
    | {("torch", name) for name in dir(torch) if isinstance(getattr(torch, name, None), torch.dtype)}
)


class _MetadataUnpickler(pickle.Unpickler):
    """Rebuilds only ALLOWED_GLOBALS: a payload naming anything else is refused before it is called."""

    def __init__(self, file: IO[bytes], checkpoint: str):
        super().__init__(file)
        self.checkpoint = checkpoint

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise ResumeError(
            f"{self.checkpoint}: its .metadata refers to {module}.{name}, which no DCP checkpoint index holds; "
            "refusing to read it (unpickling it could run code): the checkpoint was crafted or damaged"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise ResumeError(
            f"{self.checkpoint}: its .metadata holds a persistent id, which no DCP index does; refusing it"
        )


def unpickle_metadata(file: IO[bytes], checkpoint: str) -> Metadata:
    """A DCP `.metadata` read from `file` with the allow-listed unpickler, checked to be a DCP index."""
    try:
        metadata = _MetadataUnpickler(file, checkpoint).load()
    except ResumeError:
        raise
    except Exception as e:  # truncated, not a pickle, or an allowed callable given bad arguments
        raise ResumeError(
            f"{checkpoint}: its .metadata is not a DCP checkpoint index ({type(e).__name__}: {_first_line(e)})"
        ) from None
    entries = getattr(metadata, "state_dict_metadata", None)
    if not isinstance(metadata, Metadata) or not isinstance(entries, dict):
        raise ResumeError(f"{checkpoint}: its .metadata is not a DCP checkpoint index (got {type(metadata).__name__})")
    for key, meta in entries.items():
        if not isinstance(key, str) or not isinstance(meta, TensorStorageMetadata | BytesStorageMetadata):
            raise ResumeError(f"{checkpoint}: its .metadata entry {key!r:.80} is not a DCP entry description")
    return metadata


def _read_metadata(reader: FileSystemReader, kwargs: dict[str, Any]) -> Metadata:
    """FileSystemReader.read_metadata with the allow-listed unpickler (same file, storage_meta, load_id);
    the index checked before the load (safe_load) if the reader was given one."""
    rank = kwargs.get("rank")
    metadata: Metadata | None = getattr(reader, "checked_metadata", None) if rank is None else None
    if metadata is None:
        path = reader._get_metadata_path(rank)
        _refuse_special_file(str(path))
        with reader.fs.create_stream(path, "rb") as file:
            metadata = unpickle_metadata(file, str(reader.path))  # type: ignore[arg-type]
        storage = getattr(metadata, "storage_data", None) or {}
        for name in sorted({getattr(info, "relative_path", "") for info in storage.values()} - {""}):
            _refuse_special_file(os.path.join(str(reader.path), name))  # the .distcp files DCP will open
    if getattr(metadata, "storage_meta", None) is None:
        metadata.storage_meta = StorageMeta()
    assert metadata.storage_meta is not None
    metadata.storage_meta.load_id = reader.load_id
    return metadata


def _refuse_special_file(path: str) -> None:
    """A local `.metadata` that is a FIFO (its read would wait for a writer for good), a device or a folder is
    refused before it is opened; a missing one is left to the reader, whose error the caller words."""
    from zephon_titan.engine.sources import guards

    if "://" in path:
        return
    try:
        st = os.stat(path)
    except OSError:
        return
    guards.check_regular(path, st, ResumeError, "resume from a checkpoint folder as DCP wrote it")


class SafeFileSystemReader(FileSystemReader):
    """DCP's FileSystemReader whose `.metadata` is read by the allow-listed unpickler. Given the index
    already read and checked, it plans the load with that one: `.metadata` is not read a second time."""

    def __init__(self, path: str | os.PathLike, metadata: Metadata | None = None):
        super().__init__(path)
        self.checked_metadata = metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        return _read_metadata(self, kwargs)


def safe_reader(checkpoint_id: str, metadata: Metadata | None = None) -> FileSystemReader:
    """A DCP storage reader of `checkpoint_id` that runs no checkpoint byte: a local folder, or an fsspec
    URI (TorchTitan's checkpoint.folder may be remote), as dcp.load would choose."""
    if "://" not in str(checkpoint_id):
        return SafeFileSystemReader(checkpoint_id, metadata)
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    class SafeFsspecReader(FsspecReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
            return _read_metadata(self, kwargs)

    reader = SafeFsspecReader(checkpoint_id)
    reader.checked_metadata = metadata  # type: ignore[attr-defined]
    return reader


def read_checkpoint_metadata(checkpoint_id: str) -> Metadata:
    """The DCP index of a checkpoint, read without executing it (ResumeError if it cannot be read)."""
    reader = safe_reader(checkpoint_id)
    try:
        return reader.read_metadata()
    except ResumeError:
        raise
    except Exception as e:  # a missing folder or .metadata: an incomplete save or a wrong path
        raise ResumeError(f"{checkpoint_id} is not a readable DCP checkpoint ({_first_line(e)})") from None


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, but an entry stored as bytes is rebuilt with torch.load(weights_only=True):
    plain data (numbers, strings, containers, tensors) loads, anything that names code is refused."""

    def __init__(self, checkpoint: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.checkpoint = checkpoint

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        try:
            obj = torch.load(value, weights_only=True)
        except Exception as e:
            raise ResumeError(
                f"{self.checkpoint}: entry {fqn} is a Python object that only running code could rebuild "
                f"({_first_line(e)}); refusing to load it"
            ) from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj


def refuse_objects(metadata: Metadata, checkpoint_id: str, prefixes: Iterable[str]) -> None:
    """Refuse a checkpoint whose index declares an entry under one of `prefixes` (e.g. `dataloader`) as a
    Python object: zephon_titan stores its state as tensors only, so someone else wrote it."""
    prefixes = tuple(f"{p}." for p in prefixes)
    for key, meta in metadata.state_dict_metadata.items():
        if key.startswith(prefixes) and not isinstance(meta, TensorStorageMetadata):
            raise ResumeError(
                f"{checkpoint_id}: {key} is stored as a Python object, not a tensor; zephon_titan never writes "
                "that, so the checkpoint was not written by it (or was altered): refusing to load it"
            )


def safe_load(
    state_dict: dict[str, Any],
    checkpoint_id: str,
    *,
    metadata: Metadata | None = None,
    tensors_only: Iterable[str] = (DATALOADER,),
) -> Metadata:
    """dcp.load(state_dict, checkpoint_id) without running any checkpoint byte: the index read by the
    allow-listed unpickler (or `metadata`, read so before), each of `tensors_only` that `state_dict`
    requests refused if the index holds a Python object under it, bytes entries loaded weights-only.
    A refusal inside DCP (on any rank's read) is raised as itself, one line. Returns the index."""
    if metadata is None:
        metadata = read_checkpoint_metadata(checkpoint_id)
    refuse_objects(metadata, checkpoint_id, [p for p in tensors_only if p in state_dict])
    try:
        dcp.load(
            state_dict,
            storage_reader=safe_reader(checkpoint_id, metadata),
            planner=SafeLoadPlanner(str(checkpoint_id)),
        )
    except CheckpointException as e:
        for failure in e.failures.values():
            cause = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(cause, ResumeError):
                raise cause from None
        raise
    return metadata


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:300]
