"""Tokenizer backends: who computes the ids of a tokenizer.json, never which ids.

`tokenizers` (Hugging Face) is the reference. `fastokens` (the `.[fast]` extra) is a Rust BPE
that loads the same tokenizer.json and gives the same ids several times faster. The backend
is a pure speed knob (`[dataloader] tokenizer_backend`): it is absent from the fingerprint,
and a run saved with one resumes with the other. That holds because the fast backend is
only used after it has matched the reference
  1. on a fixed probe set (the tokenizer's special tokens, unicode, whitespace runs, long
     words, control characters), when it is chosen; and
  2. on the first documents each process tokenizes (`VERIFY_DOCUMENTS`); a mismatch there
     switches that process to the reference for good, with one warning, and the ids handed
     out are always the reference's.
`zephon-titan validate --check-tokenizer` compares the two over a whole corpus.

Both backends return one flat id buffer and offsets (document i is ids[offsets[i]:offsets[i+1]]),
so no per-token Python object is made on the fast path.
"""

from __future__ import annotations

import logging
import os
from typing import Protocol

import numpy as np
from tokenizers import Tokenizer

# Documents each process checks against the reference before trusting the fast backend alone.
VERIFY_DOCUMENTS = 256

log = logging.getLogger("zephon_titan")


class Backend(Protocol):
    name: str

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(ids, offsets): all texts' ids concatenated, and len(texts) + 1 offsets into them."""
        ...


class ReferenceBackend:
    """Hugging Face `tokenizers`: the ids every other backend must reproduce."""

    name = "tokenizers"

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        encodings = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False) if texts else []
        lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
        offsets = np.zeros(len(encodings) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        ids = np.fromiter((i for e in encodings for i in e.ids), dtype=np.uint32, count=int(offsets[-1]))
        return ids, offsets


class FastBackend:
    """fastokens over the same tokenizer.json (added and special tokens included)."""

    name = "fastokens"

    def __init__(self, tokenizer_json: str):
        import fastokens

        self.tokenizer = fastokens.Tokenizer.from_json_str(tokenizer_json)

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        if not texts:
            return np.zeros(0, dtype=np.uint32), np.zeros(1, dtype=np.int64)
        ids, offsets = self.tokenizer.encode_batch_flat(texts, add_special_tokens=False)
        return np.frombuffer(ids, dtype="<u4"), np.frombuffer(offsets, dtype="<u8").astype(np.int64)


def probe_texts(tokenizer: Tokenizer) -> list[str]:
    """Texts on which BPE implementations tend to differ, plus this tokenizer's own special tokens."""
    specials = [t.content for t in tokenizer.get_added_tokens_decoder().values()]
    glued = "".join(f"x{s}y {s}" for s in specials)
    return [
        "",
        " ",
        "Hello, world! It's a test; don't PANIC: we'll see.",
        "   leading and trailing   ",
        "tabs\tand\nnewlines\r\nand\n\n\n\nruns" + " " * 100 + "\t" * 17 + "\n" * 9,
        "naïve café – “quotes” — ‘single’ … ½ ² €100 ¥5",
        "日本語のテキストと中文文本，한국어 텍스트, العربية, עברית, ไทย, हिन्दी",
        "emoji 👩‍👩‍👧‍👦 🇫🇷 👍🏽 ❤️ 🧪",
        "e\u0301 a\u0308 combining\u0327 marks\u200b zero\u200dwidth \ufeffbom",
        "control \x00\x01\x07\x1b[31m\x7f characters",
        "0123456789" * 30 + " 3.14159 1e-10 0x1F",
        "def f(x):\n    return {'a': [1, 2, 3]}  # code\n",
        "a" * 5000,
        "supercalifragilisticexpialidocious" * 40,
        " ".join(f"w{i}" for i in range(400)),
        glued,
        *specials,
    ]


def first_difference(a: Backend, b: Backend, texts: list[str]) -> int | None:
    """Index of the first text whose ids differ between the two backends, or None."""
    ids_a, off_a = a.encode_flat(texts)
    ids_b, off_b = b.encode_flat(texts)
    if np.array_equal(off_a, off_b) and np.array_equal(ids_a, ids_b):
        return None
    for i in range(len(texts)):
        if not np.array_equal(ids_a[off_a[i] : off_a[i + 1]], ids_b[off_b[i] : off_b[i + 1]]):
            return i
    return None


def load_fast(tokenizer_json: str) -> FastBackend | Exception:
    """fastokens over `tokenizer_json`, or why it cannot load it (ImportError: it is not installed)."""
    try:
        return FastBackend(tokenizer_json)
    except Exception as e:  # fastokens refuses a tokenizer.json it does not support
        return e


def select_backend(
    tokenizer: Tokenizer, setting: str, announce: bool = True, loaded: FastBackend | Exception | None = None
) -> tuple[Backend, str]:
    """The backend for `setting` and why, after the probe check. `loaded`: load_fast()'s result when
    it was loaded already (from the reference's tokenizer.json, or in tests another one)."""
    reference = ReferenceBackend(tokenizer)
    if setting == "tokenizers":
        return reference, "[dataloader] tokenizer_backend = tokenizers"
    fast = loaded if loaded is not None else load_fast(tokenizer.to_str())
    if isinstance(fast, ImportError):
        reason = "fastokens is not installed (pip install 'zephon-titan[fast]')"
        return _fall_back(reference, setting, reason, announce)
    if isinstance(fast, Exception):
        first_line = (str(fast).splitlines() or [type(fast).__name__])[0]
        return _fall_back(reference, setting, f"fastokens cannot load this tokenizer ({first_line})", announce)
    texts = probe_texts(tokenizer)
    try:
        bad = first_difference(reference, fast, texts)
    except Exception as e:  # e.g. "byte 0x20 has no token in vocabulary": it cannot encode every text
        first_line = (str(e).splitlines() or [type(e).__name__])[0]
        return _fall_back(reference, setting, f"fastokens cannot encode with this tokenizer ({first_line})", announce)
    if bad is not None:
        reason = f"fastokens gives other ids than tokenizers for the probe text {texts[bad][:40]!r}"
        return _fall_back(reference, setting, reason, announce)
    return fast, f"fastokens (matches tokenizers on {len(texts)} probe texts)"


def _fall_back(reference: Backend, setting: str, reason: str, announce: bool) -> tuple[Backend, str]:
    if setting == "fastokens":
        from zephon_titan.errors import ConfigError

        raise ConfigError(
            f"[dataloader] tokenizer_backend = fastokens, but {reason}; "
            'use tokenizer_backend = "auto" (falls back to tokenizers) or "tokenizers"'
        )
    if announce:
        log.info("zephon_titan: tokenizing with tokenizers, not fastokens: %s", reason)
    return reference, f"tokenizers ({reason})"


def default_threads(num_workers: int) -> int:
    """Tokenizer threads per producing process: the cores this process may use, shared among the
    node's ranks (torchrun's LOCAL_WORLD_SIZE) and this rank's workers (0 workers: the training
    process tokenizes). A worker gets at least 2: it alternates between tokenizing and packing, and
    a second thread uses the core it leaves idle meanwhile (measured on 2 cores with 2 workers:
    1 thread each is 23 % slower), so the pools oversubscribe the cores at most twice."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    ranks = max(int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1), 1)
    share = max(1, cores // (ranks * max(num_workers, 1)))
    return share if num_workers == 0 else max(2, share)


def limit_threads(threads: int) -> None:
    """Size the tokenizers' thread pools (Rayon, read when first used), unless the user has."""
    os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
