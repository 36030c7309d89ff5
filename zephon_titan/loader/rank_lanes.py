"""What the training loader and the eval loader share: a DP rank's lanes of a job, its microbatch tensors, and
the collectives that keep the ranks in step (torch only, no torchtitan).

Both loaders are one rank's view of the same layout (engine/lanes.py): DP rank r of W takes rows
[r G/W, (r+1) G/W) of each step's global batch (lane 0's R = G/L rows, then lane 1's, ...), cut into
microbatches of local_batch_size rows. It produces every lane those rows fall on, whole, and reports the
lanes it owns (their first row of a step is its own), so each lane counts once whatever W. Which lanes have
rows left, and the lane digests and tokens of a step, are global questions: one small collective over the
data-parallel ranks answers each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from zephon_titan.config import DataConfig
from zephon_titan.engine import EngineSpec, RankRows, Row, build_engine, rank_rows, validate_batch_layout
from zephon_titan.engine.eval_set import slot_sources
from zephon_titan.engine.tokenize import DocumentTokenizer

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RankLanes:
    """The engine spec of a [dataloader] table and one DP rank's part of every step (engine/lanes.py)."""

    spec: EngineSpec
    rows_per_lane: int
    rows: RankRows
    local_batch_size: int
    """Rows per microbatch (the trainer's): this rank's rows of a step are a whole number of them."""

    @property
    def lane_ids(self) -> list[int]:
        """The lanes this rank produces (whole), in lane order."""
        return list(self.rows.lanes)

    @property
    def owned(self) -> list[int]:
        """The lanes this rank reports (state, digest, tokens): every lane is owned by exactly one rank."""
        return list(self.rows.owned)

    def mine(self, step_rows: Sequence[T]) -> Sequence[T]:
        """This rank's rows of a step, from the rows of all its lanes in lane order."""
        return step_rows[self.rows.skip : self.rows.skip + self.rows.take]

    def of_owned(self, per_lane: Sequence[T]) -> list[T]:
        """The items of the owned lanes, from one item per produced lane (in lane order)."""
        start = self.rows.lanes.start
        return [per_lane[lane - start] for lane in self.rows.owned]

    def microbatches(self, rows: Sequence[Row]) -> Iterator[Microbatch]:
        """This rank's rows of a step (`mine`), in order, cut into microbatches of local_batch_size rows: the one
        cut of the training loader and the eval loader."""
        size = self.local_batch_size
        for start in range(0, len(rows), size):
            yield Microbatch(rows[start : start + size], last=start + size >= len(rows))

    @classmethod
    def build(
        cls,
        data: DataConfig,
        *,
        global_batch_size: int,
        dp_world_size: int,
        dp_rank: int,
        local_batch_size: int,
        seq_len: int,
        tokenizer: Callable[[], DocumentTokenizer],
    ) -> RankLanes:
        """The batch layout is checked first (a ConfigError naming the valid sizes), then the tokenizer is made
        (`tokenizer()`, the adapter's: the trainer's own, or the job's tokenizer_path) and the sources are
        opened (sizes and footers; no document is read)."""
        rows_per_lane = validate_batch_layout(data.num_lanes, global_batch_size, dp_world_size, local_batch_size)
        spec = build_engine(data, seq_len, tokenizer())
        rows = rank_rows(data.num_lanes, global_batch_size, dp_world_size, dp_rank)
        return cls(spec, rows_per_lane, rows, local_batch_size)


@dataclass(frozen=True, slots=True)
class Microbatch:
    """local_batch_size rows of one rank's step, in order; each tensor int64 [rows, seq_len], made when asked (an
    adapter puts them in its trainer's shapes)."""

    rows: Sequence[Row]
    last: bool
    """The step's last microbatch on this rank: handing it over is handing over the step."""

    def inputs(self) -> torch.Tensor:
        return long_tensor([row.inputs for row in self.rows])

    def positions(self) -> torch.Tensor:
        return long_tensor([row.positions for row in self.rows])

    def labels(self) -> torch.Tensor:
        return long_tensor([row.labels for row in self.rows])

    def sources(self) -> torch.Tensor:
        """The source index of each input position (-1: padding), for the loss of each source."""
        return long_tensor([slot_sources(row) for row in self.rows])


def long_tensor(arrays: Sequence[np.ndarray]) -> torch.Tensor:
    """int64 [len(arrays), n], stacked and widened in one copy; the tensor shares that copy's memory."""
    return torch.from_numpy(np.stack(arrays, dtype=np.int64))


def collective_device() -> torch.device | str:
    """Where a tensor for a collective over the default group must live (NCCL: this rank's GPU)."""
    return torch.device("cuda", torch.cuda.current_device()) if "nccl" in str(dist.get_backend()) else "cpu"


def dp_rank_zero() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def every_rank(flag: bool) -> bool:
    """Does `flag` hold on every rank? (MIN over the default group; this rank's answer without one.)"""
    return _reduce(flag, dist.ReduceOp.MIN)


def any_rank(flag: bool) -> bool:
    """Does `flag` hold on some rank? (MAX over the default group; this rank's answer without one.)"""
    return _reduce(flag, dist.ReduceOp.MAX)


def _reduce(flag: bool, op: Any) -> bool:
    if not dist.is_initialized():
        return flag
    value = torch.tensor([int(flag)], dtype=torch.int32, device=collective_device())
    dist.all_reduce(value, op=op)
    return bool(value.item())


def lane_table(
    owned: Sequence[int], values: torch.Tensor, num_lanes: int, group: dist.ProcessGroup | None
) -> torch.Tensor:
    """Every lane's row of a table ([num_lanes, ...]), from the rows of the lanes each DP rank of `group` owns
    (`values`: [len(owned), ...]). Each lane is owned by exactly one rank and the others add zeros, so a sum
    over the ranks is exact for any layout (None: a single rank, which owns every lane)."""
    table = torch.zeros((num_lanes, *values.shape[1:]), dtype=values.dtype, device=values.device)
    table[list(owned)] = values
    if group is not None:
        dist.all_reduce(table, group=group)
    return table


def digest_table(digests: Sequence[bytes]) -> torch.Tensor:
    """32-byte digests as an int64 tensor [len(digests), 4], for gather_lanes."""
    return torch.from_numpy(np.frombuffer(b"".join(digests), dtype=np.int64).copy()).reshape(len(digests), 4)
