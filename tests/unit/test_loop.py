"""The loader in a user's own loop (zephon_titan.loop): driven through its public API only, each step's global
batch (every rank's rows, in rank order) is the same bytes for any number of ranks W dividing it, and a state
saved on W ranks at any step (the ranks' parts merged) resumes on any other W to the uninterrupted run's steps."""

import itertools

import pytest
import torch
from helpers import data_table
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_titan.errors import ConfigError, ResumeError
from zephon_titan.loop import Loader

G, SEQ_LEN, STEPS = 8, 64, 6


def _loaders(table, world_size, tokenizer):
    return [
        Loader(table, seq_len=SEQ_LEN, global_batch_size=G, rank=r, world_size=world_size, tokenizer=tokenizer)
        for r in range(world_size)
    ]


def _global_steps(loaders, steps):
    """Each step's global batch as bytes: every rank's rows, rank after rank (the ranks step together)."""
    iters = [iter(loader) for loader in loaders]
    out = []
    for _ in range(steps):
        taken = [next(it) for it in iters]
        assert len({step.number for step in taken}) == 1
        out.append(b"".join(row.to_bytes() for step in taken for row in step.rows))
    return out


@pytest.fixture(scope="module")
def reference(corpus_dir, tokenizer_dir):
    table = data_table(corpus_dir, tokenizer_dir)
    (loader,) = _loaders(table, 1, None)
    return table, loader.spec.tokenizer, _global_steps([loader], STEPS)


@settings(max_examples=6, deadline=None)
@given(saved_on=st.sampled_from([1, 2, 4, 8]), resumed_on=st.sampled_from([1, 2, 4, 8]), cut=st.integers(0, 4))
def test_any_world_size_gives_the_same_global_batches_and_resumes_on_another(reference, saved_on, resumed_on, cut):
    table, tokenizer, expected = reference
    first = _loaders(table, saved_on, tokenizer)
    assert _global_steps(first, cut) == expected[:cut]
    state = dict(itertools.chain.from_iterable(loader.state_dict().items() for loader in first))
    second = _loaders(table, resumed_on, tokenizer)
    for loader in second:
        loader.load_state_dict(state)
        assert loader.steps_done == cut
    assert _global_steps(second, STEPS - cut) == expected[cut:]
    for loader in first + second:
        loader.close()


def test_steps_come_as_arrays_and_microbatches(reference):
    table, tokenizer, expected = reference
    loader = Loader(table, seq_len=SEQ_LEN, global_batch_size=G, world_size=2, rank=1, local_batch_size=2,
                    tokenizer=tokenizer)  # fmt: skip
    step = next(iter(loader))
    arrays = step.arrays()
    assert step.number == 1 and {a.shape for a in arrays.values()} == {(G // 2, SEQ_LEN)}
    microbatches = list(step.microbatches())
    assert [m.last for m in microbatches] == [False, True]
    assert torch.equal(torch.cat([m.inputs() for m in microbatches]), torch.from_numpy(arrays["inputs"]).long())
    assert b"".join(row.to_bytes() for row in step.rows) == expected[0][len(expected[0]) // 2 :]  # rank 1's half


def test_mistakes_are_one_line(reference):
    table, tokenizer, _ = reference
    with pytest.raises(ConfigError) as e:
        Loader(table, seq_len=SEQ_LEN, global_batch_size=G, world_size=3, tokenizer=tokenizer)
    assert "\n" not in str(e.value) and "3" in str(e.value)
    # A state of another seed is refused, naming the change; negative control for the resume property above.
    (other,) = _loaders({**table, "seed": 8}, 1, tokenizer)
    _global_steps([other], 1)
    (loader,) = _loaders(table, 1, tokenizer)
    with pytest.raises(ResumeError, match=r"seed: 8 -> 7"):
        loader.load_state_dict(other.state_dict())
