"""A step's rows split over the replica groups taking part in it (engine/participants.py), by hypothesis.

For random layouts the loader allows (L lanes, R rows per lane, a local batch dividing G), random memberships per
step and random failed attempts: the live ranks' rows, concatenated in live-rank order, are the step's global
batch, each row exactly once, whatever the membership; every live rank runs the same number of microbatch slots;
a retried step covers the same rows; with N live ranks dividing the microbatches the split is lanes.rank_rows's.
Negative control: TorchTitan 0.3's FT split (a fixed share per configured group) leaves a dead group's rows
untrained.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_titan.engine.lanes import rank_rows
from zephon_titan.engine.participants import (
    Membership,
    idle_share,
    microbatch_count,
    rows_of,
    share,
    split_step,
    static_share,
    step_rows,
)
from zephon_titan.errors import ConfigError


@st.composite
def layouts(draw: st.DrawFn) -> tuple[int, int, int]:
    """(num_lanes, global_batch_size, local_batch_size) with G a multiple of L and of the local batch."""
    lanes = draw(st.integers(1, 8))
    global_batch = lanes * draw(st.integers(1, 6))
    local = draw(st.sampled_from([d for d in range(1, global_batch + 1) if global_batch % d == 0]))
    return lanes, global_batch, local


memberships = st.lists(
    st.tuples(st.integers(0, 7), st.integers(1, 4)), min_size=1, max_size=5, unique_by=lambda g: g[0]
).map(Membership.of)


def trained(layout: tuple[int, int, int], membership: Membership) -> list[tuple[int, int]]:
    lanes, global_batch, local = layout
    rows: list[tuple[int, int]] = []
    for piece in split_step(lanes, global_batch, local, membership).values():
        rows += rows_of(piece.rows, lanes, global_batch)
    return rows


@settings(max_examples=300, deadline=None)
@given(layouts(), memberships)
def test_live_ranks_cover_the_step_once_in_order(layout: tuple[int, int, int], membership: Membership) -> None:
    lanes, global_batch, local = layout
    assert trained(layout, membership) == step_rows(lanes, global_batch)
    shares = split_step(lanes, global_batch, local, membership)
    m, n = microbatch_count(lanes, global_batch, local), membership.live_ranks
    counts = [len(s.microbatches) for s in shares.values()]
    assert {s.slots for s in shares.values()} == {-(-m // n)}  # the same slots on every live rank
    assert max(counts) - min(counts) <= 1 and sum(counts) == m
    owners = [lane for s in shares.values() for lane in s.rows.owned]
    assert owners == list(range(lanes))  # every lane owned once: its state, digest and tokens count once


@settings(max_examples=200, deadline=None)
@given(layouts(), st.lists(st.tuples(memberships, st.booleans()), min_size=1, max_size=8))
def test_a_run_with_failures_trains_the_planned_rows(
    layout: tuple[int, int, int], attempts: list[tuple[Membership, bool]]
) -> None:
    """Attempts of steps under changing memberships; a failed attempt (not committed) is retried with the same
    rows from the state at its start. The committed steps' rows, as (lane, row of the lane's stream), are the
    plan's."""
    lanes, global_batch, _ = layout
    per_lane = global_batch // lanes
    committed: list[list[tuple[int, int]]] = []
    for membership, commits in attempts:
        step = len(committed)  # the loader's state at the start of the step: only commits advance it
        rows = [(lane, step * per_lane + row) for lane, row in trained(layout, membership)]
        if commits:
            committed.append(rows)
    plan = [[(lane, s * per_lane + row) for lane, row in step_rows(lanes, global_batch)] for s in range(len(committed))]
    assert committed == plan


@settings(max_examples=200, deadline=None)
@given(layouts(), st.integers(1, 6), st.data())
def test_one_group_whose_ranks_divide_the_batch_is_rank_rows(
    layout: tuple[int, int, int], dp_size: int, data: st.DataObject
) -> None:
    lanes, global_batch, local = layout
    m = global_batch // local
    groups = data.draw(st.integers(1, 3))
    if m % (groups * dp_size):
        return
    membership = Membership.uniform(groups, dp_size)
    for (group, rank), piece in split_step(lanes, global_batch, local, membership).items():
        assert piece.rows == rank_rows(lanes, global_batch, groups * dp_size, group * dp_size + rank)
        assert piece.padding == 0


def test_uneven_survivors_pad_one_microbatch() -> None:
    """16 microbatches on 3 groups of 1: shares 5, 5, 6, each runs 6 slots; with 2 groups, 8 each, no padding."""
    three = split_step(4, 16, 1, Membership.uniform(3, 1))
    assert [len(s.microbatches) for s in three.values()] == [5, 5, 6]
    assert [s.padding for s in three.values()] == [1, 1, 0]
    two = split_step(4, 16, 1, Membership.of([(0, 1), (2, 1)]))
    assert [(len(s.microbatches), s.padding) for s in two.values()] == [(8, 0), (8, 0)]
    assert idle_share(4, 16, 1, 2).slots == 8 and idle_share(4, 16, 1, 2).rows.take == 0


def test_more_live_ranks_than_microbatches_leave_some_padding_only() -> None:
    pieces = split_step(2, 4, 2, Membership.uniform(3, 1))  # 2 microbatches, 3 ranks: one trains padding only
    assert [len(s.microbatches) for s in pieces.values()] == [0, 1, 1]
    assert {s.slots for s in pieces.values()} == {1}


def test_static_share_loses_a_dead_groups_rows() -> None:
    """Negative control: TorchTitan 0.3's FT split (get_dp_info) keeps each configured group's share whatever the
    step's members, so with group 2 of 3 dead its rows are trained by nobody; the split by step covers them."""
    lanes, global_batch, alive = 6, 12, [0, 1]
    static = [row for g in alive for row in rows_of(static_share(lanes, global_batch, 3, 1, g, 0), lanes, global_batch)]
    assert len(static) == 8 and set(step_rows(lanes, global_batch)) - set(static)  # 4 rows of the step lost
    survivors = Membership.of([(g, 1) for g in alive])
    assert trained((lanes, global_batch, 1), survivors) == step_rows(lanes, global_batch)


def test_mistakes_are_one_line() -> None:
    with pytest.raises(ConfigError, match="not a multiple of local batch size 5"):
        share(2, 4, 5, Membership.uniform(1, 1), 0, 0)
    with pytest.raises(ConfigError, match="names a replica group twice"):
        Membership.of([(1, 1), (1, 2)])
    with pytest.raises(ConfigError, match="does not take part in this step"):
        share(2, 4, 1, Membership.uniform(2, 1), 5, 0)
    with pytest.raises(ConfigError, match="no replica group"):
        Membership.of([])
