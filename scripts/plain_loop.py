"""gpu_check's fallback when TorchTitan's trainer cannot run on the machine's torch (TorchTitan 0.3.0 needs
torch 2.14; a GPU image may carry an older one, and a CUDA torch is too large to bring along).

The same measurement without the trainer: our loader, built as the trainer builds it (the job's [dataloader]
table, TorchTitan's HuggingFaceTokenizer, `ZephonDataLoader.Config.build(...)`), feeds a Llama-3 1B-shaped
model (TorchTitan's 1B flavor: dim 2048, 16 layers, 32 heads, 8 KV heads, FFN 8192, tied embeddings) in a plain
PyTorch loop: bf16 autocast, fused AdamW, gradient accumulation over the step's microbatches. Attention is
SDPA, causal over the row (what TorchTitan's SDPA path does); RoPE uses the loader's per-document positions.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class Shape:
    dim: int = 2048
    n_layers: int = 16
    n_heads: int = 32
    n_kv_heads: int = 8
    ffn_dim: int = 8192
    vocab_size: int = 2048
    rope_theta: float = 500000.0


# The CPU dry run: the same code with a model small enough for two cores.
TINY = Shape(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128)


class Block(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = s.n_heads, s.n_kv_heads, s.dim // s.n_heads
        self.attention_norm = nn.RMSNorm(s.dim)
        self.wqkv = nn.Linear(s.dim, (s.n_heads + 2 * s.n_kv_heads) * self.head_dim, bias=False)
        self.wo = nn.Linear(s.dim, s.dim, bias=False)
        self.ffn_norm = nn.RMSNorm(s.dim)
        self.w13 = nn.Linear(s.dim, 2 * s.ffn_dim, bias=False)
        self.w2 = nn.Linear(s.ffn_dim, s.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.wqkv(self.attention_norm(x)).split(
            [self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim, self.n_kv_heads * self.head_dim], -1
        )
        q, k, v = (z.view(b, t, -1, self.head_dim).transpose(1, 2) for z in (q, k, v))
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        k, v = (z.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1) for z in (k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(attended.transpose(1, 2).reshape(b, t, -1))
        gate, up = self.w13(self.ffn_norm(x)).chunk(2, -1)
        return x + self.w2(F.silu(gate) * up)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).type_as(x)


class Llama(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.embeddings = nn.Embedding(s.vocab_size, s.dim)
        nn.init.normal_(self.embeddings.weight, std=0.02)  # it is the output head too: keep the first logits small
        self.layers = nn.ModuleList(Block(s) for _ in range(s.n_layers))
        self.norm = nn.RMSNorm(s.dim)
        head_dim = s.dim // s.n_heads
        self.register_buffer(
            "inv_freq", 1.0 / s.rope_theta ** (torch.arange(0, head_dim, 2).float() / head_dim), persistent=False
        )

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        angles = (positions.float()[..., None] * self.inv_freq)[:, None]  # [B, 1, S, head_dim / 2]
        cos, sin = angles.cos(), angles.sin()
        x = self.embeddings(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x) @ self.embeddings.weight.t()  # tied output head, as the 1B flavor


def train(batches: Iterator, steps: int, microbatches: int, shape: Shape, device: torch.device) -> dict:
    """`steps` optimizer steps of `microbatches` microbatches each; per step, its time and the time spent
    waiting for the next microbatch (as TorchTitan's trainer measures in gpu_check)."""
    torch.manual_seed(0)
    model = Llama(shape).to(device)
    fused = device.type == "cuda"
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=fused)
    step_seconds, wait_seconds, losses = [], [], []
    first_batch = None
    for _ in range(steps):
        started, waited = time.perf_counter(), 0.0
        for _ in range(microbatches):
            fetch = time.perf_counter()
            inputs, labels = next(batches)
            waited += time.perf_counter() - fetch
            first_batch = first_batch or (inputs, labels)
            tokens = inputs["input"].to(device, non_blocking=True)
            positions = inputs["positions"].to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.bfloat16):
                logits = model(tokens, positions)
            loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100)
            (loss / microbatches).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())  # also waits for the device, so the step's time is its own
        step_seconds.append(time.perf_counter() - started)
        wait_seconds.append(waited)
        print(f"plain_loop: step {len(step_seconds)} {step_seconds[-1]:.4f} s, data wait {waited:.4f} s, "
              f"loss {losses[-1]:.3f}", flush=True)  # fmt: skip
    if not all(math.isfinite(v) for v in losses):
        raise RuntimeError(f"the loss is not finite: {losses}")
    return {"step_seconds": step_seconds, "wait_seconds": wait_seconds, "first_batch": first_batch}
