"""The loss of each source: its cost in validation (before: one loss call per source) and in a training step.

    python benchmarks/source_loss.py validation [--sources 50] [--vocab 128256] [--loss chunked|plain] ...
    python benchmarks/source_loss.py training [--steps 10]

TorchTitan's llama3 debug model (dim 256, 6 layers, SDPA attention) on CPU, wired as TorchTitan's trainer wires
it: its loss is the recipe's ChunkedLossWrapper over the cross-entropy (the model skips its output layer, the
wrapper applies it chunk by chunk), or `--loss plain`, TorchTitan's CrossEntropyLoss over the full logits.

- validation: the vocabulary resized to `--vocab` ids (128,256: Llama 3's) as the stand-in for a real
  output layer, one microbatch under no_grad. Each repeat times, on the same forward output, side by side:
  the former per-source loss (TorchTitan's loss once per source, the other sources' labels ignored) and the
  one pass (one call of the loss, its per-token loss summed by source); their sums are compared (rel 1e-6).
- training: the CPU debug job's shapes (4 x 128 tokens a microbatch, 2,048 ids, 2 sources), forward +
  backward with TorchTitan's loss as it is against the loss recording each source, alternated step by step
  (the optimizer step is left out, so the ratio is an upper bound of the cost in a whole step).

Figures: medians, and minima for training (the first repeat of each is a warm-up, not counted).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torchtitan.components.loss import IGNORE_INDEX, ChunkedLossWrapper, CrossEntropyLoss
from torchtitan.models.llama3 import model_registry

from zephon_titan.cpu import use_sdpa_attention
from zephon_titan.titan.source_loss import (
    decode_labels,
    encode_labels,
    one_call_per_source,
    per_token_cross_entropy,
    source_recorder,
    sums_by_source,
    with_source_loss,
)


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
    return model


def losses(model: torch.nn.Module, kind: str) -> tuple:
    """(TorchTitan's loss, the same loss recording each source), wired to `model` as TorchTitan's trainer does."""
    if kind == "plain":
        return CrossEntropyLoss.Config().build(), with_source_loss(CrossEntropyLoss.Config()).build()
    stock, recording = ChunkedLossWrapper.Config().build(), with_source_loss(ChunkedLossWrapper.Config()).build()
    for loss_fn in (stock, recording):
        loss_fn.set_lm_head(model.lm_head)
    model._skip_lm_head = True  # as TorchTitan's trainer does with a ChunkedLossWrapper
    return stock, recording


def microbatch(vocab: int, batch: int, seq_len: int, sources: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (batch, seq_len + 1), generator=g)
    inputs, labels = tokens[:, :-1], tokens[:, 1:].clone()
    labels[:, ::97] = IGNORE_INDEX  # document ends
    source_ids = torch.randint(0, sources, labels.shape, generator=g)
    return inputs, labels, source_ids, torch.arange(seq_len).repeat(batch, 1)


def validation(args: argparse.Namespace) -> None:
    model = debug_model(args.vocab).eval()
    stock, recording = losses(model, args.loss)
    recorder = source_recorder(recording)
    assert recorder is not None
    inputs, labels, sources, positions = microbatch(args.vocab, args.batch, args.seq_len, args.sources)
    times: dict[str, list[float]] = {"forward": [], "per source": [], "one pass": []}
    with torch.no_grad():
        for _ in range(args.repeats + 1):
            t0 = time.perf_counter()
            pred = model(inputs, positions=positions)
            t1 = time.perf_counter()
            before = one_call_per_source(stock, pred, labels, sources, args.sources)
            t2 = time.perf_counter()
            recorder.recording = after = torch.zeros(args.sources, dtype=torch.float64)
            recording(pred, encode_labels(labels, sources))
            recorder.recording = None
            t3 = time.perf_counter()
            for name, t in zip(times, (t1 - t0, t2 - t1, t3 - t2)):
                times[name].append(t)
            torch.testing.assert_close(after, before, rtol=1e-6, atol=0)
    med = {name: statistics.median(ts[1:]) for name, ts in times.items()}
    print(
        f"validation: debug model, {args.loss} loss, vocab {args.vocab:,}, {args.batch} x {args.seq_len} tokens, "
        f"{args.sources} sources, {torch.get_num_threads()} threads, median of {args.repeats}:"
    )
    print(f"  forward (no output layer when chunked) {med['forward']:8.3f} s")
    for name in ("per source", "one pass"):
        print(f"  loss, {name:<12} {med[name]:8.3f} s")
    print(f"  one pass is {med['per source'] / med['one pass']:.1f}x faster; per-source sums equal (rel 1e-6)")


def training(args: argparse.Namespace) -> None:
    model = debug_model(2048).train()
    stock, recording = losses(model, "chunked")
    recorder = source_recorder(recording)
    assert recorder is not None
    inputs, labels, sources, positions = microbatch(2048, 4, 128, 2)
    valid = (labels != IGNORE_INDEX).sum()
    times: dict[str, list[float]] = {"as it is": [], "recording": []}
    for _ in range(args.steps + 1):
        for name, loss_fn in (("as it is", stock), ("recording", recording)):
            model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            if loss_fn is recording:
                recorder.recording = torch.zeros(2, dtype=torch.float64)
                step_labels = encode_labels(labels, sources)
            else:
                step_labels = labels
            loss, _ = loss_fn(model(inputs, positions=positions), step_labels, valid)
            loss.backward()
            recorder.recording = None
            times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(ts[1:]) for name, ts in times.items()}
    low = {name: min(ts[1:]) for name, ts in times.items()}
    print(f"training: debug model, chunked loss, 4 x 128 tokens, 2 sources, forward + backward, {args.steps} steps:")
    for name in times:
        print(f"  loss {name:<10} median {med[name] * 1000:8.1f} ms, min {low[name] * 1000:8.1f} ms")
    print(
        f"  cost of the loss per source: {(med['recording'] / med['as it is'] - 1) * 100:+.2f} % (medians), "
        f"{(low['recording'] / low['as it is'] - 1) * 100:+.2f} % (minima)"
    )
    # The added work alone, timed apart (less noise than the difference of two step times): the labels'
    # sources put in and taken off, and per chunk one per-token loss without gradient summed by source.
    with torch.no_grad():
        hidden = model(inputs, positions=positions)
        chunks = [(model.lm_head(h), t) for h, t in zip(hidden.chunk(8, dim=1), labels.chunk(8, dim=1))]
        added = []
        for _ in range(args.steps + 1):
            t0 = time.perf_counter()
            combined = encode_labels(labels, sources)
            for logits, _ in chunks:
                chunk_labels, chunk_sources = decode_labels(combined[:, : logits.shape[1]])
                per_token = per_token_cross_entropy(logits, chunk_labels, None)
                assert per_token is not None
                sums_by_source(per_token, chunk_labels, chunk_sources, 2)
            added.append(time.perf_counter() - t0)
    extra, extra_low = statistics.median(added[1:]), min(added[1:])
    print(
        f"  the added work alone: median {extra * 1000:.2f} ms, min {extra_low * 1000:.2f} ms a microbatch; "
        f"min {extra_low / low['as it is'] * 100:.2f} % of the fastest forward + backward"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    val = sub.add_parser("validation")
    val.add_argument("--sources", type=int, default=50)
    val.add_argument("--vocab", type=int, default=128256)
    val.add_argument("--loss", choices=("chunked", "plain"), default="chunked")
    val.add_argument("--batch", type=int, default=2)
    val.add_argument("--seq-len", type=int, default=512)
    val.add_argument("--repeats", type=int, default=2)
    train = sub.add_parser("training")
    train.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(2)
    validation(args) if args.what == "validation" else training(args)


if __name__ == "__main__":
    main()
