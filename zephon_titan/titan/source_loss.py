"""The loss of each source from one pass: TorchTitan's per-token cross-entropy, summed by source.

Each target counts for the source of its input token (`sources`, -1 for padding); a target whose label is
TorchTitan's IGNORE_INDEX counts for none. Labels carry their source in their high bits (`encode_labels`), so
they travel through CP sharding and TorchTitan's chunked loss like plain labels.

`SourceCrossEntropyLoss` is TorchTitan's CrossEntropyLoss (the jobs' loss, alone or inside ChunkedLossWrapper,
is made this class by ZephonTrainer's config): with `recording` unset it is exactly TorchTitan's loss; with a
tensor there, it takes the labels' sources off, returns TorchTitan's loss of the plain labels unchanged, and adds
to `recording`, per source, the sum of its targets' losses from one per-token loss (`reduction="none"`, the same
computation: float32 logits, ignore_index, the vocab-parallel path under loss parallelism) and one index_add by
source - the numbers one loss call per source would give, without one loss call per source.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Shard
from torchtitan.components.loss import (
    IGNORE_INDEX,
    ChunkedLossWrapper,
    CrossEntropyLoss,
    _LossParallelCrossEntropy,
)
from torchtitan.config import CompileConfig
from torchtitan.distributed.spmd_types import current_spmd_mesh, spmd_mesh_size
from torchtitan.distributed.utils import get_spmd_backend

_LABEL_BITS = 32  # labels (token ids) and their source travel as one int64


def encode_labels(labels: torch.Tensor, sources: torch.Tensor) -> torch.Tensor:
    """Labels and their sources as one int64 tensor, so CP sharding moves both alike (-100 stays -100, and
    counts as ignored wherever TorchTitan counts valid targets)."""
    return torch.where(labels == IGNORE_INDEX, labels, labels + (sources << _LABEL_BITS))


def decode_labels(combined: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    ignored = combined == IGNORE_INDEX
    sources = torch.where(ignored, -1, combined >> _LABEL_BITS)
    labels = torch.where(ignored, IGNORE_INDEX, combined & ((1 << _LABEL_BITS) - 1))
    return labels, sources


def per_token_cross_entropy(pred: Any, labels: torch.Tensor, global_vocab_size: int | None) -> torch.Tensor | None:
    """The per-token loss [B*S] (0 where ignored) that TorchTitan's cross_entropy_loss sums, or None where its
    per-token path does not apply (DTensor labels)."""
    if isinstance(labels, DTensor):
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
        return _LossParallelCrossEntropy.apply(flat, flat_labels, group, global_vocab_size, "none")
    return F.cross_entropy(pred.flatten(0, 1).float(), flat_labels, reduction="none", ignore_index=IGNORE_INDEX)


def sums_by_source(per_token: torch.Tensor, labels: torch.Tensor, sources: torch.Tensor, num_sources: int):
    """Per source, the float64 sum of `per_token` over its targets (labels != IGNORE_INDEX, sources >= 0). No
    host synchronization (no data-dependent shapes): it may run inside a CUDA graph."""
    flat_sources = sources.flatten()
    counted = (flat_sources >= 0) & (labels.flatten() != IGNORE_INDEX)
    bins = torch.where(counted, flat_sources, num_sources)  # the targets of no source: one bin more, dropped
    values = torch.where(counted, per_token.detach().to(torch.float64), 0.0)
    # index_add_ has a deterministic CUDA kernel (bincount with weights has none).
    sums = torch.zeros(num_sources + 1, dtype=torch.float64, device=per_token.device)
    return sums.index_add_(0, bins, values)[:num_sources]


def source_token_counts(labels: torch.Tensor, sources: torch.Tensor, num_sources: int) -> torch.Tensor:
    """Per source, the number of its targets (labels != IGNORE_INDEX, sources >= 0), int64."""
    counted = (sources >= 0) & (labels != IGNORE_INDEX)
    return torch.bincount(sources[counted], minlength=num_sources)[:num_sources]


def one_call_per_source(
    loss: Callable[..., Any], pred: Any, labels: torch.Tensor, sources: torch.Tensor, num_sources: int
) -> torch.Tensor:
    """Per source, the float64 loss sum of one call of `loss` with the other sources' labels ignored (for a
    loss that has no per-token path)."""
    sums = torch.zeros(num_sources, dtype=torch.float64, device=sources.device)
    for s in range(num_sources):
        loss_sum, _ = loss(pred, torch.where(sources == s, labels, IGNORE_INDEX))
        sums[s] = loss_sum.detach().to(torch.float64)
    return sums


class SourceCrossEntropyLoss(CrossEntropyLoss):
    """TorchTitan's CrossEntropyLoss that, while `recording` holds a float64 tensor (one entry per source),
    adds each call's per-source loss sums to it; its labels then carry their sources (encode_labels)."""

    @dataclass(kw_only=True, slots=True)
    class Config(CrossEntropyLoss.Config):
        pass

    def __init__(self, config: Config, *, compile_config: CompileConfig | None = None):
        CrossEntropyLoss.__init__(self, config, compile_config=compile_config)
        self.recording: torch.Tensor | None = None

    def __call__(
        self, pred: Any, labels: torch.Tensor, global_valid_tokens: torch.Tensor | None = None, **kwargs: Any
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if self.recording is None:
            return CrossEntropyLoss.__call__(self, pred, labels, global_valid_tokens, **kwargs)
        labels, sources = decode_labels(labels)
        out = CrossEntropyLoss.__call__(self, pred, labels, global_valid_tokens, **kwargs)
        with torch.no_grad():
            per_token = per_token_cross_entropy(pred.detach(), labels, self.global_vocab_size)
            if per_token is None:
                plain = lambda p, t: CrossEntropyLoss.__call__(self, p, t)  # noqa: E731
                self.recording += one_call_per_source(plain, pred.detach(), labels, sources, len(self.recording))
            else:
                self.recording += sums_by_source(per_token, labels, sources, len(self.recording))
        return out


def with_source_loss(config: Any) -> Any:
    """A job's loss config with TorchTitan's CrossEntropyLoss (alone or in ChunkedLossWrapper) made
    SourceCrossEntropyLoss, the same settings; any other loss as it is."""

    def source(ce: Any) -> Any:
        if type(ce) is not CrossEntropyLoss.Config:
            return ce
        out = SourceCrossEntropyLoss.Config()
        for f in fields(CrossEntropyLoss.Config):
            setattr(out, f.name, getattr(ce, f.name))
        return out

    if type(config) is ChunkedLossWrapper.Config:
        config.loss_fn = source(config.loss_fn)
        return config
    return source(config)


def source_recorder(loss_fn: Any) -> SourceCrossEntropyLoss | None:
    """The SourceCrossEntropyLoss that `loss_fn` calls once per call (itself, or inside ChunkedLossWrapper)."""
    if isinstance(loss_fn, ChunkedLossWrapper):
        loss_fn = loss_fn.loss_fn
    return loss_fn if isinstance(loss_fn, SourceCrossEntropyLoss) else None
