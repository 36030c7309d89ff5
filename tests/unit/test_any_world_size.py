"""Rows, not lanes, belong to ranks: any data-parallel size W that divides the global batch G gives the same
global batches, more ranks than lanes included, and a checkpoint saved at any such W resumes at any other.

The loaders are built as TorchTitan builds them (no torchrun here: the torchrun + DCP runs are in
tests/integration); a checkpoint is what DCP stores, the union of the ranks' entries.
"""

import pytest
import torch
from helpers import data_table
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zephon_titan.config import config_from_dict
from zephon_titan.engine import rank_rows
from zephon_titan.engine.resume import HEADER_KEY, lane_key
from zephon_titan.loader.rank_steps import StepRecord
from zephon_titan.titan.dataloader import ZephonDataLoader

SEQ = 32


def _loaders(corpus_dir, tokenizer_dir, lanes, global_batch, world, local, **overrides):
    data = config_from_dict(data_table(corpus_dir, tokenizer_dir, num_lanes=lanes, **overrides))
    config = ZephonDataLoader.Config(data=data, global_batch_size=global_batch)
    return [
        config.build(dp_world_size=world, dp_rank=r, tokenizer=None, seq_len=SEQ, local_batch_size=local)
        for r in range(world)
    ]


def _steps(loaders, steps, global_batch, local):
    """Per step: every rank's rows (inputs, positions, labels) concatenated in DP-rank order, and the lane
    digests of the ledger in the order the ranks report them (each its owned lanes)."""
    iters = [iter(loader) for loader in loaders]
    per_rank = global_batch // len(loaders) // local
    out = []
    for _ in range(steps):
        parts = [next(it) for it in iters for _ in range(per_rank)]
        rows = torch.cat([torch.stack([p[0]["input"], p[0]["positions"], p[1]]) for p in parts], dim=1)
        records: list[StepRecord] = [loader.last_step for loader in loaders]
        out.append((rows, [d for record in records for d in record.lane_digests]))
    return out


def _checkpoint(loaders) -> dict:
    """What DCP stores: the union of the ranks' entries; every lane exactly once."""
    saved: dict = {}
    for loader in loaders:
        state = loader.state_dict()
        assert not (set(state) - {HEADER_KEY}) & set(saved), "a lane saved by two ranks"
        saved.update(state)
    return saved


def _restore(loaders, saved):
    for loader in loaders:  # each rank loads the header and every lane it produces
        loader.load_state_dict({k: saved[k] for k in [HEADER_KEY, *map(lane_key, loader.lane_ids)]})


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def _layouts(draw):
    lanes = draw(st.sampled_from([1, 2, 3, 4, 8]))
    global_batch = lanes * draw(st.sampled_from([1, 2, 3, 6]))
    world = draw(st.sampled_from(_divisors(global_batch)))
    resume = draw(st.sampled_from(_divisors(global_batch)))
    local = draw(st.sampled_from(_divisors(global_batch // world)))
    local_after = draw(st.sampled_from(_divisors(global_batch // resume)))
    return lanes, global_batch, world, resume, local, local_after


def test_every_lane_is_owned_once_and_rows_partition_the_step():
    for lanes in range(1, 9):
        for global_batch in range(lanes, 8 * lanes + 1, lanes):
            for world in _divisors(global_batch):
                parts = [rank_rows(lanes, global_batch, world, r) for r in range(world)]
                assert [lane for p in parts for lane in p.owned] == list(range(lanes))
                per_lane = global_batch // lanes
                rows = [p.lanes.start * per_lane + p.skip + i for p in parts for i in range(p.take)]
                assert rows == list(range(global_batch))  # each row of the step taken once, in order


def _same_batches_and_resume(corpus_dir, tokenizer_dir, layout, packing):
    lanes, global_batch, world, resume, local, local_after = layout
    build = lambda w, lbs: _loaders(corpus_dir, tokenizer_dir, lanes, global_batch, w, lbs, packing=packing)  # noqa: E731
    reference = _steps(build(1, global_batch), 4, global_batch, global_batch)
    first = build(world, local)
    ran = _steps(first, 2, global_batch, local)
    for (rows, digests), (want_rows, want_digests) in zip(ran, reference):
        assert torch.equal(rows, want_rows) and digests == want_digests
    second = build(resume, local_after)
    _restore(second, _checkpoint(first))
    for (rows, digests), (want_rows, want_digests) in zip(_steps(second, 2, global_batch, local_after), reference[2:]):
        assert torch.equal(rows, want_rows) and digests == want_digests


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=_layouts(), packing=st.sampled_from(["wrap", "best_fit"]))
def test_any_divisor_of_the_global_batch_gives_the_same_batches_and_resumes_at_any_other(
    corpus_dir, tokenizer_dir, layout, packing
):
    _same_batches_and_resume(corpus_dir, tokenizer_dir, layout, packing)


@pytest.mark.heavy  # the long sweep of the same property (by hand before a release; the gate runs 6 examples)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=_layouts(), packing=st.sampled_from(["wrap", "best_fit"]))
def test_the_layout_sweep(corpus_dir, tokenizer_dir, layout, packing):
    _same_batches_and_resume(corpus_dir, tokenizer_dir, layout, packing)


def test_more_ranks_than_lanes_and_the_negative_controls(corpus_dir, tokenizer_dir):
    # 2 lanes, 12 rows per step: 2 -> 3 and 4 ranks (W > L, W not dividing L), as the trainer test runs it.
    reference = _steps(_loaders(corpus_dir, tokenizer_dir, 2, 12, 1, 12), 4, 12, 12)
    first = _loaders(corpus_dir, tokenizer_dir, 2, 12, 2, 2)
    _steps(first, 2, 12, 2)
    saved = _checkpoint(first)
    assert sorted(saved) == [HEADER_KEY, lane_key(0), lane_key(1)]
    for world in (3, 4):
        resumed = _loaders(corpus_dir, tokenizer_dir, 2, 12, world, 1)
        _restore(resumed, saved)
        after = _steps(resumed, 2, 12, 1)
        assert all(torch.equal(a[0], b[0]) for a, b in zip(after, reference[2:]))
        assert len(_checkpoint(resumed)) == 3  # still every lane once
    # Negative controls: the ranks' rows in another order, and another seed, differ.
    four = _steps(_loaders(corpus_dir, tokenizer_dir, 2, 12, 4, 3), 1, 12, 3)[0][0]
    swapped = torch.cat([four[:, 3:6], four[:, :3], four[:, 6:]], dim=1)
    assert torch.equal(four, reference[0][0]) and not torch.equal(swapped, reference[0][0])
    other = _steps(_loaders(corpus_dir, tokenizer_dir, 2, 12, 3, 2, seed=99), 1, 12, 2)[0][0]
    assert not torch.equal(other, reference[0][0])


@pytest.mark.parametrize("world", [3, 5])
def test_a_size_that_does_not_divide_the_global_batch_names_the_valid_ones(corpus_dir, tokenizer_dir, world):
    from zephon_titan.errors import ConfigError

    with pytest.raises(ConfigError, match=r"does not divide training.global_batch_size = 16 .*\[1, 2, 4, 8, 16\]"):
        _loaders(corpus_dir, tokenizer_dir, 8, 16, world, 1)


def test_the_eval_set_is_the_same_rows_for_any_divisor_of_its_batch(corpus_dir, tokenizer_dir):
    from zephon_titan.titan.validator import ZephonEvalLoader

    data = config_from_dict(data_table(corpus_dir, tokenizer_dir, num_lanes=2, exhaustion="redistribute"))
    config = ZephonEvalLoader.Config(data=data, global_batch_size=12)

    def eval_set(world, local):
        """Per eval step: the ranks' rows in DP-rank order, and the owned lanes' digests in rank order."""
        loaders = [
            config.build(dp_world_size=world, dp_rank=r, tokenizer=None, seq_len=SEQ, local_batch_size=local)
            for r in range(world)
        ]
        out = []
        for steps in zip(*(loader.steps(3) for loader in loaders)):
            rows = torch.cat(
                [torch.cat([mb[1] for mb in loader.microbatches(step)]) for loader, step in zip(loaders, steps)]
            )
            digests = [d for loader, step in zip(loaders, steps) for d in loader.lanes.of_owned(step.lane_digests())]
            out.append((rows, digests))
        return out

    reference = eval_set(1, 12)
    assert len(reference) == 3 and not torch.equal(reference[0][0], reference[1][0])  # the comparison can fail
    for world, local in ((2, 3), (3, 2), (4, 3), (12, 1)):  # W not dividing L, W > L, one row per rank
        got = eval_set(world, local)
        assert all(torch.equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(got, reference)), world


@pytest.mark.slow  # worker processes: the same lanes as in process (test_stream, test_workers), shared here
def test_worker_processes_with_shared_lanes(corpus_dir, tokenizer_dir):
    # 2 lanes, 12 rows per step on 4 ranks: every lane is shared by two ranks, each producing it in its workers.
    reference = _steps(_loaders(corpus_dir, tokenizer_dir, 2, 12, 1, 12), 3, 12, 12)
    ranks = _loaders(corpus_dir, tokenizer_dir, 2, 12, 4, 3, num_workers=2, prefetch_factor=2)
    try:
        got = _steps(ranks, 3, 12, 3)
        tokens = [sum(x) for x in zip(*(loader.consumed_tokens() for loader in ranks))]
    finally:
        for loader in ranks:
            loader.close()
    assert all(torch.equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(got, reference))
    one = _loaders(corpus_dir, tokenizer_dir, 2, 12, 1, 12)[0]
    _steps([one], 3, 12, 12)
    assert tokens == one.consumed_tokens()  # the owners' tokens add up to every lane once
