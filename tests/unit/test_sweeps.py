"""Long sweeps, off by default: `pytest -m slow`."""

import pytest
from helpers import make_spec
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_titan.engine import LaneStream, lanes_of_rank, open_lane_group
from zephon_titan.testing import assert_restores_exactly

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("packing", ["wrap", "best_fit"])
def test_restore_at_every_cut(corpus_dir, tokenizer_dir, packing):
    spec = make_spec(corpus_dir, tokenizer_dir, seq_len=32, packing=packing, best_fit_window_docs=8)
    for lane in (0, 3, 7):
        assert_restores_exactly(spec, lane, range(150), rows=3)


# 12 examples: each starts its worker processes once per rank of every divisor (up to 31 groups), which took
# 8 min of CI at 30 examples of 2 workers; the gate's any-W property covers more layouts in-process.
@given(
    num_lanes=st.sampled_from([4, 6, 12, 16]),
    seed=st.integers(0, 1000),
    seq_len=st.integers(8, 200),
    num_workers=st.integers(0, 2),
)
@settings(max_examples=12, deadline=None)
def test_world_size_sweep(corpus_dir, tokenizer_dir, num_lanes, seed, seq_len, num_workers):
    spec = make_spec(corpus_dir, tokenizer_dir, seq_len=seq_len, num_lanes=num_lanes, seed=seed)
    reference = [LaneStream(spec, lane).take(6) for lane in range(num_lanes)]
    for w in [w for w in range(1, num_lanes + 1) if num_lanes % w == 0]:
        rows = {lane: [] for lane in range(num_lanes)}
        for r in range(w):
            with open_lane_group(spec, lanes_of_rank(num_lanes, w, r), 2, num_workers=num_workers) as g:
                for _ in range(3):
                    for lane, lane_rows in zip(lanes_of_rank(num_lanes, w, r), g.next_step()):
                        rows[lane].extend(lane_rows)
        for lane in range(num_lanes):
            assert [x.to_bytes() for x in rows[lane]] == [x.to_bytes() for x in reference[lane]]
