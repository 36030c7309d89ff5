import pytest
from helpers import make_spec
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_titan.engine import LaneStream
from zephon_titan.engine.mixing import choose_source, lane_phases


def _simulate(weights, lengths, pieces, chunk, lane=0, lanes=1, chooser=choose_source):
    """Take `pieces` pieces of at most `chunk` tokens, one open document per source; source s's
    k-th document has lengths[s][k % len]. Yields the tokens taken per source after each piece."""
    phases = lane_phases([f"s{i}" for i in range(len(weights))], lane, lanes)
    tokens = [0] * len(weights)
    taken = [0] * len(weights)
    offset = [0] * len(weights)
    for _ in range(pieces):
        s = chooser(weights, tokens, [True] * len(weights), phases, chunk)
        n = lengths[s][taken[s] % len(lengths[s])]
        piece = min(chunk, n - offset[s])
        tokens[s] += piece
        offset[s] += piece
        if offset[s] == n:
            taken[s], offset[s] = taken[s] + 1, 0
        yield tokens


def mixture_error_bound(weight: float, num_sources: int, chunk: int) -> float:
    """The largest |w_s * T - t_s| the rule allows for a source of weight w_s (mixing.py's docstring)."""
    return (1 + num_sources * weight) * chunk


def _within_bound(weights, tokens, chunk):
    total = sum(tokens)
    return all(
        abs(w * total - t) <= mixture_error_bound(w, len(weights), chunk) + 1e-6 for w, t in zip(weights, tokens)
    )


@given(
    raw=st.lists(st.floats(0.01, 10), min_size=1, max_size=5),
    lengths=st.lists(st.lists(st.integers(1, 20_000), min_size=1, max_size=8), min_size=5, max_size=5),
    chunk=st.integers(16, 256),
    lanes=st.integers(1, 64),
    lane=st.integers(0, 63),
    pieces=st.integers(1, 400),
)
@settings(max_examples=200, deadline=None)
def test_token_mixture_stays_within_the_stated_bound(raw, lengths, chunk, lanes, lane, pieces):
    # Documents up to 100x a row of 200 tokens; the bound depends on the piece size only.
    weights = [w / sum(raw) for w in raw]
    for tokens in _simulate(weights, lengths[: len(weights)], pieces, chunk, lane % lanes, lanes):
        assert _within_bound(weights, tokens, chunk), (tokens, weights)


def test_the_bound_check_catches_a_bad_mixer():
    # Negative control: a mixer that ignores the weights breaks the bound.
    weights, lengths = [0.5, 0.5], [[100], [100]]
    violated = any(
        not _within_bound(weights, tokens, 64)
        for tokens in _simulate(weights, lengths, 50, 64, chooser=lambda w, t, a, p, c: 0)
    )
    assert violated


def _first_pieces(weights, lanes, pieces, phases_of):
    """Sources of each lane's first `pieces` pieces (long documents: every piece is a full chunk)."""
    counts = [0] * len(weights)
    for lane in range(lanes):
        tokens = [0] * len(weights)
        for _ in range(pieces):
            s = choose_source(weights, tokens, [True] * len(weights), phases_of(lane), 128)
            counts[s] += 1
            tokens[s] += 128
    return [c / (lanes * pieces) for c in counts]


@pytest.mark.parametrize("pieces", [2, 3, 5])
def test_lanes_start_apart(pieces):
    # The lanes' first pieces together hold every source, close to its weight: a step is a stratified sample.
    weights, lanes = [0.5, 0.2, 0.3], 64
    shares = _first_pieces(weights, lanes, pieces, lambda lane: lane_phases(["a", "b", "c"], lane, lanes))
    assert all(abs(share - w) <= 0.1 for share, w in zip(shares, weights)), shares
    if pieces <= 3:  # negative control: with one phase for all lanes, every lane makes the same choices
        same = _first_pieces(weights, lanes, pieces, lambda lane: (0.5, 0.5, 0.5))
        assert any(abs(share - w) > 0.1 for share, w in zip(same, weights)), same


def test_redistribute_renormalizes_over_active_sources():
    weights = [0.5, 0.3, 0.2]
    tokens = [0, 0, 0]
    phases = lane_phases(["a", "b", "c"], 0, 1)
    for _ in range(1000):
        s = choose_source(weights, tokens, [True, False, True], phases, 10)
        assert s != 1
        tokens[s] += 10
    assert tokens[0] / (tokens[0] + tokens[2]) == pytest.approx(0.5 / 0.7, abs=0.01)
    assert choose_source(weights, tokens, [False, False, False], phases, 10) == -1


def test_lane_mixture_tracks_weights_on_real_data(corpus_dir, tokenizer_dir):
    spec = make_spec(corpus_dir, tokenizer_dir, seq_len=128)
    for lane in (0, 5):
        stream = LaneStream(spec, lane)
        for _ in range(6):
            stream.take(40)
            tokens = [c.tokens for c in stream.feed.state().cursors]
            assert _within_bound(spec.weights, tokens, spec.mix_chunk_tokens), (tokens, spec.weights)
        shares = [t / sum(tokens) for t in tokens]
        assert shares == pytest.approx(list(spec.weights), abs=0.05)
