"""An EngineSpec across a process boundary: what a worker process needs to build the same spec (plain data, no
open files), and the spec built from it.

It stands apart from spec.py because only the processes that start others (workers.py, lane_digests.py) need it:
the files' listings travel with it, so a worker lists and scans nothing, and the tokenizer travels as its JSON.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Any, TypedDict

from zephon_titan.config import DataConfig
from zephon_titan.engine.pipeline import eras_text, read_eras
from zephon_titan.engine.seq_len_schedule import Era
from zephon_titan.engine.sources.base import FileRecord
from zephon_titan.engine.spec import EngineSpec, build_engine
from zephon_titan.engine.tokenize import DocumentTokenizer


class PortableSpec(TypedDict):
    """What a worker process needs to rebuild the same spec (plain data, no open files)."""

    config: dict[str, Any]  # DataConfig's fields by name
    seq_len: int
    tokenizer: str  # Tokenizer.to_str()
    bos: list[Any]  # [token_id, reason] of a SpecialTokenChoice
    eos: list[Any]
    tokenizer_folder: str  # where a chat source's template is (DocumentTokenizer.folder)
    listings: dict[str, list[FileRecord]]  # source name -> its files' records
    phase_offsets: list[str] | None  # EngineSpec.phase_offsets as "k/n" texts
    eras: list[list[int]]  # EngineSpec.eras as [start, seq_len, chunk]
    pipelines: str  # EngineSpec.pipeline_eras and the sources' slots (pipeline.eras_text)


def portable(spec: EngineSpec) -> PortableSpec:
    """What a worker process needs to rebuild the same spec (plain data, no open files)."""
    fields = [f.name for f in dataclasses.fields(DataConfig)]
    return {
        "config": {name: getattr(spec.config, name) for name in fields},
        "seq_len": spec.seq_len,
        "tokenizer": spec.tokenizer.tokenizer.to_str(),
        "bos": [spec.tokenizer.bos.token_id, spec.tokenizer.bos.reason],
        "eos": [spec.tokenizer.eos.token_id, spec.tokenizer.eos.reason],
        "tokenizer_folder": spec.tokenizer.folder,
        "listings": {s.name: [f.record() for f in s.files] for s in spec.sources},
        "phase_offsets": None if spec.phase_offsets is None else [str(u) for u in spec.phase_offsets],
        "eras": [[e.start, e.seq_len, e.chunk] for e in spec.eras],
        "pipelines": eras_text(spec.pipeline_eras, {s.name: s.slots for s in spec.sources}),
    }


def spec_from_portable(data: PortableSpec) -> EngineSpec:
    from tokenizers import Tokenizer

    from zephon_titan.engine.tokenize import BackendLoad, SpecialTokenChoice

    backend = data["config"]["tokenizer_backend"]
    loading = BackendLoad(data["tokenizer"], backend)  # alongside the reference's load, not after it
    tokenizer = DocumentTokenizer(
        Tokenizer.from_str(data["tokenizer"]),
        SpecialTokenChoice(*data["bos"]),
        SpecialTokenChoice(*data["eos"]),
        backend,
        loading,
        folder=data["tokenizer_folder"],
    )
    spec = build_engine(DataConfig(**data["config"]), data["seq_len"], tokenizer, data["listings"])
    offsets = data["phase_offsets"]
    if offsets is not None:
        spec = dataclasses.replace(spec, phase_offsets=tuple(map(Fraction, offsets)))
    spec = spec.with_pipeline_eras(*read_eras(data["pipelines"]))
    return spec.with_eras(tuple(Era(*e) for e in data["eras"]))
