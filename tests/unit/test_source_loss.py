"""The loss of each source from one pass (titan/source_loss.py) equals the validator's former computation, one
call of TorchTitan's CrossEntropyLoss per source, on the same logits; their token-weighted mean is TorchTitan's
loss over all targets."""

from __future__ import annotations

import pytest
import torch
from torchtitan.components.loss import IGNORE_INDEX, CrossEntropyLoss

from zephon_titan.titan.source_loss import per_token_cross_entropy, source_loss_sums, source_token_counts

SOURCES = 7


def _batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits [3, 41, 97], labels with ignored targets, the source of each input (-1: padding, labels ignored)."""
    g = torch.Generator().manual_seed(seed)
    pred = torch.randn(3, 41, 97, generator=g) * 3
    labels = torch.randint(0, 97, (3, 41), generator=g)
    sources = torch.randint(0, SOURCES, (3, 41), generator=g)
    labels[torch.rand(3, 41, generator=g) < 0.15] = IGNORE_INDEX  # a document's last token
    padding = torch.rand(3, 41, generator=g) < 0.1
    labels[padding], sources[padding] = IGNORE_INDEX, -1
    sources[sources >= 5] = 0
    sources[0, :3] = 5  # a source with tokens whose labels are all ignored (and source 6 with none)
    labels[0, :3] = IGNORE_INDEX
    return pred, labels, sources


def _one_call_per_source(loss_fn, pred, labels, sources) -> list[float]:
    """The validator's former way: TorchTitan's loss once per source, the other sources' labels ignored."""
    out = []
    for s in range(SOURCES):
        loss_sum, _ = loss_fn(pred, torch.where(sources == s, labels, IGNORE_INDEX))
        out.append(float(loss_sum.detach().to(torch.float64)))
    return out


def test_one_pass_equals_one_loss_call_per_source():
    loss_fn = CrossEntropyLoss.Config().build()
    pred, labels, sources = _batch()
    got = source_loss_sums(pred, labels, sources, SOURCES, loss_fn).tolist()
    reference = _one_call_per_source(loss_fn, pred, labels, sources)
    assert got == pytest.approx(reference, rel=1e-6)
    assert got[5] == got[6] == 0.0 and min(got[:5]) > 0
    counts = source_token_counts(labels, sources, SOURCES).tolist()
    assert counts == [int(((sources == s) & (labels != IGNORE_INDEX)).sum()) for s in range(SOURCES)]
    # Their token-weighted mean is TorchTitan's loss over every target.
    overall, _ = loss_fn(pred, labels)
    assert sum(got) / sum(counts) == pytest.approx(float(overall) / int((labels != IGNORE_INDEX).sum()), rel=1e-6)
    # Negative control: the same tokens credited to other sources give other numbers.
    swapped = torch.where(sources >= 0, (sources + 1) % 5, sources)
    assert source_loss_sums(pred, labels, swapped, SOURCES, loss_fn).tolist() != pytest.approx(reference, rel=1e-3)


def test_the_per_token_loss_is_torchtitans_loss_per_token():
    loss_fn = CrossEntropyLoss.Config().build()
    pred, labels, _ = _batch(1)
    per_token = per_token_cross_entropy(pred, labels, loss_fn)
    assert per_token is not None and per_token.shape == (3 * 41,)
    assert float(per_token.sum()) == pytest.approx(float(loss_fn(pred, labels)[0]), rel=1e-6)
    assert bool((per_token[labels.flatten() == IGNORE_INDEX] == 0).all())
    i = int((labels.flatten() != IGNORE_INDEX).nonzero()[0])  # one target, by hand
    logits = pred.flatten(0, 1)[i].double()
    assert float(per_token[i]) == pytest.approx(float(logits.logsumexp(0) - logits[labels.flatten()[i]]), rel=1e-5)


class _OtherLoss(CrossEntropyLoss):
    """A loss this module does not take per token: it is called once per source, as before."""


def test_another_loss_is_called_once_per_source():
    loss_fn = CrossEntropyLoss.Config().build()
    other = object.__new__(_OtherLoss)
    other.__dict__.update(loss_fn.__dict__)
    pred, labels, sources = _batch(2)
    assert per_token_cross_entropy(pred, labels, other) is None
    got = source_loss_sums(pred, labels, sources, SOURCES, other).tolist()
    assert got == pytest.approx(_one_call_per_source(loss_fn, pred, labels, sources), rel=1e-6)
