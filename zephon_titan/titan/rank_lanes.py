"""What the training loader and the eval loader share: a DP rank's lanes of a job, its microbatch tensors, and
the collectives that keep the ranks in step (torch only, no torchtitan).

Both loaders are one rank's view of the same lane layout (engine/lanes.py): the rank owns the contiguous lanes
[r L/W, (r+1) L/W), each step takes R = G/L rows of each of them in lane order, cut into microbatches of
local_batch_size rows. Which lanes have rows left, and the lane digests of a step, are global questions: one
small collective over the data-parallel ranks answers each.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from zephon_titan.config import DataConfig
from zephon_titan.engine import EngineSpec, build_engine, lanes_of_rank, validate_batch_layout
from zephon_titan.titan.tokenizer import loader_tokenizer


@dataclass(frozen=True, slots=True)
class RankLanes:
    """The engine spec of a [dataloader] table and the lanes one DP rank produces, with their rows per step."""

    spec: EngineSpec
    lane_ids: list[int]
    rows_per_lane: int

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
        trainer_tokenizer: Callable[[], Any],
    ) -> RankLanes:
        """The batch layout is checked first (a ConfigError naming the valid sizes), then the sources are
        opened (sizes and footers; no document is read)."""
        rows_per_lane = validate_batch_layout(data.num_lanes, global_batch_size, dp_world_size, local_batch_size)
        spec = build_engine(data, seq_len, loader_tokenizer(data, trainer_tokenizer))
        return cls(spec, list(lanes_of_rank(data.num_lanes, dp_world_size, dp_rank)), rows_per_lane)


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


def gather_lanes(table: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """`table` ([this rank's lanes, ...]) of every DP rank of `group`, concatenated in DP-rank order, which is
    lane order: [all lanes, ...]. None: a single rank, the table itself."""
    if group is None:
        return table
    gathered = torch.empty(
        (table.shape[0] * dist.get_world_size(group), *table.shape[1:]), dtype=table.dtype, device=table.device
    )
    dist.all_gather_single(gathered, table, group=group)
    return gathered


def digest_table(digests: Sequence[bytes]) -> torch.Tensor:
    """32-byte digests as an int64 tensor [len(digests), 4], for gather_lanes."""
    return torch.from_numpy(np.frombuffer(b"".join(digests), dtype=np.int64).copy()).reshape(len(digests), 4)
