"""Predict a job's batch ledger offline: every lane simulated in one process, no GPU, no torchrun.

Reads the job exactly as the trainer does (titan/job.py: the same TorchTitan config,
tokenizer and batch layout). Lane streams do not depend on the number of ranks, so one process
computes exactly what a run on any number of GPUs will write. From a checkpoint,
the lanes start from the states saved in its DCP `dataloader` entries.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

from zephon_titan.engine import (
    LaneState,
    batch_digest,
    build_engine,
    lane_digest,
    open_lane_group,
    rows_per_lane,
    tally,
)
from zephon_titan.engine.eval_set import eval_set_digest, eval_steps, label_counts
from zephon_titan.engine.ledger import LedgerEntry, step_weights
from zephon_titan.errors import ConfigError, LaneExhausted, ResumeError
from zephon_titan.titan.dataloader import check_header, read_lane_states, saved_step
from zephon_titan.titan.job import Job, load_job
from zephon_titan.titan.state_codec import HEADER_KEY, read_header
from zephon_titan.titan.tokenizer import loader_tokenizer
from zephon_titan.titan.validator import check_eval_data, eval_message


def read_checkpoint(checkpoint: str, job: Job) -> tuple[int, dict[int, LaneState]]:
    """(step, lane states) from a TorchTitan DCP checkpoint folder (e.g. outputs/checkpoint/step-500).

    Runs no byte of the checkpoint (titan/checkpoint.py): its `.metadata` index is read by an
    allow-listed unpickler, the loader's entries are loaded as raw tensors (one declared as a Python
    object is refused), and the train_state step, when the checkpoint has one, as plain data. The
    loader state's step must be the checkpoint's: the train_state's and the folder's (`step-N`).
    """
    import warnings

    import torch
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from zephon_titan.engine import check_mixture, fingerprint
    from zephon_titan.titan.checkpoint import read_checkpoint_metadata, refuse_objects, safe_load

    metadata = read_checkpoint_metadata(checkpoint)
    entries = {
        k.split(".", 1)[1]: meta for k, meta in metadata.state_dict_metadata.items() if k.startswith("dataloader.")
    }
    if HEADER_KEY not in entries:
        raise ResumeError(f"{checkpoint} holds no zephon_titan dataloader state (was it saved model-only?)")
    refuse_objects(metadata, checkpoint, ["dataloader"])
    state: dict = {
        "dataloader": {
            k: torch.zeros(tuple(meta.size), dtype=torch.uint8)
            for k, meta in entries.items()
            if isinstance(meta, TensorStorageMetadata)
        }
    }
    step_meta = metadata.state_dict_metadata.get("train_state.step")
    if step_meta is not None:  # TorchTitan's (an int stored as bytes) or data_run's (a tensor)
        template = torch.zeros((), dtype=torch.int64) if isinstance(step_meta, TensorStorageMetadata) else None
        state["train_state"] = {"step": template}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to load in a single process": it is
        safe_load(state, checkpoint, metadata=metadata)

    loader_state = state["dataloader"]
    header = read_header(loader_state)
    check_header(header, fingerprint(job.spec), job.data.resume_allow)
    lanes = read_lane_states(loader_state, range(job.data.num_lanes), header, job.spec.source_names)
    states = {lane: entry[0] for lane, entry in lanes.items()}
    step = saved_step(header, states[0].rows)
    _check_checkpoint_step(checkpoint, step, state.get("train_state", {}).get("step"))
    check_mixture(header["fingerprint"], fingerprint(job.spec), step)
    return step, states


def _check_checkpoint_step(checkpoint: str, step: int, train_step: object) -> None:
    """The loader state's step must be the train_state's and the folder name's (`step-N`), when known."""
    import torch

    if isinstance(train_step, torch.Tensor) and train_step.numel() == 1:
        train_step = int(train_step.item())
    if train_step is not None and train_step != step:
        if not isinstance(train_step, int) or isinstance(train_step, bool):
            raise ResumeError(f"{checkpoint}: its train_state step is {train_step!r:.40}, not a step")
        raise ResumeError(
            f"{checkpoint}: its dataloader state is of step {step}, its train_state of step {train_step}; the "
            "loader entries were copied from another checkpoint: restore it from a good copy"
        )
    named = re.fullmatch(r"step-(\d+)", os.path.basename(os.path.normpath(checkpoint)))
    if named and int(named.group(1)) != step:
        raise ResumeError(
            f"{checkpoint}: its dataloader state is of step {step}, the folder is named for step "
            f"{int(named.group(1))}; the loader entries were copied from another checkpoint (or the folder was "
            "renamed): restore it from a good copy"
        )


def plan_ledger(job_path: str, steps: int, checkpoint: str | None = None) -> Iterator[LedgerEntry]:
    """Ledger entries up to step `steps` (from the checkpoint's step + 1 if given)."""
    job = load_job(job_path)
    rows_per_lane = job.check_layout(1)
    job.check_model_vocab()
    start, states = read_checkpoint(checkpoint, job) if checkpoint else (0, None)
    names = job.spec.source_names
    spec = job.spec
    with open_lane_group(
        spec, range(spec.num_lanes), rows_per_lane, job.data.num_workers, job.data.prefetch_factor, states, False, start
    ) as group:
        for step in range(start + 1, steps + 1):
            try:
                lanes = group.next_step()
            except LaneExhausted:  # a finite run stops at the first step any lane cannot fill
                return
            counts = tally((row for rows in lanes for row in rows), len(names))
            digest = batch_digest(lane_digest(rows) for rows in lanes)
            yield LedgerEntry.of(step, digest, job.global_batch_size, names, counts, step_weights(spec, step))


def plan_eval_set(job_path: str) -> dict:
    """The eval set's proof as every validation of a run of the job logs it (titan/validator.py):
    its SHA-256, steps, rows and targets per source, computed offline over all lanes."""
    job = load_job(job_path)
    validator = job.config.validator
    data = validator.dataloader.data
    check_eval_data(data)
    spec = build_engine(data, job.seq_len, loader_tokenizer(data, job.trainer_tokenizer))
    batch = validator.dataloader.global_batch_size
    try:
        per_lane = rows_per_lane(batch, data.num_lanes)
    except ConfigError as e:
        raise ConfigError(f"{job.path}: {eval_message(e)}") from None
    digests, counts = [], [0] * len(spec.sources)
    for step in eval_steps(spec, range(data.num_lanes), per_lane, validator.steps):
        digests.append(batch_digest(step.lane_digests()))
        counts = [a + b for a, b in zip(counts, label_counts(step.rows, len(spec.sources)))]
    return {
        "sha256": eval_set_digest(digests),
        "steps": len(digests),
        "rows": len(digests) * batch,
        "tokens": dict(zip(spec.source_names, counts)),
    }


@dataclass(frozen=True)
class MixtureReport:
    """Each source's share of the tokens of each planned step, against its (normalized) weight."""

    names: list[str]
    weights: list[float]
    steps: list[int]
    shares: list[list[float]]
    """shares[i][s]: source s's share of step steps[i]'s tokens (padding excluded)."""
    cumulative: list[list[float]]
    """cumulative[i][s]: source s's share of all tokens of steps[0..i]."""

    def step_errors(self) -> list[float]:
        """Per step: the largest |share - weight| over the sources."""
        return [max(abs(x - w) for x, w in zip(row, self.weights)) for row in self.shares]

    def cumulative_errors(self) -> list[float]:
        return [max(abs(x - w) for x, w in zip(row, self.weights)) for row in self.cumulative]

    def format(self) -> str:
        columns = [i for i, step in enumerate(self.steps) if step in _report_steps(self.steps)]
        lines = [
            f"mixture over steps {self.steps[0]}-{self.steps[-1]} (share of each step's tokens, all lanes)",
            f"{'source':<14}{'weight':>8}{'mean':>8}{'min':>8}{'max':>8}   cumulative at step "
            + ", ".join(str(self.steps[i]) for i in columns),
        ]
        for s, (name, weight) in enumerate(zip(self.names, self.weights)):
            per_step = [row[s] for row in self.shares]
            lines.append(
                f"{name:<14}{weight:>8.3f}{sum(per_step) / len(per_step):>8.3f}{min(per_step):>8.3f}"
                f"{max(per_step):>8.3f}   " + ", ".join(f"{self.cumulative[i][s]:.3f}" for i in columns)
            )
        errors = self.step_errors()
        lines.append(
            f"largest |share - weight| in one step: {max(errors):.3f} (step {self.steps[errors.index(max(errors))]}); "
            f"cumulative at step {self.steps[-1]}: {self.cumulative_errors()[-1]:.4f}"
        )
        return "\n".join(lines)


def _report_steps(steps: list[int]) -> set[int]:
    first, last = steps[0], steps[-1]
    return {s for s in (first, first + 9, first + 49, first + 199, first + 999, last) if first <= s <= last}


def mixture_report(entries: list[LedgerEntry], weights: list[float]) -> MixtureReport:
    names = list(entries[0].tokens) if entries else []
    shares, cumulative, totals = [], [], [0] * len(names)
    for entry in entries:
        counts = [entry.tokens[name] for name in names]
        totals = [a + b for a, b in zip(totals, counts)]
        shares.append([c / max(sum(counts), 1) for c in counts])
        cumulative.append([t / max(sum(totals), 1) for t in totals])
    return MixtureReport(names, list(weights), [e.step for e in entries], shares, cumulative)
