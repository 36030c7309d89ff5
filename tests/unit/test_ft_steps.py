"""The torchft step source (loader/ft_steps.py) without torchft: its lane table and its steps against the plan.

The Manager is replaced by the collective it stands for, done by the test: every participant's table is encoded,
the test sums them (a SUM all-reduce over the step's participants) and hands each participant the sum; a failed
attempt hands each its own table only (what torchft's all-reduce leaves when a peer died inside the step, as
benchmarks/torchft_feasibility.py saw) and should_commit() says False. The real thing, with torchft's lighthouse
and a SIGKILL, is tests/integration/test_torchft_elastic.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import threading

import corpus
import numpy as np
import pytest
import torch

from zephon_titan.engine import LaneState, batch_digest, lane_digest, open_lane_group, rows_per_lane
from zephon_titan.engine.ledger import LedgerEntry, step_entry
from zephon_titan.engine.rows import step_tally
from zephon_titan.errors import DataError
from zephon_titan.loader.ft_steps import STATE_KEY, FtSteps, LaneReport, LaneTable, union_ledger
from zephon_titan.testing import spec_from_table

LANES, G, LOCAL = 4, 12, 2


@pytest.fixture(scope="module")
def spec(corpus_dir, tokenizer_dir):
    table = corpus.two_source_table(corpus_dir, tokenizer_dir, LANES, seed=3)
    return spec_from_table(table, seq_len=64)


@pytest.fixture(scope="module")
def planned(spec):
    """Per step: the plan's rows (global order), end-of-step states and ledger entry."""
    rows, states, entries = [], [], []
    with open_lane_group(spec, range(LANES), rows_per_lane(G, LANES)) as group:
        for step in range(1, 15):
            lanes = group.next_step_with_states()
            plain = [[row for row, _ in lane] for lane in lanes]
            rows.append([row.to_bytes() for lane in plain for row in lane])
            states.append({i: lane[-1][1] for i, lane in enumerate(lanes)})
            counts = step_tally((row for lane in plain for row in lane), len(spec.sources))
            entries.append(step_entry(spec, step, batch_digest(lane_digest(r) for r in plain), G, counts))
    return rows, states, entries


class Collective:
    """One group's Manager, whose all-reduce result the test decides (see the module's docstring)."""

    def __init__(self, step: int = 0):
        self.n, self.rank, self.step, self.result, self.commit = 1, 0, step, None, True
        self.reduce = None
        self.fns: dict = {}

    def start_quorum(self) -> None:
        pass

    def num_participants(self) -> int:
        return self.n

    def participating_rank(self) -> int | None:
        return self.rank

    def current_step(self) -> int:
        return self.step

    def allreduce(self, tensor, should_quantize=False, reduce_op=None):
        if self.reduce is not None:
            self.reduce(tensor)
        else:
            tensor.copy_(torch.from_numpy(self.result))
        return self

    def wait(self) -> None:
        pass

    def should_commit(self) -> bool:
        self.step += self.commit
        return self.commit

    def register_state_dict_fn(self, key, load, save) -> None:
        self.fns[key] = (load, save)


def attempt_step(groups: dict[int, tuple[FtSteps, Collective]], alive: list[int], commit: bool = True):
    """One attempt by the `alive` groups (participating ranks in their order): the rows each trained."""
    attempts = {}
    for rank, g in enumerate(alive):
        source, manager = groups[g]
        manager.n, manager.rank, manager.commit = len(alive), rank, commit
        attempts[g] = source.begin()
    tables = {g: groups[g][0].table.encode(a.owned, a.participants, a.rank, g, a.attempt) for g, a in attempts.items()}
    total = sum(tables.values())
    for g, a in attempts.items():
        groups[g][1].result = total if commit else tables[g]
        assert groups[g][0].finish(a) is commit
    return [row.to_bytes() for g in alive for row in attempts[g].rows], attempts


def test_the_table_round_trips_states_digests_and_tallies(spec, planned):
    _, states, _ = planned
    table = LaneTable(LANES, len(spec.sources))
    reports = {
        lane: LaneReport(states[5][lane], bytes(range(lane, lane + 32)), [lane] * table.tally_width)
        for lane in range(LANES)
    }
    # Two participants, each owning two lanes: the sum of their tables is every lane once.
    total = table.encode({0: reports[0], 1: reports[1]}, 2, 0, 7, 1) + table.encode(
        {2: reports[2], 3: reports[3]}, 2, 1, 4, 2
    )
    summed = table.decode(total)
    assert summed.lanes == [reports[lane] for lane in range(LANES)]
    assert summed.members == [(7, 1, 1), (4, 2, 1)]


def test_a_table_that_did_not_commit_is_refused(spec, planned):
    """Negative control: after a peer died inside the step the all-reduce leaves a rank its own lanes only."""
    _, states, _ = planned
    table = LaneTable(LANES, len(spec.sources))
    own = table.encode({0: LaneReport(states[1][0], bytes(32), [0] * table.tally_width)}, 3, 0, 0, 1)
    with pytest.raises(DataError, match="given"):
        table.decode(own)
    doubled = own + own  # two ranks owning one lane
    with pytest.raises(DataError, match="given"):
        table.decode(doubled)


def test_a_run_with_a_death_a_retry_and_a_rejoin_trains_the_plan(spec, planned):
    """3 groups; group 2 dies inside step 5 (the attempt fails), steps 5-9 by 2, group 2 heals from group 0's
    state dict and steps 10-14 by 3: every committed step trains the plan's rows in order, each ledger SHA-256 is
    the plan's, and the failed attempt's rows are its retry's."""
    rows, _, entries = planned
    groups = {
        g: (FtSteps(spec, global_batch_size=G, local_batch_size=LOCAL, manager=m, group=g), m)
        for g in range(3)
        for m in [Collective()]
    }
    for step in range(1, 5):
        assert attempt_step(groups, [0, 1, 2])[0] == rows[step - 1]
    failed, attempts = attempt_step(groups, [0, 1, 2], commit=False)
    assert groups[0][0].steps_done == 4 and len(groups[0][0].entries) == 4
    del groups[2]
    retried, again = attempt_step(groups, [0, 1])
    assert retried == rows[4] and set(failed) <= set(retried)
    assert again[0].attempt == 2 and again[0].share.slots == 3 and attempts[0].share.slots == 2
    for step in range(6, 10):
        assert attempt_step(groups, [0, 1])[0] == rows[step - 1]
    reborn = FtSteps(spec, global_batch_size=G, local_batch_size=LOCAL, manager=(m := Collective(step=9)), group=2)
    m.fns[STATE_KEY][0](groups[0][0].state_dict())  # what torchft's healing hands the rejoining group
    groups[2] = (reborn, m)
    for step in range(10, 15):
        assert attempt_step(groups, [0, 1, 2])[0] == rows[step - 1]
    for g in (0, 1):
        got = groups[g][0].entries
        assert [e.step for e in got] == list(range(1, 15))
        assert [dataclasses.replace(e, membership=None) for e in got] == entries
        assert [e.membership["participants"] for e in got] == [3] * 4 + [2] * 5 + [3] * 5
        assert got[4].membership == {"participants": 2, "groups": [0, 1], "attempt": 2, "ranks": 2}
    assert [e.sha256 for e in reborn.entries] == [e.sha256 for e in entries[9:]]
    assert reborn.healed == [(0, 9)] and groups[0][0].healed == groups[1][0].healed == []


def test_a_group_left_out_of_a_step_lacks_it_and_the_union_is_the_plan(spec, planned, tmp_path, capsys):
    """Group 0 is late to step 3's quorum (a busy machine: the CI flake): groups 1 and 2 train it, group 0 heals
    past it at step 4. Its ledger lacks step 3 and says so in `healed` (and `verify` of it shows the gap); the
    union of the ledgers is the plan. Negative control: two groups recording one step differently are refused."""
    from zephon_titan.cli.ledgers import cmd_verify

    rows, _, entries = planned
    groups = {
        g: (FtSteps(spec, global_batch_size=G, local_batch_size=LOCAL, manager=m, group=g), m)
        for g in range(3)
        for m in [Collective()]
    }
    for step in (1, 2):
        assert attempt_step(groups, [0, 1, 2])[0] == rows[step - 1]
    assert attempt_step({g: groups[g] for g in (1, 2)}, [1, 2])[0] == rows[2]
    late, manager = groups[0]
    manager.step = 3
    manager.fns[STATE_KEY][0](groups[1][0].state_dict())  # torchft heals the late group at its next quorum
    assert attempt_step(groups, [0, 1, 2])[0] == rows[3]
    assert [e.step for e in late.entries] == [1, 2, 4] and late.healed == [(2, 3)]
    union = union_ledger(source.entries for source, _ in groups.values())
    assert [dataclasses.replace(e, membership=None) for e in union] == entries[:4]
    assert union[2].membership == {"participants": 2, "groups": [1, 2], "attempt": 1, "ranks": 2}
    # verify of the late group's own ledger names the step it lacks, and its gap.
    (tmp_path / "plan.jsonl").write_text("".join(e.to_json() + "\n" for e in entries[:4]))
    (tmp_path / "late.jsonl").write_text("".join(e.to_json() + "\n" for e in late.entries))
    args = argparse.Namespace(a=str(tmp_path / "plan.jsonl"), b=str(tmp_path / "late.jsonl"), steps=None, prefix=False)
    assert cmd_verify(args) == 1
    assert "first difference at step 3" in (said := capsys.readouterr().out) and "late.jsonl: steps 1-2,4)" in said
    other = dataclasses.replace(groups[2][0].entries[0], sha256="0" * 64)
    with pytest.raises(DataError, match="recorded step 1 differently"):
        union_ledger([late.entries, [other]])


def test_a_rank_behind_torchft_refuses_to_guess(spec):
    """A group whose Manager is ahead of its loader (healed without the loader's entry) stops in one line."""
    source = FtSteps(spec, global_batch_size=G, local_batch_size=LOCAL, manager=Collective(step=3), group=0)
    with pytest.raises(Exception, match="torchft is at step 3 but the loader at 0"):
        source.begin()


def test_membership_is_recorded_and_ignored_by_verify(tmp_path, planned, capsys):
    from zephon_titan.cli.ledgers import cmd_verify
    from zephon_titan.engine.ledger import read_ledger

    entries: list[LedgerEntry] = planned[2]
    run = [dataclasses.replace(e, membership={"participants": 2, "groups": [0, 1], "attempt": 1}) for e in entries]
    (tmp_path / "plan.jsonl").write_text("".join(e.to_json() + "\n" for e in entries))
    (tmp_path / "run.jsonl").write_text("".join(e.to_json() + "\n" for e in run))
    assert read_ledger(str(tmp_path / "run.jsonl")) == run
    args = type(
        "Args",
        (),
        {"a": str(tmp_path / "plan.jsonl"), "b": str(tmp_path / "run.jsonl"), "steps": None, "prefix": False},
    )
    assert cmd_verify(args) == 0
    # Negative control: a step's SHA-256 changed is still a difference.
    run[3] = dataclasses.replace(run[3], sha256="0" * 64)
    (tmp_path / "run.jsonl").write_text("".join(e.to_json() + "\n" for e in run))
    assert cmd_verify(args) == 1
    assert "first difference at step 4" in capsys.readouterr().out


def test_the_state_words_fit_a_lane_state(spec, planned):
    """The slot is resume.lane_capacity (the checkpoint's): a lane's state JSON fits it with room to spare."""
    _, states, _ = planned
    table = LaneTable(LANES, len(spec.sources))
    encoded = table.encode({0: LaneReport(states[13][0], bytes(32), [0] * table.tally_width)}, 1, 0, 0, 1)
    assert encoded.dtype == np.int64 and encoded[0, 5 + table.tally_width] < table.state_words * 8 / 2
    assert LaneState.from_dict(states[13][0].to_dict()) == states[13][0]


def test_survivors_that_do_not_divide_the_step_pad_and_still_train_it_whole(spec):
    """G = 8 in microbatches of 2 (M = 4) over 3 groups: shares of 1, 1 and 2 microbatches, 2 slots each (the short
    ones end in a padding slot); over 2 groups 2 each, no padding. The rows are the step's either way."""
    with open_lane_group(spec, range(LANES), rows_per_lane(8, LANES)) as group:
        plan = [[row.to_bytes() for lane in group.next_step() for row in lane] for _ in range(3)]
    groups = {
        g: (FtSteps(spec, global_batch_size=8, local_batch_size=LOCAL, manager=m, group=g), m)
        for g in range(3)
        for m in [Collective()]
    }
    rows, attempts = attempt_step(groups, [0, 1, 2])
    assert rows == plan[0]
    assert [[slot is None for slot in a.microbatches()] for a in attempts.values()] == [[False, True]] * 2 + [
        [False, False]
    ]
    del groups[1]
    rows, attempts = attempt_step(groups, [0, 2])
    assert rows == plan[1] and all(a.share.padding == 0 for a in attempts.values())


class Sum:
    """An in-place SUM all-reduce among `n` threads, as gloo does among processes."""

    def __init__(self, n: int):
        self.barrier, self.parts, self.lock = threading.Barrier(n), [], threading.Lock()

    def __call__(self, tensor) -> None:
        with self.lock:
            self.parts.append(tensor.clone())
        self.barrier.wait()
        tensor.copy_(sum(self.parts))


def attempt_dp(ranks: dict, alive: list[int], commit: bool = True, group_sum: bool = True) -> list[bytes]:
    """One attempt by the `alive` groups of 2 ranks, each rank a thread: its group's table summed by `Sum`
    (dp_allreduce), then across groups on its DP rank's PG (the Manager's all-reduce; a failed attempt leaves each
    group its own table). The rows trained, in live-rank order."""
    attempts = {}
    for rank, g in enumerate(alive):
        for d in range(2):
            source, manager = ranks[g, d]
            manager.n, manager.rank, manager.commit = len(alive), rank, commit
            attempts[g, d] = source.begin()
    inside = {g: Sum(2) if group_sum else lambda t: None for g in alive}
    across = {d: Sum(len(alive)) for d in range(2)}
    for (g, d), (source, manager) in ranks.items():
        source.dp_allreduce, manager.reduce = inside.get(g), across[d] if commit else (lambda t: None)
    results: dict = {}

    def finish(key) -> None:
        try:
            results[key] = ranks[key][0].finish(attempts[key])
        except Exception as e:  # noqa: BLE001  (reported below, on the test's thread)
            results[key] = e

    threads = [threading.Thread(target=finish, args=(key,)) for key in attempts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for key, result in results.items():
        if isinstance(result, Exception):
            raise result
        assert result is commit, key
    return [row.to_bytes() for g in alive for d in range(2) for row in attempts[g, d].rows]


def test_replica_groups_of_two_ranks_split_each_step_over_the_live_ranks(spec, planned):
    """3 groups x 2 DP ranks (M = 6 microbatches: 1 per live rank); group 2 dies inside step 3 (the attempt fails),
    steps 3-4 by 4 live ranks (shares of 1 and 2 microbatches, 2 slots each), group 2's ranks heal from group 0's
    ranks and steps 5-6 by 6. Every step the plan's rows in order; every rank's ledger the plan's, with 6, 4, 6
    ranks recorded. Negative control: without the sum inside the group, the table is refused (lanes missing)."""
    rows, _, entries = planned

    def source(g: int, d: int, manager) -> FtSteps:
        return FtSteps(
            spec,
            global_batch_size=G,
            local_batch_size=LOCAL,
            manager=manager,
            group=g,
            dp_rank=d,
            dp_size=2,
            dp_allreduce=lambda t: None,
        )

    ranks = {(g, d): (source(g, d, m), m) for g in range(3) for d in range(2) for m in [Collective()]}
    for step in (1, 2):
        assert attempt_dp(ranks, [0, 1, 2]) == rows[step - 1]
    first = set(attempt_dp(ranks, [0, 1, 2], commit=False))
    for d in range(2):
        del ranks[2, d]
    retried = attempt_dp(ranks, [0, 1])
    assert retried == rows[2] and first <= set(retried)
    assert attempt_dp(ranks, [0, 1]) == rows[3]
    for d in range(2):  # torchft heals rank d of group 2 from rank d of a live group
        ranks[2, d] = (source(2, d, m := Collective(step=4)), m)
        m.fns[STATE_KEY][0](ranks[0, d][0].state_dict())
    for step in (5, 6):
        assert attempt_dp(ranks, [0, 1, 2]) == rows[step - 1]
    for (g, d), (got, _) in ranks.items():
        mine = got.entries if g < 2 else [*entries[:4], *got.entries]
        assert [dataclasses.replace(e, membership=None) for e in mine] == entries[:6], (g, d)
    assert [e.membership["ranks"] for e in ranks[0, 1][0].entries] == [6, 6, 4, 4, 6, 6]
    with pytest.raises(DataError, match="given"):
        attempt_dp(ranks, [0, 1, 2], group_sum=False)
