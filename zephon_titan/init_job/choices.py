"""What `zephon-titan init` chooses: the batch layout for the GPU counts named (global and local batch, lanes),
the weights, the vocabulary size and the run's folder."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from zephon_titan.engine.lanes import MAX_GLOBAL_BATCH_SIZE, divisors
from zephon_titan.errors import ConfigError
from zephon_titan.init_job.listing import SourcePlan

VOCAB_MULTIPLE = 64  # the model's vocabulary is rounded up to this (as `validate` suggests)
MAX_LANES = 64  # num_lanes proposed at most, unless the GPU counts need more
MAX_LOCAL_TOKENS = 16384  # the proposed local batch holds at most this many tokens (8 rows of 2048)
MAX_LOCAL_ROWS = 8
KEEP_CHECKPOINTS = 3  # [checkpoint] keep_latest_k: older ones deleted (TorchTitan refuses 1: a save may be unfinished)
CHECKPOINTS_PER_RUN = 10  # about this many saves a run, ...
MIN_INTERVAL, MAX_INTERVAL = 10, 500  # ... at least 10 and at most 500 steps apart (the last step is always saved)
BYTES_PER_PARAMETER = 12  # a checkpoint's share per parameter: fp32 weights and AdamW's two moments


@dataclass(frozen=True)
class Layout:
    gpus: tuple[int, ...]
    global_batch_size: int
    local_batch_size: int
    num_lanes: int

    def why(self) -> list[str]:
        lcm = math.lcm(*self.gpus)
        per_gpu = ", ".join(f"{self.global_batch_size // w} on {w}" for w in self.gpus)
        return [
            f"global_batch_size {self.global_batch_size}, local_batch_size {self.local_batch_size}: a multiple of "
            f"{self.local_batch_size} x {lcm} (the least common multiple of the GPU counts), so every count divides "
            f"it and each GPU's rows are whole microbatches (rows per GPU: {per_gpu})",
            f"num_lanes {self.num_lanes}: a multiple of {lcm} dividing the global batch (each GPU makes whole lanes), "
            f"at most {max(MAX_LANES, lcm)}",
        ]


def propose_layout(gpus: list[int], seq_len: int, local: int | None, global_: int | None) -> Layout:
    if not gpus or min(gpus) < 1:
        raise ConfigError(f"--gpus {','.join(map(str, gpus))}: name positive GPU counts, e.g. --gpus 8,16,32")
    lcm = math.lcm(*gpus)
    local = local or max(1, min(MAX_LOCAL_ROWS, MAX_LOCAL_TOKENS // seq_len))
    unit = lcm * local  # every GPU count divides a multiple of it, and local divides the rows per GPU
    size = global_ or unit
    if size % unit:
        raise ConfigError(
            f"--global-batch-size {size}: must be a multiple of {unit} (local_batch_size {local} x {lcm}, the least "
            f"common multiple of --gpus {','.join(map(str, gpus))}), e.g. {unit * max(1, round(size / unit))}"
        )
    if size > MAX_GLOBAL_BATCH_SIZE:
        raise ConfigError(
            f"--gpus {','.join(map(str, gpus))} with local batch {local} need {size:,} rows per step, above the "
            f"bound of {MAX_GLOBAL_BATCH_SIZE:,}; name fewer or rounder GPU counts (e.g. powers of 2)"
        )
    lanes = max(lcm * k for k in divisors(size // lcm, limit=1 << 12) if lcm * k <= max(MAX_LANES, lcm))
    return Layout(tuple(sorted(set(gpus))), size, local, lanes)


# ---- the job file --------------------------------------------------------------------------------------


def round_vocab(ids: int) -> int:
    return -(-ids // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def weights_of(plans: list[SourcePlan], given: dict[str, float]) -> dict[str, float]:
    """The given weights (every source named), else each source's share of the estimated tokens."""
    names = [p.name for p in plans]
    if given:
        if sorted(given) != sorted(names):
            raise ConfigError(
                f"--weights names {', '.join(sorted(given))}, the sources are {', '.join(names)}; give one "
                "weight per source (NAME=W,...) or leave --weights out (weights from the sizes)"
            )
        return {n: given[n] for n in names}
    total = sum(p.tokens for p in plans) or 1.0
    return {p.name: max(round(p.tokens / total, 4), 0.0001) for p in plans}


def distinct_dump_folder(job_path: str) -> str:
    """outputs/<job name>, or outputs/<job name>-N when that folder exists (another run's checkpoints)."""
    stem = os.path.splitext(os.path.basename(job_path))[0] or "job"
    folder, n = os.path.join("outputs", stem), 2
    while os.path.exists(folder):
        folder, n = os.path.join("outputs", f"{stem}-{n}"), n + 1
    return folder


def checkpoint_interval(steps: int) -> int:
    """Steps between checkpoints: about CHECKPOINTS_PER_RUN a run, within [MIN_INTERVAL, MAX_INTERVAL] (a short
    trial saves only its last step: TorchTitan always saves that one)."""
    return max(1, min(steps, MAX_INTERVAL, max(MIN_INTERVAL, steps // CHECKPOINTS_PER_RUN)))


def model_parameters(module: str, config: str, flavor: str, vocab: int) -> int | None:
    """The parameters of the recipe's model (with this vocabulary), built on the meta device (no memory is
    allocated); None where it cannot be built so (the job is checked as the trainer reads it anyway)."""
    import torch

    from zephon_titan.titan.job import base_config

    model: dict[str, object] = {"module": module, "config": config, "vocab_size": vocab}
    if flavor:
        model["flavor"] = flavor
    try:
        spec = base_config(model, "--recipe").model_spec
        with torch.device("meta"):
            built = spec.model.build()
        return int(sum(p.numel() for p in built.parameters()))
    except Exception:  # a recipe of the user's own: the size is a hint, the comment says how to compute it
        return None


@dataclass
class JobChoices:
    path: str
    tokenizer: str
    vocab_ids: int
    module: str
    config: str
    flavor: str
    seq_len: int
    layout: Layout
    steps: int
    one_pass: int  # steps to read every source once, by the estimates
    seed: int
    dump_folder: str
    weights: dict[str, float]
    weights_given: bool
    sources: list[SourcePlan]
    parameters: int | None = None  # the model's, for the size of a checkpoint
