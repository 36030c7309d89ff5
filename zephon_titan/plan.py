"""Predict a job's batch ledger offline: every lane simulated in one process, no GPU, no torchrun.

Reads the job TOML's `[training]` (seq_len, global_batch_size), `hf_assets_path`
(the trainer's tokenizer, unless `[dataloader] tokenizer_path` is set) and
`[dataloader]`. Lane streams do not depend on the number of ranks, so one process
computes exactly what a run on any number of GPUs will write. From a checkpoint,
the lanes start from the states saved in its DCP `dataloader` entries.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from zephon_titan.config import DataConfig, config_from_dict, load_toml
from zephon_titan.engine import (
    EngineSpec, LaneState, batch_digest, build_engine, check_fingerprint, fingerprint, lane_digest,
    load_tokenizer, open_lane_group, rows_per_lane,
)
from zephon_titan.engine.ledger import LedgerEntry
from zephon_titan.errors import ConfigError, LaneExhausted, ResumeError


@dataclass(frozen=True)
class Job:
    """The parts of a job TOML the data path depends on."""

    path: str
    config: DataConfig
    spec: EngineSpec
    global_batch_size: int
    local_batch_size: int

    @property
    def rows_per_lane(self) -> int:
        return rows_per_lane(self.global_batch_size, self.spec.num_lanes)


def load_job(job_path: str) -> Job:
    job = load_toml(job_path)
    training = job.get("training", {})
    for key in ("seq_len", "global_batch_size"):
        if key not in training:
            raise ConfigError(f"{job_path}: [training] {key} is needed")
    try:
        config = config_from_dict(job.get("dataloader", {}))
    except ConfigError as e:
        raise ConfigError(f"{job_path}: {e}") from None
    tokenizer_path = config.tokenizer_path or job.get("hf_assets_path")
    if not tokenizer_path:
        raise ConfigError(f"{job_path}: set hf_assets_path or [dataloader] tokenizer_path")
    tokenizer = load_tokenizer(tokenizer_path, add_bos=config.add_bos, add_eos=config.add_eos)
    spec = build_engine(config, training["seq_len"], tokenizer)
    return Job(job_path, config, spec, training["global_batch_size"], training.get("local_batch_size", 1))


def read_checkpoint(checkpoint: str, job: Job) -> tuple[int, dict[int, LaneState]]:
    """(step, lane states) from a TorchTitan DCP checkpoint folder (e.g. outputs/checkpoint/step-500)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    try:
        keys = FileSystemReader(checkpoint).read_metadata().state_dict_metadata
    except Exception as e:  # a missing folder or .metadata: an incomplete or wrong path
        raise ResumeError(f"{checkpoint} is not a readable DCP checkpoint ({e})") from None
    entries = {k.split(".", 1)[1]: meta for k, meta in keys.items() if k.startswith("dataloader.")}
    if "header" not in entries:
        raise ResumeError(f"{checkpoint} holds no zephon_titan dataloader state (was it saved model-only?)")
    import torch

    state = {"dataloader": {k: torch.zeros(tuple(m.size), dtype=torch.uint8) for k, m in entries.items()},
             "train_state": {"step": 0}}
    if "train_state.step" not in keys:
        del state["train_state"]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to load in a single process": it is
        dcp.load(state, checkpoint_id=checkpoint)
    from zephon_titan.titan.state_codec import decode_entry

    decoded = {k: decode_entry(v, k) for k, v in state["dataloader"].items()}
    check_fingerprint(decoded["header"]["fingerprint"], fingerprint(job.spec), job.config.resume_allow)
    states = {int(k.split("_")[1]): LaneState.from_dict(e["state"]) for k, e in decoded.items() if k.startswith("lane_")}
    step = int(state["train_state"]["step"]) if "train_state" in state else states[0].rows // job.rows_per_lane
    return step, states


def plan_ledger(job_path: str, steps: int, checkpoint: str | None = None) -> Iterator[LedgerEntry]:
    """Ledger entries up to step `steps` (from the checkpoint's step + 1 if given)."""
    job = load_job(job_path)
    start, states = read_checkpoint(checkpoint, job) if checkpoint else (0, None)
    names = job.spec.source_names
    with open_lane_group(job.spec, range(job.spec.num_lanes), job.rows_per_lane, job.config.workers,
                         job.config.prefetch_steps, states) as group:
        for step in range(start + 1, steps + 1):
            try:
                lanes = group.next_step()
            except LaneExhausted:  # a finite run stops at the first step any lane cannot fill
                return
            tokens = [0] * len(names)
            padding = 0
            for rows in lanes:
                for row in rows:
                    tokens = [a + b for a, b in zip(tokens, row.tokens_by_source(len(names)))]
                    padding += row.padding
            yield LedgerEntry(step=step, sha256=batch_digest(lane_digest(rows) for rows in lanes),
                              rows=job.global_batch_size, tokens=dict(zip(names, tokens)), padding=padding)
