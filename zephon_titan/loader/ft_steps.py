"""A replica group's steps under torchft: every attempt of step s trains the rows of step s, whoever takes part.

torchft (0.2.0) keeps training while replica groups die and rejoin; a step that does not commit is attempted again
with the next quorum. This step source gives each attempt of step s this rank's microbatches of s under the
attempt's membership (engine/participants.py), produced from the lane-state table at the start of s, so a
dead group's lanes are produced by the survivors and a retry trains the same rows as the failed attempt.

The table: every rank keeps every lane's state. After an attempt each participant fills the rows of the lanes it
owns (end-of-step state, the lane's digest and token tally) and one row saying who it is; the table is summed
through `manager.allreduce` (each lane is owned by one live rank, zeros elsewhere, so the sum is exact). Only a
committed step's table is complete (a failed attempt's holds whatever arrived): the loader advances to it on
`should_commit()` and keeps the start-of-step table otherwise. A group that rejoins receives the table in
torchft's healing state dict (`register_state_dict_fn("dataloader", ...)`). State moves only through the
Manager: no collective of the loader's own crosses groups.

A group's ledger (`entries`) holds the steps it committed; a group left out of a step (dead, late to the quorum,
its commit failed where others' did not) heals past it (`healed`), so the run's ledger is the union of the groups'
(`union_ledger`).

Data parallelism inside a replica group: every rank of a group runs its own Manager (torchft pairs rank r of every
group in its cross-group PG) and its own FtSteps with its dp_rank; the step's microbatches are dealt over the live
ranks (groups in participating order, DP ranks inside), the table is summed over the group's ranks first (the
group's own collective, passed in as `dp_allreduce`) and then across groups by each rank's `manager.allreduce`, so
every rank of every group holds the whole table. torchft's should_commit agrees inside a group, so a group's
ranks commit or retry together. torchft is never imported here: the Manager is passed in (ManagerLike is what is
used of it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from zephon_titan.engine import LaneState, Row, batch_digest, lane_digest, open_lane_group, rows_per_lane
from zephon_titan.engine.ledger import LedgerEntry, step_entry, union_ledger  # noqa: F401 (its home was here)
from zephon_titan.engine.participants import Membership, RankShare, idle_share, microbatch_count, share
from zephon_titan.engine.resume import canonical, lane_capacity
from zephon_titan.engine.rows import step_tally
from zephon_titan.engine.spec import EngineSpec
from zephon_titan.errors import ConfigError, DataError, ResumeError

STATE_KEY = "dataloader"
"""The key of the loader's entry in torchft's healing state dict (TorchTitan's name for the loader's state)."""


class ManagerLike(Protocol):
    """What the step source uses of torchft.Manager."""

    def start_quorum(self) -> None: ...
    def num_participants(self) -> int: ...
    def participating_rank(self) -> int | None: ...
    def current_step(self) -> int: ...
    def allreduce(self, tensor: torch.Tensor, should_quantize: bool = ..., reduce_op: Any = ...) -> Any: ...
    def should_commit(self) -> bool: ...
    def register_state_dict_fn(self, key: str, load: Callable[[Any], None], save: Callable[[], Any]) -> None: ...


@dataclass(frozen=True, slots=True)
class LaneReport:
    """What the live rank owning a lane contributes to the table: its state after the step, digest and tally."""

    state: LaneState
    digest: bytes
    tally: list[int]


@dataclass(frozen=True, slots=True)
class Summed:
    """A committed step's table, decoded."""

    lanes: list[LaneReport]
    members: list[tuple[int, int, int]]
    """(group, attempt, DP ranks) of each participant, in participating-rank order."""


class LaneTable:
    """The int64 table of one step: L lane rows, then one row per participant. A lane row is [present, digest as
    4 words, tally, state length, state bytes in words]; a participant row [present, group, attempt, DP ranks, 0 ...]
    (given by the group's DP rank 0).
    int64 because the sum is of raw words: exact with one contributor per row (a float would round)."""

    def __init__(self, num_lanes: int, num_sources: int):
        self.num_lanes = num_lanes
        self.num_sources = num_sources
        self.tally_width = len(step_tally([], num_sources))
        self.state_words = -(-lane_capacity(num_sources) // 8)
        self.width = 1 + 4 + self.tally_width + 1 + self.state_words

    def encode(
        self,
        owned: dict[int, LaneReport],
        participants: int,
        rank: int | None,
        group: int,
        attempt: int,
        dp_size: int = 1,
    ):
        """This rank's table: the lanes it owns and, for `rank` not None, its group's participant row."""
        table = np.zeros((self.num_lanes + participants, self.width), dtype=np.int64)
        for lane, report in owned.items():
            data = canonical(report.state.to_dict())
            if len(data) > self.state_words * 8:
                raise DataError(f"lane {lane}'s state is {len(data)} bytes, over its {self.state_words * 8}-byte slot")
            words = np.frombuffer(data.ljust(self.state_words * 8, b"\0"), dtype=np.int64)
            digest = np.frombuffer(report.digest, dtype=np.int64)
            table[lane] = np.concatenate([[1], digest, report.tally, [len(data)], words])
        if rank is not None:
            table[self.num_lanes + rank, :4] = (1, group, attempt, dp_size)
        return table

    def decode(self, table: np.ndarray) -> Summed:
        """Raises DataError when a lane or a participant row was not given exactly once (a table that did not
        commit, or two ranks owning one lane)."""
        given = table[:, 0]
        if not (given == 1).all():
            missing = [int(i) for i in np.flatnonzero(given != 1)]
            raise DataError(
                f"the summed lane table has rows {missing[:8]} given {sorted(set(given[missing].tolist()))} times, "
                "not once: a committed step's table holds every lane and participant once (torchft's all-reduce "
                "must sum the participants' tables and zero a non-participant's)"
            )
        lanes = []
        t = self.tally_width
        for lane in range(self.num_lanes):
            row = table[lane]
            size = int(row[5 + t])
            text = row[6 + t :].tobytes()[:size]
            state = LaneState.from_dict(json.loads(text), f"lane {lane} of the torchft lane table")
            lanes.append(LaneReport(state, row[1:5].tobytes(), [int(x) for x in row[5 : 5 + t]]))
        members = [(int(row[1]), int(row[2]), int(row[3])) for row in table[self.num_lanes :]]
        return Summed(lanes, members)


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt of a step on this rank."""

    step: int
    attempt: int
    """1 for the first attempt of the step on this group, +1 after each that did not commit."""
    participants: int
    rank: int | None
    """This group's participating rank (None: in the quorum, healing, padding only)."""
    dp_rank: int
    share: RankShare
    rows: list[Row]
    """This rank's rows of the step, in global order."""
    local_batch_size: int
    owned: dict[int, LaneReport]

    def microbatches(self) -> list[list[Row] | None]:
        """share.slots microbatches of local_batch_size rows; None is a padding slot (train nothing, keep the
        collectives in line)."""
        size = self.local_batch_size
        real = [self.rows[i : i + size] for i in range(0, len(self.rows), size)]
        return [*real, *[None] * self.share.padding]


class FtSteps:
    """Step source of one rank of a replica group under its torchft Manager. Per step: `begin()` (runs
    start_quorum) -> train `attempt.microbatches()` -> all-reduce the gradients -> `finish(attempt)` (the table
    through the group and the Manager, then should_commit); the optimizer steps when it returns True. Committed
    steps' ledger entries are in `entries` (with who trained them), the same on every rank of the group.
    With dp_size > 1, `dp_allreduce(tensor)` sums an int64 tensor in place over the group's DP ranks."""

    def __init__(
        self,
        spec: EngineSpec,
        *,
        global_batch_size: int,
        local_batch_size: int,
        manager: ManagerLike,
        group: int,
        dp_rank: int = 0,
        dp_size: int = 1,
        dp_allreduce: Callable[[torch.Tensor], None] | None = None,
    ):
        if not 0 <= dp_rank < dp_size:
            raise ConfigError(
                f"dp_rank must be in [0, {dp_size}) for a replica group of {dp_size} ranks, got {dp_rank}"
            )
        if dp_size > 1 and dp_allreduce is None:
            raise ConfigError(
                f"a replica group of {dp_size} ranks needs dp_allreduce (a SUM over its ranks) to assemble the lane "
                "table; pass e.g. lambda t: torch.distributed.all_reduce(t, group=dp_group)"
            )
        self.spec, self.manager, self.group = spec, manager, group
        self.dp_rank, self.dp_size, self.dp_allreduce = dp_rank, dp_size, dp_allreduce
        self.global_batch_size, self.local_batch_size = global_batch_size, local_batch_size
        self.num_lanes = spec.num_lanes
        self.rows_per_lane = rows_per_lane(global_batch_size, self.num_lanes)
        microbatch_count(self.num_lanes, global_batch_size, local_batch_size)  # whole microbatches, else refused
        self.table = LaneTable(self.num_lanes, len(spec.sources))
        self.states = {lane: LaneState.initial(lane, len(spec.sources)) for lane in range(self.num_lanes)}
        """Every lane's state at the start of the next step: the last committed step's end."""
        self.steps_done = 0
        self.attempts = 0  # attempts of step steps_done + 1 that did not commit
        self.entries: list[LedgerEntry] = []
        self.healed: list[tuple[int, int]] = []
        """(from, to): this group healed from a peer at step `to` while at `from`, so steps from+1 .. to are not in
        `entries`: it did not train them (left out of their quorums, dead, or its commit failed where others'
        did not: torchft's commit is per replica group). The run's record is the union of the groups' ledgers."""
        self._lanes: tuple[tuple[int, ...], int, Any] | None = None  # (lanes, steps_done, group): reused while valid
        manager.register_state_dict_fn(STATE_KEY, self.load_state_dict, self.state_dict)

    # ---- healing: torchft's state dict ---------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.steps_done, "lanes": [self.states[lane].to_dict() for lane in range(self.num_lanes)]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        lanes = state["lanes"]
        if len(lanes) != self.num_lanes:
            raise ResumeError(f"a healing peer sent {len(lanes)} lane states; this job has {self.num_lanes} lanes")
        self.states = {i: LaneState.from_dict(s, f"lane {i} from a healing peer") for i, s in enumerate(lanes)}
        if int(state["step"]) != self.steps_done:
            self.healed.append((self.steps_done, int(state["step"])))
        self.steps_done, self.attempts = int(state["step"]), 0
        self._drop_lanes()

    # ---- a step -------------------------------------------------------------------------------

    def begin(self) -> Attempt:
        """The next attempt: the quorum (healing from a peer if behind), then this rank's rows of the step."""
        self.manager.start_quorum()
        if self.manager.current_step() != self.steps_done:
            raise ResumeError(
                f"torchft is at step {self.manager.current_step()} but the loader at {self.steps_done}; "
                "the loader's state travels only in torchft's healing state dict"
            )
        n, rank = self.manager.num_participants(), self.manager.participating_rank()
        if rank is None:
            part = idle_share(self.num_lanes, self.global_batch_size, self.local_batch_size, n * self.dp_size)
        else:
            members = Membership.uniform(n, self.dp_size)  # torchft: every replica group has the same size
            part = share(self.num_lanes, self.global_batch_size, self.local_batch_size, members, rank, self.dp_rank)
        produced = self._produce(tuple(part.rows.lanes))
        flat = [row for rows in produced for row, _ in rows]
        mine = flat[part.rows.skip : part.rows.skip + part.rows.take]
        start = part.rows.lanes.start
        owned = {}
        for lane in part.rows.owned:
            rows = produced[lane - start]
            plain = [row for row, _ in rows]
            owned[lane] = LaneReport(rows[-1][1], lane_digest(plain), step_tally(plain, len(self.spec.sources)))
        step = self.steps_done + 1
        return Attempt(step, self.attempts + 1, n, rank, self.dp_rank, part, mine, self.local_batch_size, owned)

    def finish(self, attempt: Attempt) -> bool:
        """The table over the group (dp_allreduce) and through the Manager, then should_commit(): True advances to
        the step's end states and records its ledger entry; False keeps the start-of-step states, so the next
        begin() trains the same step."""
        from torch.distributed import ReduceOp

        speaker = attempt.rank if self.dp_rank == 0 else None  # one participant row per group
        encoded = self.table.encode(
            attempt.owned, attempt.participants, speaker, self.group, attempt.attempt, self.dp_size
        )
        summed = torch.from_numpy(encoded)
        if self.dp_allreduce is not None:
            self.dp_allreduce(summed)  # the group's table first: then each rank's cross-group sum is the whole
        self.manager.allreduce(summed, reduce_op=ReduceOp.SUM).wait()
        if not self.manager.should_commit():
            self.attempts += 1
            self._drop_lanes()  # the next attempt's membership may give this rank other lanes
            return False
        table = self.table.decode(summed.numpy())
        self.states = {lane: report.state for lane, report in enumerate(table.lanes)}
        counts = [sum(column) for column in zip(*(report.tally for report in table.lanes))]
        membership: dict[str, object] = {
            "participants": attempt.participants,
            "groups": [group for group, _, _ in table.members],
            "attempt": max(tried for _, tried, _ in table.members),
            "ranks": sum(ranks for _, _, ranks in table.members),
        }
        sha = batch_digest(report.digest for report in table.lanes)
        entry = step_entry(self.spec, attempt.step, sha, self.global_batch_size, counts, membership)
        self.entries.append(entry)
        self.steps_done, self.attempts = attempt.step, 0
        return True

    def _produce(self, lanes: tuple[int, ...]) -> list[list[tuple[Row, LaneState]]]:
        """The step's rows of `lanes`, whole, from the start-of-step states. The previous step's lane group goes on
        when it produced exactly these lanes and that step committed (its streams stand at the table's states);
        otherwise a group is opened at the table's states."""
        if self._lanes is None or self._lanes[:2] != (lanes, self.steps_done):
            self._drop_lanes()
            states = {lane: self.states[lane] for lane in lanes}
            group = open_lane_group(
                self.spec, list(lanes), self.rows_per_lane, states=states, first_step=self.steps_done
            )
            self._lanes = (lanes, self.steps_done, group)
        group = self._lanes[2]
        if not lanes:
            return []
        produced: list[list[tuple[Row, LaneState]]] = group.next_step_with_states()
        self._lanes = (lanes, self.steps_done + 1, group)  # valid for the next step only if this one commits
        return produced

    def _drop_lanes(self) -> None:
        if self._lanes is not None:
            self._lanes[2].close()
            self._lanes = None

    def close(self) -> None:
        self._drop_lanes()
