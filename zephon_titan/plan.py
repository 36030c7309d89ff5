"""Predict a job's batch ledger offline: every lane simulated in one process, no GPU, no torchrun.

Reads the job's loader values as the trainer does: from the file when it states them all (job_view.py, no
TorchTitan), else through TorchTitan's config (titan/job.py); the same values, tokenizer and batch layout. Lane streams do not depend on the number of ranks, so one process
computes exactly what a run on any number of GPUs will write. From a checkpoint,
the lanes start from the states saved in its DCP `dataloader` entries.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from zephon_titan import progress
from zephon_titan.engine import (
    LaneState,
    batch_digest,
    build_engine,
    open_lane_group,
    rows_per_lane,
)
from zephon_titan.engine.cores import procs_note
from zephon_titan.engine.eval_set import eval_set_digest, eval_steps, label_counts
from zephon_titan.engine.lane_digests import PlanProcesses, step_digests
from zephon_titan.engine.ledger import LedgerEntry, step_entry
from zephon_titan.engine.spec import EngineSpec
from zephon_titan.errors import ConfigError
from zephon_titan.job_file import check_eval_data, eval_message, read_job_file
from zephon_titan.job_view import FileJob, LoaderJob
from zephon_titan.titan.tokenizer import loader_tokenizer


def open_job(path: str, needs_steps: bool = False) -> LoaderJob:
    """The job's loader values: the first pass (job_file.py) always, then the file's own values when it states
    them all (`needs_steps`: [training] steps too), else TorchTitan's resolved config (imported only then)."""
    file = read_job_file(path)
    job = FileJob.of(file, needs_steps)
    if job is not None:
        return job
    from zephon_titan.job_record import resolved_job  # the recipe's defaults: remembered, else TorchTitan's

    return resolved_job(path, file)


def read_checkpoint(checkpoint: str, job: LoaderJob) -> tuple[int, dict[int, LaneState], EngineSpec]:
    """(step, lane states, the job's spec as the run continues: mixing as its checkpoint did) from a TorchTitan
    DCP checkpoint folder (e.g. outputs/checkpoint/step-500), by the resume sequence every entry point uses
    (loader/state.restore): no checkpoint byte runs, the state is checked against the job, and its step
    must be the checkpoint's (the train_state's and the folder's)."""
    from zephon_titan.engine import fingerprint
    from zephon_titan.loader.checkpoint import read_checkpoint_metadata
    from zephon_titan.loader.state import DATALOADER, PlannedLanes, restore, train_state_template

    metadata = read_checkpoint_metadata(checkpoint)
    lanes = PlannedLanes(range(job.data.num_lanes), fingerprint(job.spec), job.data.resume_allow)
    restore({DATALOADER: lanes, **train_state_template(metadata)}, checkpoint, lanes, metadata)
    assert lanes.restored is not None
    restored = lanes.restored
    return restored.step, {lane: entry.state for lane, entry in restored.lanes.items()}, restored.spec(job.spec)


def plan_ledger(
    job_path: str | LoaderJob, steps: int, checkpoint: str | None = None, procs: int = 1
) -> Iterator[LedgerEntry]:
    """Ledger entries up to step `steps` (from the checkpoint's step + 1 if given). `procs` > 1: the lanes
    are split into that many contiguous ranges, each simulated by its own process (the same entries)."""
    if procs < 1:
        raise ConfigError(f"plan --procs must be at least 1, got {procs}")
    job = open_job(job_path) if isinstance(job_path, str) else job_path
    rows_per_lane = job.check_layout(1)
    job.check_model_vocab()
    spec = job.spec
    start, states = 0, None
    if checkpoint:  # the run continues mixing as its checkpoint did, as the loader does
        start, states, spec = read_checkpoint(checkpoint, job)
    names = spec.source_names
    files = sum(len(source.files) for source in spec.sources)
    progress.doing(f"simulating {spec.num_lanes} lanes of {len(names)} sources ({files:,} files)", steps - start)
    with contextlib.ExitStack() as stack:
        if min(procs, spec.num_lanes) > 1:
            if note := procs_note(min(procs, spec.num_lanes)):
                print(f"plan: {note}", file=sys.stderr, flush=True)
            digests = stack.enter_context(PlanProcesses(spec, rows_per_lane, states or {}, start, steps, procs)).steps()
        else:
            workers, prefetch = job.data.num_workers, job.data.prefetch_factor
            lanes = range(spec.num_lanes)
            group = stack.enter_context(
                open_lane_group(spec, lanes, rows_per_lane, workers, prefetch, states, False, start)
            )
            digests = step_digests(group, len(names), start, steps)
        for step, lane_digests, counts in digests:
            entry = step_entry(spec, step, batch_digest(lane_digests), job.global_batch_size, counts)
            progress.advance(1, sum(entry.tokens.values()))
            yield entry


def plan_eval_set(job_path: str | LoaderJob) -> dict:
    """The eval set's proof as every validation of a run of the job logs it (titan/validator.py):
    its SHA-256, steps, rows, seq_len and targets per source, computed offline over all lanes (the eval set is
    defined per seq_len: another length is other rows, another SHA-256)."""
    job = open_job(job_path) if isinstance(job_path, str) else job_path
    data = job.eval_data
    check_eval_data(data)
    spec = build_engine(data, job.seq_len, loader_tokenizer(data, job.trainer_tokenizer))
    batch = job.eval_global_batch_size
    try:
        per_lane = rows_per_lane(batch, data.num_lanes)
    except ConfigError as e:
        raise ConfigError(f"{job.path}: {eval_message(e)}") from None
    digests, counts = [], [0] * len(spec.sources)
    progress.doing("building the eval set")
    for step in eval_steps(spec, range(data.num_lanes), per_lane, job.eval_steps):
        digests.append(batch_digest(step.lane_digests()))
        counts = [a + b for a, b in zip(counts, label_counts(step.rows, len(spec.sources)))]
    return {
        "sha256": eval_set_digest(digests),
        "steps": len(digests),
        "rows": len(digests) * batch,
        "seq_len": spec.seq_len,
        "tokens": dict(zip(spec.source_names, counts)),
    }


def packing_note(spec: EngineSpec) -> str:
    """What `plan --mixture` says of best_fit's bound (docs/mixture.md; "" under wrap)."""
    config = spec.config
    if config.packing != "best_fit":
        return ""
    if config.best_fit_mixing == "per_step":
        return (
            "best_fit, best_fit_mixing = \"per_step\": each window's rows in the mixer's order, no window drawn "
            "across a phase start (a phase starts within about a row per lane); docs/mixture.md"
        )
    return (
        f'best_fit, best_fit_mixing = "per_window": rows longest first within windows of {config.best_fit_window_docs} '
        "documents, a phase starts with each lane's next window: steps may be far from the weights; docs/mixture.md"
    )


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


def mixture_report(entries: list[LedgerEntry], weights: list[float], by: Sequence[str] = ()) -> MixtureReport:
    """Each source's share of the entries' tokens; for the sources named in `by`, of their trained targets
    (mix_by = "targets": chat sources)."""
    names = list(entries[0].tokens) if entries else []
    shares, cumulative, totals = [], [], [0] * len(names)
    for entry in entries:
        counted = {**entry.tokens, **{n: (entry.targets or {}).get(n, entry.tokens[n]) for n in by}}
        counts = [counted[name] for name in names]
        totals = [a + b for a, b in zip(totals, counts)]
        shares.append([c / max(sum(counts), 1) for c in counts])
        cumulative.append([t / max(sum(totals), 1) for t in totals])
    return MixtureReport(names, list(weights), [e.step for e in entries], shares, cumulative)
