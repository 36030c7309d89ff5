"""A step's rows split over the replica groups that take part in it (torchft), by step, not by membership.

Under torchft a step's participants change while the job runs: a replica group dies, the survivors go on, it
heals and rejoins. The global batch of step s stays what it is for every W (engine/lanes.py): lane 0's R rows,
then lane 1's, ... Only who trains which rows changes. The rule is the rows-belong-to-ranks rule over the live
ranks of the step, cut at microbatch boundaries:

- The step's M = G / local_batch_size microbatches, in global order, are dealt to its N live ranks in order:
  participating groups by their order in the step (torchft's participating rank: replica ids sorted), each
  group's DP ranks in rank order. Live rank k takes microbatches [floor(kM/N), floor((k+1)M/N)), contiguous,
  so concatenating the live ranks' rows in that order is the step's global batch whatever the membership.
  With N dividing M this is rank_rows with W = N exactly: the rule of a run without failures is unchanged.
- When N does not divide M, shares differ by one microbatch. Every live rank still runs the same number of
  microbatch slots, ceil(M/N); a short rank fills its last slot with a padding microbatch (labels ignored).
  Refusing would stop training whenever the survivors do not divide the batch (3 groups of 16 microbatches,
  one dies: 16/2 runs, 16/3 would not have started), and unequal slot counts would hang every collective
  that runs per microbatch (FSDP's reduce-scatter, torchft's replicate all-reduce under HSDP). The gradient
  stays exact when the loss is normalised by the step's trained tokens across all participants (TorchTitan
  0.3's global_valid_tokens), not averaged per rank: padding adds no token. Waste: at most one microbatch per
  rank and step, and none when N divides M.
- A group that is in the quorum but not participating (healing under torchft's async quorum) trains padding
  only, the same ceil(M/N) slots, so its collectives line up with the participants'.
- A failed step (not committed) is trained again with the same rows: the split of a retry is the split of
  the step under the retry's membership, and every membership covers the same rows.

No torch, no torchft: the adapter asks torchft's Manager for the participants and this rank's place; lanes
and rows stay the engine's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from zephon_titan.engine.lanes import RankRows, row_range, rows_per_lane
from zephon_titan.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Membership:
    """The replica groups taking part in one step, in their order for the step, each with its DP size."""

    groups: tuple[tuple[int, int], ...]
    """(group id, data-parallel ranks in it), in participation order (torchft: participating rank order)."""

    def __post_init__(self) -> None:
        ids = [group for group, _ in self.groups]
        if not ids:
            raise ConfigError("a step's membership has no replica group; a step needs at least one participant")
        if len(set(ids)) != len(ids):
            raise ConfigError(f"a step's membership names a replica group twice: {ids}; each group takes part once")
        for group, size in self.groups:
            if size < 1:
                raise ConfigError(f"replica group {group} has {size} data-parallel ranks; a group has at least 1")

    @classmethod
    def of(cls, groups: Iterable[tuple[int, int]]) -> Membership:
        """From (group id, DP size) pairs, ordered by group id (torchft orders participants by replica id)."""
        return cls(tuple(sorted(groups)))

    @classmethod
    def uniform(cls, participants: int, dp_size: int) -> Membership:
        """What torchft's Manager gives: num_participants() groups of the same DP size, ids 0 .. n - 1 (a
        group's participating_rank() is its id for the step)."""
        return cls(tuple((group, dp_size) for group in range(participants)))

    @property
    def live_ranks(self) -> int:
        return sum(size for _, size in self.groups)

    def index(self, group: int, dp_rank: int) -> int:
        """The live rank's place among the step's N live ranks."""
        before = 0
        for member, size in self.groups:
            if member == group:
                if not 0 <= dp_rank < size:
                    raise ConfigError(f"dp_rank must be in [0, {size}) in replica group {group}, got {dp_rank}")
                return before + dp_rank
            before += size
        raise ConfigError(f"replica group {group} does not take part in this step; its groups: {self.ids}")

    @property
    def ids(self) -> list[int]:
        return [group for group, _ in self.groups]


@dataclass(frozen=True, slots=True)
class RankShare:
    """What one live rank trains in a step."""

    microbatches: range
    """Its microbatches of the step, indices in global order (empty: padding only)."""
    slots: int
    """Microbatches it runs, the same on every live rank: the last slots - len(microbatches) are padding."""
    rows: RankRows
    """Its rows as lanes to produce, rows to skip and take, lanes it owns (lanes.RankRows, with take = its rows)."""

    @property
    def padding(self) -> int:
        return self.slots - len(self.microbatches)


def microbatch_count(num_lanes: int, global_batch_size: int, local_batch_size: int) -> int:
    """M: the step's microbatches. Refuses a layout whose global batch is not whole microbatches of whole lanes."""
    rows_per_lane(global_batch_size, num_lanes)
    if local_batch_size < 1 or global_batch_size % local_batch_size:
        raise ConfigError(
            f"global batch size {global_batch_size} is not a multiple of local batch size {local_batch_size}; under "
            f"fault tolerance a step is dealt in whole microbatches: use a local batch size dividing {global_batch_size}"
        )
    return global_batch_size // local_batch_size


def share(
    num_lanes: int, global_batch_size: int, local_batch_size: int, membership: Membership, group: int, dp_rank: int
) -> RankShare:
    """Live rank (group, dp_rank)'s share of a step under `membership`."""
    m = microbatch_count(num_lanes, global_batch_size, local_batch_size)
    n = membership.live_ranks
    k = membership.index(group, dp_rank)
    first, last = k * m // n, (k + 1) * m // n
    return RankShare(
        range(first, last),
        -(-m // n),
        row_range(
            rows_per_lane(global_batch_size, num_lanes), first * local_batch_size, (last - first) * local_batch_size
        ),
    )


def idle_share(num_lanes: int, global_batch_size: int, local_batch_size: int, participants: int) -> RankShare:
    """A rank of a group in the quorum but not participating (healing): padding only, as many slots as a
    participant's, so per-microbatch collectives line up. `participants`: the step's live ranks."""
    m = microbatch_count(num_lanes, global_batch_size, local_batch_size)
    return RankShare(range(0), -(-m // participants), row_range(rows_per_lane(global_batch_size, num_lanes), 0, 0))


def split_step(
    num_lanes: int, global_batch_size: int, local_batch_size: int, membership: Membership
) -> dict[tuple[int, int], RankShare]:
    """Every live rank's share, keyed (group, dp_rank), in live-rank order."""
    return {
        (group, rank): share(num_lanes, global_batch_size, local_batch_size, membership, group, rank)
        for group, size in membership.groups
        for rank in range(size)
    }


def step_rows(num_lanes: int, global_batch_size: int) -> list[tuple[int, int]]:
    """A step's rows in global-batch order, each as (lane, row of the lane's step)."""
    per_lane = rows_per_lane(global_batch_size, num_lanes)
    return [(lane, row) for lane in range(num_lanes) for row in range(per_lane)]


def rows_of(rows: RankRows, num_lanes: int, global_batch_size: int) -> list[tuple[int, int]]:
    """The (lane, row of the lane's step) pairs a RankRows takes, in order."""
    per_lane = rows_per_lane(global_batch_size, num_lanes)
    start = rows.lanes.start * per_lane + rows.skip
    return [divmod(i, per_lane) for i in range(start, start + rows.take)]


def static_share(
    num_lanes: int, global_batch_size: int, configured_groups: int, dp_size: int, group: int, dp_rank: int
) -> RankRows:
    """The negative control: a fixed share per configured group whatever the step's membership, as TorchTitan
    0.3's FT trainer splits (get_dp_info: W = dp_size * configured groups, rank = dp_size * group + dp_rank).
    A missing group's rows are trained by nobody."""
    world = dp_size * configured_groups
    take = global_batch_size // world
    return row_range(rows_per_lane(global_batch_size, num_lanes), (dp_size * group + dp_rank) * take, take)
