"""The loss of each source from one pass: TorchTitan's per-token cross-entropy, summed by source.

Each target counts for the source of its input token (`sources`, -1 for padding); a target whose label is
TorchTitan's IGNORE_INDEX counts for none. `source_loss_sums` gives, per source, the sum of the targets'
losses that TorchTitan's CrossEntropyLoss would give for that source's targets alone (its `reduction="sum"`),
from one per-token loss (`reduction="none"`, the same computation: float32 logits, ignore_index, the
vocab-parallel path under loss parallelism) and one scatter-add by source, instead of a loss call per source.
A loss this module does not know how to take per token (another loss class, DTensor labels) is called once
per source, as before.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Shard
from torchtitan.components.loss import IGNORE_INDEX, CrossEntropyLoss, _LossParallelCrossEntropy
from torchtitan.distributed.spmd_types import current_spmd_mesh, spmd_mesh_size
from torchtitan.distributed.utils import get_spmd_backend


def per_token_cross_entropy(pred: Any, labels: torch.Tensor, loss_fn: Any) -> torch.Tensor | None:
    """The per-token loss [B*S] (0 where ignored) that TorchTitan's CrossEntropyLoss sums, or None where its
    per-token path does not apply (another loss, DTensor labels)."""
    if type(loss_fn) is not CrossEntropyLoss or isinstance(labels, DTensor):
        return None
    flat_labels = labels.flatten(0, 1)
    if isinstance(pred, DTensor):  # as torchtitan.components.loss.cross_entropy_loss, reduction "none"
        if get_spmd_backend() != "partial_dtensor" or pred.placements != (Shard(pred.ndim - 1),):
            return None
        group = pred.device_mesh.get_group("tp")
        local = pred.to_local().flatten(0, 1).float()
        return _LossParallelCrossEntropy.apply(local, flat_labels, group, pred.shape[-1], "none")
    if get_spmd_backend() == "spmd_types" and spmd_mesh_size("tp") > 1:
        group = current_spmd_mesh().get_group("tp")  # type: ignore[union-attr]
        flat = pred.flatten(0, 1).float()
        return _LossParallelCrossEntropy.apply(flat, flat_labels, group, loss_fn.global_vocab_size, "none")
    return F.cross_entropy(pred.flatten(0, 1).float(), flat_labels, reduction="none", ignore_index=IGNORE_INDEX)


def source_loss_sums(
    pred: Any, labels: torch.Tensor, sources: torch.Tensor, num_sources: int, loss_fn: Any
) -> torch.Tensor:
    """Per source, the float64 sum of the losses of its targets (labels != IGNORE_INDEX, sources >= 0)."""
    sums = torch.zeros(num_sources, dtype=torch.float64, device=sources.device)
    per_token = per_token_cross_entropy(pred, labels, loss_fn)
    if per_token is None:
        for s in range(num_sources):
            loss_sum, _ = loss_fn(pred, torch.where(sources == s, labels, IGNORE_INDEX))
            sums[s] = loss_sum.detach().to(torch.float64)
        return sums
    flat_sources = sources.flatten()
    counted = (flat_sources >= 0) & (labels.flatten() != IGNORE_INDEX)
    # index_add_ has a deterministic CUDA kernel (bincount with weights has none).
    return sums.index_add_(0, flat_sources[counted], per_token.detach()[counted].to(torch.float64))


def source_token_counts(labels: torch.Tensor, sources: torch.Tensor, num_sources: int) -> torch.Tensor:
    """Per source, the number of its targets (labels != IGNORE_INDEX, sources >= 0), int64."""
    counted = (sources >= 0) & (labels != IGNORE_INDEX)
    return torch.bincount(sources[counted], minlength=num_sources)[:num_sources]
