"""The loader in your own loop: one data-parallel rank's steps, outside TorchTitan's trainer (docs/python.md).

    from zephon_titan.loop import Loader

    loader = Loader.from_job("configs/debug_cpu.toml", rank=0, world_size=1)
    for step in loader:                  # step.number, step.rows, step.microbatches(), step.arrays()
        ...
    state = loader.state_dict()          # torch.save it; several ranks: merge theirs (or save them with DCP)

The same global batches as the trainer's, step for step, on any number of ranks that divides the global batch;
a state saved on W ranks resumes on any other W. A step handed out is consumed: `state_dict()` after step s
resumes at step s + 1. It is loader/rank_steps.py (what every trainer adapter uses) without a trainer.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from zephon_titan.config import DataConfig, config_from_dict
from zephon_titan.engine import DocumentTokenizer, EngineSpec, Row
from zephon_titan.job_view import LoaderJob
from zephon_titan.loader.rank_lanes import Microbatch
from zephon_titan.loader.rank_steps import RankSteps

__all__ = ["Loader", "Step"]


@dataclass(frozen=True)
class Step:
    """One optimizer step as this rank takes it."""

    number: int
    """The optimizer step, from 1."""
    rows: Sequence[Row]
    """This rank's rows of the step's global batch, in order: numpy `inputs`, `labels` (-100: no target) and
    `positions` of seq_len each, and `pieces` (each document piece's source, file, row and offset)."""
    _loader: Loader

    def microbatches(self) -> Iterator[Microbatch]:
        """The rows in microbatches of the loader's local_batch_size: `inputs()`, `labels()`, `positions()` and
        `sources()` (the source of each position) as int64 torch tensors [rows, seq_len]."""
        return self._loader._steps.lanes.microbatches(self.rows)

    def arrays(self) -> dict[str, np.ndarray]:
        """The rows as int32 numpy arrays [rows, seq_len]: inputs, labels, positions."""
        return {name: np.stack([getattr(row, name) for row in self.rows]) for name in ("inputs", "labels", "positions")}


class Loader:
    """One data-parallel rank (`rank` of `world_size`) of a loader: iterate its steps, save and restore its state."""

    def __init__(
        self,
        data: DataConfig | Mapping[str, Any],
        *,
        seq_len: int,
        global_batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        local_batch_size: int | None = None,
        tokenizer: DocumentTokenizer | None = None,
    ):
        """`data`: a DataConfig or a `[dataloader]` table (as in a job file, parsed); `tokenizer`: else the table's
        tokenizer_path, loaded as TorchTitan's trainer loads it. `local_batch_size`: rows per microbatch (default:
        the rank's rows of a step, global_batch_size / world_size)."""
        config = data if isinstance(data, DataConfig) else config_from_dict(dict(data))
        if tokenizer is None and not config.tokenizer_path:
            raise ValueError("give a tokenizer, or set tokenizer_path in the [dataloader] table")
        self._steps = RankSteps(
            config,
            global_batch_size=global_batch_size,
            dp_world_size=world_size,
            dp_rank=rank,
            local_batch_size=local_batch_size or global_batch_size // max(world_size, 1),
            seq_len=seq_len,
            tokenizer=lambda: tokenizer if tokenizer is not None else _load_tokenizer(config),
            ledger=False,
        )

    @classmethod
    def from_job(cls, path: str, *, rank: int = 0, world_size: int = 1, overrides: Sequence[str] = ()) -> Loader:
        """The loader of a job file (its [dataloader], [training] seq_len and batch sizes, its tokenizer), as the
        trainer resolves it; `overrides` as on the command line (`--training.seq_len 256`). The microbatches have
        the job's local_batch_size where it divides this rank's rows, else all of them."""
        from zephon_titan.plan import open_job

        job: LoaderJob
        if overrides:
            from zephon_titan.titan.job import load_job

            job = load_job(path, overrides)
        else:
            job = open_job(path)  # TorchTitan only for what the file leaves to its recipe
        rows = job.global_batch_size // max(world_size, 1)
        local = job.local_batch_size if rows and rows % job.local_batch_size == 0 else rows
        return cls(
            job.data,
            seq_len=job.seq_len,
            global_batch_size=job.global_batch_size,
            rank=rank,
            world_size=world_size,
            local_batch_size=local,
            tokenizer=job.tokenizer,
        )

    @property
    def spec(self) -> EngineSpec:
        """The engine's view of the data (sources, tokenizer, schedule)."""
        return self._steps.spec

    @property
    def steps_done(self) -> int:
        """Steps handed out (consumed) so far, a restored checkpoint's included."""
        return self._steps.steps_done

    def __iter__(self) -> Iterator[Step]:
        for step in self._steps.steps():
            self._steps.consume(step)
            yield Step(self._steps.steps_done, step.rows, self)

    def state_dict(self) -> dict[str, Any]:
        """This rank's part of the loader state after the last step handed out (uint8 tensors: a header and one
        entry per lane this rank owns; torch.save or DCP saves them). With several ranks, every rank's part
        together is the whole state: merge the dicts (the header is the same on each)."""
        return self._steps.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a saved state (every rank's parts merged, saved on any number of ranks), after the checks
        of a resume: a changed seed, other data or another split is refused in one line."""
        self._steps.load_state_dict(dict(state))

    def close(self) -> None:
        """Stop worker processes and the prefetch thread (also at exit)."""
        self._steps.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _load_tokenizer(config: DataConfig) -> DocumentTokenizer:
    from zephon_titan.titan.tokenizer import load_tokenizer

    return load_tokenizer(config.tokenizer_path, config.add_bos, config.add_eos, backend=config.tokenizer_backend)
