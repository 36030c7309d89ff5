import pytest
from helpers import make_spec
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_titan.engine import LaneStream
from zephon_titan.engine.mixing import choose_source, mixture_error_bound


def _simulate(weights, lengths, picks, chooser=choose_source):
    """Pick `picks` documents; source s's k-th document has lengths[s][k % len]."""
    tokens = [0] * len(weights)
    taken = [0] * len(weights)
    longest = max(max(ls) for ls in lengths)
    for _ in range(picks):
        s = chooser(weights, tokens, [True] * len(weights))
        tokens[s] += lengths[s][taken[s] % len(lengths[s])]
        taken[s] += 1
        yield tokens, longest


def _within_bound(weights, tokens, longest):
    total = sum(tokens)
    bound = mixture_error_bound(len(weights), longest)
    return all(-(1 - w) * longest - 1e-6 <= w * total - t <= bound + 1e-6 for w, t in zip(weights, tokens))


@given(
    raw=st.lists(st.floats(0.05, 10), min_size=1, max_size=5),
    lengths=st.lists(st.lists(st.integers(1, 500), min_size=1, max_size=8), min_size=5, max_size=5),
    picks=st.integers(1, 300),
)
@settings(max_examples=150, deadline=None)
def test_token_mixture_stays_within_the_stated_bound(raw, lengths, picks):
    weights = [w / sum(raw) for w in raw]
    for tokens, longest in _simulate(weights, lengths[: len(weights)], picks):
        assert _within_bound(weights, tokens, longest)


def test_the_bound_check_catches_a_bad_mixer():
    # Negative control: a mixer that ignores the weights breaks the bound.
    weights, lengths = [0.5, 0.5], [[100], [100]]
    violated = any(
        not _within_bound(weights, tokens, longest)
        for tokens, longest in _simulate(weights, lengths, 50, chooser=lambda w, t, a: 0)
    )
    assert violated


def test_redistribute_renormalizes_over_active_sources():
    weights = [0.5, 0.3, 0.2]
    tokens = [0, 0, 0]
    for _ in range(1000):
        s = choose_source(weights, tokens, [True, False, True])
        assert s != 1
        tokens[s] += 10
    assert tokens[0] / (tokens[0] + tokens[2]) == pytest.approx(0.5 / 0.7, abs=0.01)
    assert choose_source(weights, tokens, [False, False, False]) == -1


def test_lane_mixture_tracks_weights_on_real_data(corpus_dir, tokenizer_dir, prose_docs, code_docs):
    spec = make_spec(corpus_dir, tokenizer_dir, seq_len=128)
    longest = max(len(t) for t in spec.tokenizer.encode(prose_docs + code_docs))
    for lane in (0, 5):
        stream = LaneStream(spec, lane)
        for _ in range(6):
            stream.take(40)
            tokens = [c.tokens for c in stream.feed.state()]
            assert _within_bound(spec.weights, tokens, longest), (tokens, spec.weights)
        shares = [t / sum(tokens) for t in tokens]
        assert shares == pytest.approx(list(spec.weights), abs=0.1)
