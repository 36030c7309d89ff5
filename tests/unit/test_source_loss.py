"""The loss of each source from one pass (titan/source_loss.py) equals the validator's former computation, one
call of TorchTitan's loss per source, on the same logits (alone and through TorchTitan's ChunkedLossWrapper, the
debug model's loss); TorchTitan's own loss is returned unchanged; the token-weighted mean of the sources' losses
is TorchTitan's loss over all targets. (Through the real trainer: integration/test_source_loss_training.py.)"""

from __future__ import annotations

import pytest
import torch
from torchtitan.components.loss import IGNORE_INDEX, ChunkedLossWrapper, CrossEntropyLoss, MSELoss

from zephon_titan.titan.source_loss import (
    SourceCrossEntropyLoss,
    encode_labels,
    one_call_per_source,
    per_token_cross_entropy,
    source_recorder,
    source_token_counts,
    with_source_loss,
)

SOURCES = 7


def _batch(seed: int = 0, vocab: int = 97) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits [3, 40, vocab], labels with ignored targets, the source of each input (-1: padding)."""
    g = torch.Generator().manual_seed(seed)
    pred = torch.randn(3, 40, vocab, generator=g) * 3
    labels = torch.randint(0, vocab, (3, 40), generator=g)
    sources = torch.randint(0, 5, (3, 40), generator=g)
    labels[torch.rand(3, 40, generator=g) < 0.15] = IGNORE_INDEX  # a document's last token
    padding = torch.rand(3, 40, generator=g) < 0.1
    labels[padding], sources[padding] = IGNORE_INDEX, -1
    sources[0, :3] = 5  # a source whose targets are all ignored (and source 6 with none)
    labels[0, :3] = IGNORE_INDEX
    return pred, labels, sources


def _recorded(loss_fn, pred, labels, sources) -> tuple[torch.Tensor, list[float]]:
    """One call of `loss_fn` (labels with their sources) recording into a fresh tensor: (its loss, the sums)."""
    recorder = source_recorder(loss_fn)
    assert recorder is not None
    recorder.recording = sums = torch.zeros(SOURCES, dtype=torch.float64)
    try:
        loss, _ = loss_fn(pred, encode_labels(labels, sources))
    finally:
        recorder.recording = None
    return loss, sums.tolist()


def test_one_pass_equals_one_loss_call_per_source():
    stock = CrossEntropyLoss.Config().build()
    loss_fn = with_source_loss(CrossEntropyLoss.Config()).build()
    assert type(loss_fn) is SourceCrossEntropyLoss
    pred, labels, sources = _batch()
    loss, got = _recorded(loss_fn, pred, labels, sources)
    reference = one_call_per_source(stock, pred, labels, sources, SOURCES).tolist()
    assert got == pytest.approx(reference, rel=1e-6)
    assert got[5] == got[6] == 0.0 and min(got[:5]) > 0
    # TorchTitan's loss comes back unchanged, bit for bit; without recording it is TorchTitan's loss.
    assert torch.equal(loss, stock(pred, labels)[0]) and torch.equal(loss_fn(pred, labels)[0], loss)
    counts = source_token_counts(labels, sources, SOURCES).tolist()
    assert counts == [int(((sources == s) & (labels != IGNORE_INDEX)).sum()) for s in range(SOURCES)]
    # Their token-weighted mean is TorchTitan's loss over every target.
    assert sum(got) / sum(counts) == pytest.approx(float(loss) / int((labels != IGNORE_INDEX).sum()), rel=1e-6)
    # Negative control: the same tokens credited to other sources give other numbers.
    swapped = torch.where(sources >= 0, (sources + 1) % 5, sources)
    assert _recorded(loss_fn, pred, labels, swapped)[1] != pytest.approx(reference, rel=1e-3)


def test_through_torchtitans_chunked_loss():
    """The debug model's loss: ChunkedLossWrapper calls the cross-entropy once per chunk of the sequence."""
    torch.manual_seed(0)
    lm_head = torch.nn.Linear(16, 97, bias=False)
    hidden = torch.randn(3, 40, 16)
    _, labels, sources = _batch(3)
    config = ChunkedLossWrapper.Config(num_chunks=4)
    stock, chunked = config.build(), with_source_loss(ChunkedLossWrapper.Config(num_chunks=4)).build()
    assert type(chunked.loss_fn) is SourceCrossEntropyLoss and type(stock.loss_fn) is CrossEntropyLoss
    for loss_fn in (stock, chunked):
        loss_fn.set_lm_head(lm_head)
    with torch.no_grad():  # as the validator calls it
        loss, got = _recorded(chunked, hidden, labels, sources)
        reference = one_call_per_source(stock, hidden, labels, sources, SOURCES).tolist()
        assert got == pytest.approx(reference, rel=1e-6)
        assert torch.equal(loss, stock(hidden, labels)[0])
    swapped = torch.where(sources >= 0, (sources + 2) % 5, sources)
    with torch.no_grad():
        assert _recorded(chunked, hidden, labels, swapped)[1] != pytest.approx(reference, rel=1e-3)


def test_the_per_token_loss_is_torchtitans_loss_per_token():
    loss_fn = CrossEntropyLoss.Config().build()
    pred, labels, _ = _batch(1)
    per_token = per_token_cross_entropy(pred, labels, None)
    assert per_token is not None and per_token.shape == (3 * 40,)
    assert float(per_token.sum()) == pytest.approx(float(loss_fn(pred, labels)[0]), rel=1e-6)
    assert bool((per_token[labels.flatten() == IGNORE_INDEX] == 0).all())
    i = int((labels.flatten() != IGNORE_INDEX).nonzero()[0])  # one target, by hand
    logits = pred.flatten(0, 1)[i].double()
    assert float(per_token[i]) == pytest.approx(float(logits.logsumexp(0) - logits[labels.flatten()[i]]), rel=1e-5)


def test_other_losses_are_left_as_they_are():
    mse = MSELoss.Config()
    assert with_source_loss(mse) is mse and source_recorder(mse.build()) is None
    chunked_mse = ChunkedLossWrapper.Config(loss_fn=MSELoss.Config())
    assert type(with_source_loss(chunked_mse).loss_fn) is MSELoss.Config
    # A vocabulary size set on the job's loss stays.
    assert with_source_loss(CrossEntropyLoss.Config(global_vocab_size=512)).global_vocab_size == 512
