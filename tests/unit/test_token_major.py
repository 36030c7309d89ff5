"""The loader/ seam, proven by a second consumer: a small token-major adapter (what the TorchTitan after 0.3 asks of
a loader: microbatches as [T] tokens with positions and a valid-token count, rows per step from a token budget),
written on loader/rank_steps.RankSteps alone, gives the bytes of the 0.3 adapter (titan/dataloader.py) for any DP
size, and the two read each other's checkpoint entries."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import data_table

from zephon_titan.config import config_from_dict
from zephon_titan.loader.rank_steps import RankSteps
from zephon_titan.titan.dataloader import ZephonDataLoader
from zephon_titan.titan.tokenizer import load_tokenizer

SEQ = 32
BUDGET = 16 * SEQ  # tokens per optimizer step: 16 rows
MICRO_TOKENS = 2 * SEQ


class TokenMajor(RankSteps):
    """One DP rank's microbatches as [T] tensors: the rows of a microbatch concatenated (positions restart at each
    document, so attention stays per document), with the count of tokens that have a label."""

    def __init__(self, data, *, token_budget: int, tokens_per_microbatch: int, seq_len: int, dp_world_size, dp_rank):
        super().__init__(
            data,
            global_batch_size=token_budget // seq_len,
            dp_world_size=dp_world_size,
            dp_rank=dp_rank,
            local_batch_size=tokens_per_microbatch // seq_len,
            seq_len=seq_len,
            tokenizer=lambda: load_tokenizer(data.tokenizer_path, data.add_bos, data.add_eos),
        )

    def __iter__(self):
        for step in self.steps():
            rows = step.rows
            for start in range(0, len(rows), self.local_batch_size):
                chunk = rows[start : start + self.local_batch_size]
                if start + self.local_batch_size >= len(rows):
                    self.consume(step)
                labels = torch.from_numpy(np.concatenate([r.labels for r in chunk]).astype(np.int64))
                yield (
                    {
                        "input": torch.from_numpy(np.concatenate([r.inputs for r in chunk]).astype(np.int64)),
                        "positions": torch.from_numpy(np.concatenate([r.positions for r in chunk]).astype(np.int64)),
                        "valid_tokens": int((labels != -100).sum()),
                    },
                    labels,
                )


def _data(corpus_dir, tokenizer_dir):
    return config_from_dict(data_table(corpus_dir, tokenizer_dir))


def _token_major(data, world, rank):
    return TokenMajor(
        data, token_budget=BUDGET, tokens_per_microbatch=MICRO_TOKENS, seq_len=SEQ, dp_world_size=world, dp_rank=rank
    )


def _titan(data, world, rank):
    config = ZephonDataLoader.Config(data=data, global_batch_size=BUDGET // SEQ)
    return config.build(dp_world_size=world, dp_rank=rank, tokenizer=None, seq_len=SEQ, local_batch_size=2)


def _flat_steps(loaders, steps, flatten):
    """Per step, every rank's microbatches in DP-rank order, as one flat token tensor (input, positions, labels)."""
    iters = [iter(loader) for loader in loaders]
    per_rank = BUDGET // SEQ // len(loaders) // 2
    out = []
    for _ in range(steps):
        parts = [flatten(*next(it)) for it in iters for _ in range(per_rank)]
        out.append(torch.cat(parts, dim=1))
    return out


def _titan_flat(inputs, labels):
    return torch.stack([inputs["input"].reshape(-1), inputs["positions"].reshape(-1), labels.reshape(-1)])


def _token_major_flat(inputs, labels):
    assert inputs["input"].shape == (MICRO_TOKENS,) and inputs["valid_tokens"] == int((labels != -100).sum())
    return torch.stack([inputs["input"], inputs["positions"], labels])


@pytest.mark.parametrize("world", [1, 2, 4])
def test_a_token_major_adapter_gives_the_bytes_of_the_titan_adapter(corpus_dir, tokenizer_dir, world):
    data = _data(corpus_dir, tokenizer_dir)
    titan = _flat_steps([_titan(data, world, r) for r in range(world)], 3, _titan_flat)
    token_major = _flat_steps([_token_major(data, world, r) for r in range(world)], 3, _token_major_flat)
    assert all(torch.equal(a, b) for a, b in zip(titan, token_major))
    assert not torch.equal(titan[0], titan[1])  # negative control: steps differ, so equality is not vacuous


def test_the_two_adapters_resume_from_each_others_state(corpus_dir, tokenizer_dir):
    """Two steps on 2 ranks of the token-major adapter, resumed on 1 rank of the 0.3 adapter: step 3 is the step 3
    of an uninterrupted 0.3 run; and the other way round."""
    data = _data(corpus_dir, tokenizer_dir)
    want = _flat_steps([_titan(data, 1, 0)], 3, _titan_flat)[2]
    for first, then, first_flat in [(_token_major, _titan, _token_major_flat), (_titan, _token_major, _titan_flat)]:
        ranks = [first(data, 2, r) for r in range(2)]
        _flat_steps(ranks, 2, first_flat)
        saved = {k: v for loader in ranks for k, v in loader.state_dict().items()}
        resumed = then(data, 1, 0)
        resumed.load_state_dict({k: saved[k] for k in resumed.state_dict()})
        flat = _titan_flat if then is _titan else _token_major_flat
        assert torch.equal(_flat_steps([resumed], 1, flat)[0], want)
