"""Lane ownership and the canonical order of a step's rows.

Step t's global batch is lane 0's rows [tR, (t+1)R), then lane 1's, ..., lane L-1's
(R = G / L). DP rank r of W owns lanes [r L/W, (r+1) L/W) and yields its rows in
that same order, so concatenating ranks in rank order gives the same bytes for
every valid W.
"""

from __future__ import annotations

from typing import Any

from zephon_titan.engine.packing import Row
from zephon_titan.engine.spec import EngineSpec
from zephon_titan.engine.state import LaneState
from zephon_titan.engine.stream import LaneStream, lane_clock
from zephon_titan.errors import ConfigError


def valid_world_sizes(num_lanes: int) -> list[int]:
    return [w for w in range(1, num_lanes + 1) if num_lanes % w == 0]


def lanes_of_rank(num_lanes: int, dp_world_size: int, dp_rank: int) -> range:
    if dp_world_size < 1 or num_lanes % dp_world_size:
        raise ConfigError(
            f"{dp_world_size} data-parallel ranks cannot share {num_lanes} lanes evenly; "
            f"use a data-parallel size in {valid_world_sizes(num_lanes)} or change [dataloader] num_lanes "
            "(only at the start of a run)"
        )
    if not 0 <= dp_rank < dp_world_size:
        raise ConfigError(f"dp_rank must be in [0, {dp_world_size}), got {dp_rank}")
    per_rank = num_lanes // dp_world_size
    return range(dp_rank * per_rank, (dp_rank + 1) * per_rank)


# The most rows one optimizer step may take. A step's rows are produced and held in memory together (a
# rank's share in training, every lane's in `zephon-titan plan` and in the eval set's offline proof), each
# row a few arrays of seq_len + 1 ids plus its pieces: at 2**20 rows of 2,048 tokens that is already
# ~25 GB for one step of `plan`. The largest published runs take ~16K rows per step (Llama 3 405B: 2,048
# rows of 8,192 tokens; DeepSeek-V3: 15,360 of 4,096), so the bound is ~64 times that, while a mistyped
# value (2**40) is refused in one line instead of growing `plan` without output until memory runs out.
MAX_GLOBAL_BATCH_SIZE = 1 << 20


def rows_per_lane(global_batch_size: int, num_lanes: int) -> int:
    if global_batch_size > MAX_GLOBAL_BATCH_SIZE:
        raise ConfigError(
            f"[training] global_batch_size = {global_batch_size} rows per step is above the bound of "
            f"{MAX_GLOBAL_BATCH_SIZE} (2**20): a step's rows are produced and held in memory together (all of "
            "them in `zephon-titan plan`); the largest published runs take ~16K rows per step"
        )
    if global_batch_size < 1 or global_batch_size % num_lanes:
        raise ConfigError(
            f"global batch size {global_batch_size} is not a positive multiple of num_lanes {num_lanes}; "
            f"each lane gives the same number of rows per step (e.g. {num_lanes * max(1, global_batch_size // num_lanes)})"
        )
    return global_batch_size // num_lanes


def validate_batch_layout(num_lanes: int, global_batch_size: int, dp_world_size: int, local_batch_size: int) -> int:
    """Check the run's batch shape against the lanes; returns rows per lane per step."""
    if global_batch_size <= 0:
        raise ConfigError(
            "training.global_batch_size must be set explicitly (rows per optimizer step, a multiple of "
            f"[dataloader] num_lanes = {num_lanes}). TorchTitan's default (-1) means local_batch_size x "
            "data-parallel size, which changes with the number of GPUs and so would change the data of every step"
        )
    if num_lanes % dp_world_size:
        raise ConfigError(
            f"the data-parallel size is {dp_world_size}, which does not divide [dataloader] num_lanes = {num_lanes}; "
            f"valid data-parallel sizes: {valid_world_sizes(num_lanes)} "
            "(data_parallel_replicate_degree x data_parallel_shard_degree)"
        )
    rows = rows_per_lane(global_batch_size, num_lanes)
    rows_per_rank = global_batch_size // dp_world_size
    if local_batch_size < 1 or rows_per_rank % local_batch_size:
        fits = divisors(rows_per_rank)
        raise ConfigError(
            f"each of the {dp_world_size} data-parallel ranks takes global_batch_size / {dp_world_size} = "
            f"{rows_per_rank} rows per step, which is not a multiple of training.local_batch_size = "
            f"{local_batch_size}; use a local_batch_size in {fits}"
        )
    return rows


def divisors(n: int, limit: int = 16) -> list[int]:
    """The first `limit` divisors of n, in O(sqrt n) (n may be huge in a mistaken config)."""
    small: list[int] = []
    large: list[int] = []
    d = 1
    while d * d <= n and len(small) < limit:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return sorted(small + large)[:limit] if len(small) < limit else small


class LaneGroup:
    """The lanes one rank owns, stepped together in this process: R rows per lane per step, in
    canonical order. `open_lane_group` picks this or the worker-process version."""

    def __init__(
        self,
        spec: EngineSpec,
        lane_ids: range | list[int],
        rows_per_step: int,
        states: dict[int, LaneState] | None = None,
        first_step: int = 0,
    ):
        """`first_step`: steps completed before `states` (the step of each row matters under a schedule)."""
        states = states or {}
        self.rows_per_step = rows_per_step
        self.streams = [
            LaneStream(spec, lane, states.get(lane), lane_clock(rows_per_step, states.get(lane), first_step))
            for lane in lane_ids
        ]

    def next_step(self) -> list[list[Row]]:
        """One step's rows: a list per lane, in lane order."""
        return [stream.take(self.rows_per_step) for stream in self.streams]

    def next_step_with_states(self) -> list[list[tuple[Row, LaneState]]]:
        """Like next_step, each row paired with its lane's state right after it."""
        return [stream.take_with_states(self.rows_per_step) for stream in self.streams]

    def state(self) -> dict[int, LaneState]:
        return {stream.lane_id: stream.state() for stream in self.streams}

    def close(self) -> None:
        pass

    def __enter__(self) -> LaneGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_lane_group(
    spec: EngineSpec,
    lane_ids: range | list[int],
    rows_per_step: int,
    num_workers: int = 0,
    prefetch_factor: int = 2,
    states: dict[int, LaneState] | None = None,
    deferred: bool = False,
    first_step: int = 0,
) -> Any:
    """LaneGroup in this process (num_workers = 0), else lanes produced by `num_workers` processes,
    each at most `prefetch_factor` steps ahead. Rows never depend on either knob. `deferred`
    (workers only): the processes start now and the lanes at `group.start(states, first_step)`.
    `first_step`: steps completed before `states` (under a mixture schedule a row's step matters)."""
    # Returns LaneGroup | ProcessLaneGroup (workers.py). Typed Any for now: the loader
    # (titan/dataloader.py) stores it where only a LaneGroup is accepted; tighten with it.
    if num_workers == 0:
        from zephon_titan.engine.tokenizer_backends import default_threads, limit_threads

        limit_threads(default_threads(0))
        spec.tokenizer.start_backend()  # loads while the first blocks are read; the first encode waits for it
        return LaneGroup(spec, lane_ids, rows_per_step, states, first_step)
    from zephon_titan.engine.workers import ProcessLaneGroup

    return ProcessLaneGroup(
        spec, list(lane_ids), rows_per_step, num_workers, prefetch_factor, states, deferred, first_step
    )
