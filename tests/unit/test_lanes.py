import hashlib

import pytest
from helpers import make_spec

from zephon_titan.engine import (
    ConfigError,
    LaneGroup,
    LaneStream,
    batch_digest,
    lane_digest,
    lanes_of_rank,
    rank_rows,
    rows_per_lane,
    valid_world_sizes,
    validate_batch_layout,
)
from zephon_titan.testing import assert_same_rows_for_any_layout, global_batches

STEPS, GLOBAL_BATCH = 4, 16


def _global_batches(spec, world_size, lane_order=None):
    """Each rank's rows of each step, concatenated in rank order; also the digest-only hash."""
    groups = []
    for rank in range(world_size):
        lanes = list(lanes_of_rank(spec.num_lanes, world_size, rank))
        groups.append(LaneGroup(spec, lanes, rows_per_lane(GLOBAL_BATCH, spec.num_lanes)))
    out = []
    for _ in range(STEPS):
        per_lane = [lane_rows for g in groups for lane_rows in g.next_step()]
        if lane_order is not None:
            per_lane = [per_lane[i] for i in lane_order]
        flat = b"".join(row.to_bytes() for rows in per_lane for row in rows)
        out.append((hashlib.sha256(flat).hexdigest(), batch_digest(lane_digest(rows) for rows in per_lane)))
    return out


@pytest.mark.parametrize("packing", ["wrap", "best_fit"])
def test_global_batches_are_identical_for_every_world_size(corpus_dir, tokenizer_dir, packing):
    spec = make_spec(corpus_dir, tokenizer_dir, packing=packing, best_fit_window_docs=16)
    per_lane = rows_per_lane(GLOBAL_BATCH, spec.num_lanes)
    assert len({b"".join(step) for step in global_batches(spec, 1, per_lane, STEPS)}) == STEPS
    assert_same_rows_for_any_layout(spec, (2, 4, 8), per_lane, STEPS)


def test_negative_controls_other_seed_or_lane_order(corpus_dir, tokenizer_dir):
    spec = make_spec(corpus_dir, tokenizer_dir)
    reference = _global_batches(spec, 2)
    swapped = _global_batches(spec, 2, lane_order=[1, 0, 2, 3, 4, 5, 6, 7])
    other_seed = _global_batches(make_spec(corpus_dir, tokenizer_dir, seed=99), 2)
    for other in (swapped, other_seed):
        assert all(a[0] != b[0] and a[1] != b[1] for a, b in zip(reference, other))


def test_ownership_is_contiguous_and_complete():
    for w in (1, 2, 4, 8):
        owned = [lane for r in range(w) for lane in lanes_of_rank(8, w, r)]
        assert owned == list(range(8))
    assert valid_world_sizes(12) == [1, 2, 3, 4, 6, 12]


def test_invalid_world_size_lists_valid_ones():
    with pytest.raises(
        ConfigError, match=r"3 data-parallel ranks cannot share a global batch of 16 rows evenly; .*\[1, 2, 4, 8, 16\]"
    ):
        rank_rows(8, 16, 3, 0)


def test_global_batch_must_be_a_multiple_of_lanes():
    with pytest.raises(ConfigError, match="global batch size 20 is not a positive multiple of num_lanes 8"):
        rows_per_lane(20, 8)
    assert rows_per_lane(24, 8) == 3


@pytest.mark.parametrize("packing", ["wrap", "best_fit"])
def test_the_initial_state_is_known_without_reading_data(corpus_dir, tokenizer_dir, packing):
    from zephon_titan.engine import LaneState

    spec = make_spec(corpus_dir, tokenizer_dir, packing=packing)
    for lane in range(spec.num_lanes):
        assert LaneState.initial(lane, len(spec.sources)) == LaneStream(spec, lane).state()
    # Negative control: the state after one row is not the initial one.
    stream = LaneStream(spec, 0)
    stream.next_row()
    assert stream.state() != LaneState.initial(0, len(spec.sources))


@pytest.mark.parametrize(
    "batch, world, local, titan",
    [
        (
            0,
            2,
            2,
            "training.global_batch_size must be set explicitly (rows per optimizer step, a multiple of "
            "[dataloader] num_lanes = 8). TorchTitan's default (-1) means local_batch_size x data-parallel size",
        ),
        (
            16,
            3,
            2,
            "the data-parallel size is 3, which does not divide training.global_batch_size = 16 rows per step; "
            "valid data-parallel sizes: [1, 2, 4, 8] with local_batch_size = 2 (data_parallel_replicate_degree x "
            "data_parallel_shard_degree; [1, 2, 4, 8, 16] with a smaller local_batch_size)",
        ),
        (
            16,
            4,
            3,
            "each of the 4 data-parallel ranks takes global_batch_size / 4 = 4 rows per step, which is not a "
            "multiple of training.local_batch_size = 3; use a local_batch_size in [1, 2, 4]",
        ),
        (2**21, 1, 1, "[training] global_batch_size = 2097152 rows per step is above the bound of 1048576"),
    ],
)
def test_layout_errors_are_the_engines_words_and_the_adapter_names_torchtitans_keys(batch, world, local, titan):
    import pickle

    from zephon_titan.engine import LayoutError
    from zephon_titan.titan.dataloader import titan_layout_message

    with pytest.raises(LayoutError) as raised:
        validate_batch_layout(8, batch, world, local)
    engine = str(raised.value)
    assert not any(key in engine for key in ("training", "_size", "data_parallel", "TorchTitan")), engine
    assert titan_layout_message(raised.value).startswith(titan)
    assert titan_layout_message(pickle.loads(pickle.dumps(raised.value))) == titan_layout_message(raised.value)
