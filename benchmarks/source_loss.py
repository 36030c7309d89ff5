"""The validator's per-source losses: one loss call per source (before) against one pass (titan/source_loss.py).

    python benchmarks/source_loss.py [--sources 50] [--vocab 128256] [--batch 2] [--seq-len 512] [--repeats 3]

TorchTitan's llama3 debug model (dim 256, 6 layers, SDPA attention, on CPU), its vocabulary resized to
`--vocab` ids (128,256: Llama 3's) as a stand-in for a real model's output layer, in eval mode under
no_grad like a validation microbatch. Each repeat times, on the same microbatch, side by side: the model's
forward, the former per-source loss (TorchTitan's CrossEntropyLoss once per source, the other sources'
labels ignored) and the one-pass loss (one per-token cross-entropy + index_add by source). The per-source
sums of both are compared (rel 1e-6). Figures: the median of `--repeats`; ratios against the forward.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torchtitan.components.loss import IGNORE_INDEX, CrossEntropyLoss
from torchtitan.models.llama3 import model_registry

from zephon_titan.cpu import use_sdpa_attention
from zephon_titan.titan.source_loss import source_loss_sums


def debug_model(vocab: int) -> torch.nn.Module:
    spec = model_registry("debugmodel")
    model_config = spec.model
    model_config.vocab_size = vocab
    model_config.tok_embeddings.num_embeddings = vocab
    model_config.lm_head.out_features = vocab

    class _Holder:  # use_sdpa_attention takes a trainer config (config.model_spec.model)
        model_spec = spec

    use_sdpa_attention(_Holder)
    torch.manual_seed(0)
    model = model_config.build()
    model.init_states(buffer_device=None)
    return model.eval()


def one_call_per_source(loss_fn, pred, labels, sources, n: int) -> torch.Tensor:
    """The validator's former loop."""
    sums = torch.zeros(n, dtype=torch.float64)
    for s in range(n):
        loss_sum, _ = loss_fn(pred, torch.where(sources == s, labels, IGNORE_INDEX))
        sums[s] += loss_sum.detach().to(torch.float64)
    return sums


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sources", type=int, default=50)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(2)
    model = debug_model(args.vocab)
    loss_fn = CrossEntropyLoss.Config().build()
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq_len + 1), generator=g)
    inputs, labels = tokens[:, :-1], tokens[:, 1:].clone()
    labels[:, ::97] = IGNORE_INDEX  # document ends
    sources = torch.randint(0, args.sources, labels.shape, generator=g)
    positions = torch.arange(args.seq_len).repeat(args.batch, 1)
    times: dict[str, list[float]] = {"forward": [], "per source": [], "one pass": []}
    with torch.no_grad():
        for _ in range(args.repeats + 1):  # the first is a warm-up, not counted
            t0 = time.perf_counter()
            pred = model(inputs, positions=positions)
            t1 = time.perf_counter()
            before = one_call_per_source(loss_fn, pred, labels, sources, args.sources)
            t2 = time.perf_counter()
            after = source_loss_sums(pred, labels, sources, args.sources, loss_fn)
            t3 = time.perf_counter()
            for name, t in zip(times, (t1 - t0, t2 - t1, t3 - t2)):
                times[name].append(t)
            torch.testing.assert_close(after, before, rtol=1e-6, atol=0)
    med = {name: statistics.median(ts[1:]) for name, ts in times.items()}
    print(
        f"debug model (dim 256, 6 layers), vocab {args.vocab:,}, {args.batch} x {args.seq_len} tokens, "
        f"{args.sources} sources, {torch.get_num_threads()} threads, median of {args.repeats}:"
    )
    print(f"  forward             {med['forward']:8.3f} s")
    for name in ("per source", "one pass"):
        print(f"  loss, {name:<12} {med[name]:8.3f} s  ({med[name] / med['forward']:.2f}x the forward)")
    print(f"  one pass is {med['per source'] / med['one pass']:.1f}x faster; per-source sums equal (rel 1e-6)")


if __name__ == "__main__":
    main()
