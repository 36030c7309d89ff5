"""Which rows of a step each data-parallel rank takes, and the canonical order of a step's rows.

Step t's global batch is lane 0's rows [tR, (t+1)R), then lane 1's, ..., lane L-1's (R = G / L). Rows, not
lanes, belong to ranks: DP rank r of W takes rows [r G/W, (r+1) G/W) of it, so concatenating the ranks' rows
in rank order gives the same bytes for every W that divides G. A rank produces every lane its rows fall on;
a lane whose rows fall on several ranks is produced by each of them, and each keeps its own rows. The lane is
*owned* by the rank holding its first row of a step: that rank alone reports its state (checkpoint), its
digest (ledger) and its tokens (metrics), so every lane counts once whatever W. With W dividing L a rank takes
whole lanes [r L/W, (r+1) L/W) and owns them all.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from zephon_titan.engine.encode_calls import EncodeBatcher
from zephon_titan.engine.rows import Row
from zephon_titan.engine.spec import EngineSpec
from zephon_titan.engine.state import LaneState
from zephon_titan.engine.stream import LaneStream, lane_clock
from zephon_titan.errors import ConfigError, LaneExhausted


def valid_world_sizes(global_batch_size: int, limit: int = 64) -> list[int]:
    """Data-parallel sizes a global batch of `global_batch_size` rows can be split over: its divisors (the
    first `limit`, smallest first; local_batch_size must also divide the rows per rank)."""
    return divisors(global_batch_size, limit)


@dataclass(frozen=True, slots=True)
class RankRows:
    """One DP rank's part of every step: the lanes it produces, which of their rows it takes, which it owns."""

    lanes: range
    """The lanes its rows fall on, produced whole (R rows each per step), in lane order."""
    skip: int
    """Rows of its first lane's step that precede its own (another rank's)."""
    take: int
    """Rows it takes per step, G / W: rows [skip, skip + take) of its lanes' rows in lane order."""
    owned: range
    """The lanes whose first row of a step is its own: it alone reports their state, digest and tokens."""


def rank_rows(num_lanes: int, global_batch_size: int, dp_world_size: int, dp_rank: int) -> RankRows:
    """Rank `dp_rank` of `dp_world_size`'s rows of each step (validate_batch_layout checks the layout first)."""
    per_lane = rows_per_lane(global_batch_size, num_lanes)
    if dp_world_size < 1 or global_batch_size % dp_world_size:
        raise ConfigError(
            f"{dp_world_size} data-parallel ranks cannot share a global batch of {global_batch_size} rows evenly; "
            f"use a data-parallel size that divides it: {valid_world_sizes(global_batch_size)}"
        )
    if not 0 <= dp_rank < dp_world_size:
        raise ConfigError(f"dp_rank must be in [0, {dp_world_size}), got {dp_rank}")
    take = global_batch_size // dp_world_size
    return row_range(per_lane, dp_rank * take, take)


def row_range(per_lane: int, first: int, count: int) -> RankRows:
    """Rows [first, first + count) of a step's global batch (R = per_lane rows per lane) as RankRows: the lanes
    they fall on, the rows to skip in the first, how many to take, the lanes whose row 0 of the step they hold.
    A rank's rows under rank_rows, a live rank's under torchft (participants.py); no rows: no lanes."""
    if count == 0:
        return RankRows(range(0), 0, 0, range(0))
    last = first + count - 1
    lanes = range(first // per_lane, last // per_lane + 1)
    owned = range(-(-first // per_lane), last // per_lane + 1)  # lanes whose row 0 (at l * R) is in its rows
    return RankRows(lanes, first - lanes.start * per_lane, count, owned)


def lanes_of_rank(num_lanes: int, dp_world_size: int, dp_rank: int) -> range:
    """The lanes DP rank `dp_rank` takes whole when `dp_world_size` divides `num_lanes` (tests and tools that
    split lanes evenly; a loader uses rank_rows, which also serves any W dividing the global batch)."""
    if dp_world_size < 1 or num_lanes % dp_world_size:
        raise ConfigError(f"{dp_world_size} ranks cannot take {num_lanes} whole lanes each evenly")
    return rank_rows(num_lanes, num_lanes, dp_world_size, dp_rank).lanes


# The most rows one optimizer step may take. A step's rows are produced and held in memory together (a
# rank's share in training, every lane's in `zephon-titan plan` and in the eval set's offline proof), each
# row a few arrays of seq_len + 1 ids plus its pieces: at 2**20 rows of 2,048 tokens that is already
# ~25 GB for one step of `plan`. The largest published runs take ~16K rows per step (Llama 3 405B: 2,048
# rows of 8,192 tokens; DeepSeek-V3: 15,360 of 4,096), so the bound is ~64 times that, while a mistyped
# value (2**40) is refused in one line instead of growing `plan` without output until memory runs out.
MAX_GLOBAL_BATCH_SIZE = 1 << 20


class LayoutError(ConfigError):
    """A batch layout the lanes cannot serve, phrased in the engine's words (global batch, local batch, ranks).
    An adapter names its own settings once: `in_terms` renders the same message with its words for TERMS
    (titan/dataloader.py `titan_layout_message`: TorchTitan's keys)."""

    TERMS = {
        "global_batch": "the global batch size",  # the setting, where it is the subject
        "global_batch_key": "global batch size",  # the setting, named with its value (`<key> = 16`)
        "global_batch_short": "global batch size",  # the setting in a formula (`<short> / 4`)
        "local_batch": "the local batch size",
        "local_batch_short": "local batch size",
        "dp_size": "the number of data-parallel ranks",
        "unset_why": "",  # why an unset global batch is refused, after the sentence
    }

    def __init__(self, template: str, **values: Any):
        self.template, self.values = template, values
        super().__init__(self.in_terms({}))

    def in_terms(self, terms: dict[str, str]) -> str:
        return self.template.format(**{**self.TERMS, **terms}, **self.values)

    def __reduce__(self) -> tuple[Any, ...]:
        return _layout_error, (self.template, self.values)


def _layout_error(template: str, values: dict[str, Any]) -> LayoutError:
    return LayoutError(template, **values)


def rows_per_lane(global_batch_size: int, num_lanes: int) -> int:
    if global_batch_size > MAX_GLOBAL_BATCH_SIZE:
        raise LayoutError(
            "{global_batch_key} = {batch} rows per step is above the bound of {bound} (2**20): a step's rows are "
            "produced and held in memory together (all of them in `zephon-titan plan`); the largest published runs "
            "take ~16K rows per step",
            batch=global_batch_size,
            bound=MAX_GLOBAL_BATCH_SIZE,
        )
    if global_batch_size < 1 or global_batch_size % num_lanes:
        raise ConfigError(
            f"global batch size {global_batch_size} is not a positive multiple of num_lanes {num_lanes}; "
            f"each lane gives the same number of rows per step (e.g. {num_lanes * max(1, global_batch_size // num_lanes)})"
        )
    return global_batch_size // num_lanes


def validate_batch_layout(num_lanes: int, global_batch_size: int, dp_world_size: int, local_batch_size: int) -> int:
    """Check the run's batch shape against the lanes; returns rows per lane per step. Refusals are LayoutErrors
    (in the engine's words) or, for a global batch that is not a multiple of the lanes, ConfigErrors."""
    if global_batch_size <= 0:
        raise LayoutError(
            "{global_batch} must be set explicitly (rows per optimizer step, a multiple of [dataloader] num_lanes = "
            "{lanes}){unset_why}",
            lanes=num_lanes,
        )
    rows = rows_per_lane(global_batch_size, num_lanes)
    if dp_world_size < 1 or global_batch_size % dp_world_size:
        sizes = valid_world_sizes(global_batch_size)
        usable = [w for w in sizes if local_batch_size >= 1 and (global_batch_size // w) % local_batch_size == 0]
        others = "; {sizes} with a smaller {local_batch_short}" if usable != sizes else ""
        raise LayoutError(
            "the data-parallel size is {ranks}, which does not divide {global_batch} = {batch} rows per step; "
            "valid data-parallel sizes: {usable} with {local_batch_short} = {local} ({dp_size}" + others + ")",
            ranks=dp_world_size,
            batch=global_batch_size,
            usable=usable,
            local=local_batch_size,
            sizes=sizes,
        )
    rows_per_rank = global_batch_size // dp_world_size
    if local_batch_size < 1 or rows_per_rank % local_batch_size:
        raise LayoutError(
            "each of the {ranks} data-parallel ranks takes {global_batch_short} / {ranks} = {rows} rows per step, "
            "which is not a multiple of {local_batch} = {local}; use a {local_batch_short} in {fits}",
            ranks=dp_world_size,
            rows=rows_per_rank,
            local=local_batch_size,
            fits=divisors(rows_per_rank),
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


# A lane visited for one row at a time runs slower than one visited for several in a row: at thousands of lanes a
# lane's objects and token batches are out of the CPU's caches by the time the round comes back to it (1,024
# lanes on one rank: ~10 % more tokens per CPU second with two rows per visit, another ~5 % with four; issue 28).
# So a group handing out fewer rows per lane and step than ROWS_PER_VISIT produces the lanes' rows of several
# steps in one visit, and holds the steps ahead. Long rows need fewer (a lane works on a row of 8,192 tokens long
# enough): at most TOKENS_PER_VISIT tokens per lane are made ahead, ~100 KB of row arrays per lane (at R = 1 and
# rows of 2,048 tokens, 3 more steps of rows in memory). Rows never depend on it: each lane is its own stream.
ROWS_PER_VISIT = 4
TOKENS_PER_VISIT = 8192


def steps_per_visit(rows_per_step: int, seq_len: int) -> int:
    """Steps whose rows a lane produces in one visit of its group."""
    rows = max(1, min(ROWS_PER_VISIT, TOKENS_PER_VISIT // max(seq_len, 1)))
    return -(-rows // rows_per_step)


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
        batcher = EncodeBatcher()  # the group's readers encode in shared calls
        self.streams = [
            LaneStream(spec, lane, states.get(lane), lane_clock(rows_per_step, states.get(lane), first_step), batcher)
            for lane in lane_ids
        ]
        self._steps_per_visit = 1  # the first step alone: it is waited for (start-up, a resume)
        self._later_visits = steps_per_visit(rows_per_step, spec.seq_len)
        self._ahead: deque[list[list[tuple[Row, LaneState]]] | None] = deque()
        """Steps produced ahead (None: the step no lane could fill, LaneExhausted when it is due)."""
        self._handed: dict[int, LaneState] = {}
        """Each lane's state after the last step handed out (what state() reports while steps are ahead)."""

    def next_step(self) -> list[list[Row]]:
        """One step's rows: a list per lane, in lane order."""
        if self._ahead:
            return [[row for row, _ in rows] for rows in self.next_step_with_states()]
        return [stream.take(self.rows_per_step) for stream in self.streams]

    def next_step_with_states(self) -> list[list[tuple[Row, LaneState]]]:
        """Like next_step, each row paired with its lane's state right after it."""
        if not self._ahead:
            self._visit_lanes()
        step = self._ahead.popleft()
        if step is None:
            self._ahead.append(None)  # exhausted for good
            raise LaneExhausted
        for stream, rows in zip(self.streams, step):
            self._handed[stream.lane_id] = rows[-1][1]
        return step

    def _visit_lanes(self) -> None:
        """The next steps, each lane's rows of all of them produced in one visit (steps_per_visit)."""
        steps: list[list[list[tuple[Row, LaneState]]]] = [[] for _ in range(self._steps_per_visit)]
        filled = len(steps)
        for stream in self.streams:
            for j in range(filled):
                try:
                    steps[j].append(stream.take_with_states(self.rows_per_step))
                except LaneExhausted:  # step j cannot be filled: the next lanes need only the steps before it
                    filled = j
                    break
        self._ahead.extend(steps[:filled])
        if filled < len(steps):
            self._ahead.append(None)
        self._steps_per_visit = self._later_visits

    def state(self) -> dict[int, LaneState]:
        if self._ahead and self._handed:  # steps were produced ahead: where the last step handed out left the lanes
            return dict(self._handed)
        return {stream.lane_id: stream.state() for stream in self.streams}

    def close(self) -> None:
        pass

    def __enter__(self) -> LaneGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def group_steps(group: Any, start: int, last: int) -> Iterator[tuple[int, list[list[Row]]]]:
    """(step, each lane's rows) for steps start + 1 .. last of a lane group (in process or workers); a finite
    run stops before the first step any of its lanes cannot fill."""
    for step in range(start + 1, last + 1):
        try:
            lanes = group.next_step()
        except LaneExhausted:
            return
        yield step, lanes


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
