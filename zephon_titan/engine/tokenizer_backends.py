"""Tokenizer backends: who computes the ids of a tokenizer.json, never which ids.

`tokenizers` (Hugging Face) is the reference. `fastokens` (the `.[fast]` extra) is a Rust BPE
that loads the same tokenizer.json and gives the same ids several times faster. The backend
is a pure speed knob (`[dataloader] tokenizer_backend`): it is absent from the fingerprint,
and a run saved with one resumes with the other.

Which backend computes a document's ids is a pure function of the files and the installed
fastokens version, decided once at load, the same in every rank and worker: never of timing,
worker count or document order. fastokens is used only when
  1. the tokenizer's encoding configuration (normalizer, pre-tokenizer, BPE settings, added-token
     flags; not its vocabulary) is on VERIFIED, compared structurally (`fast_eligibility`): the
     two libraries use different regex engines (Oniguruma, PCRE2) that read some constructs
     differently (`\\h`: a hex digit in one, horizontal whitespace in the other), and no sample of
     documents can prove two engines agree on a pattern nobody checked;
  2. the installed fastokens is the version the list was verified with; and
  3. it matches the reference on a fixed probe set (the tokenizer's special tokens, unicode,
     whitespace runs, long words, control characters).
Anything else uses `tokenizers`, with one line saying why. The first documents each process
encodes are still compared with the reference (`VERIFY_DOCUMENTS`, `VERIFY_CHARS`); a difference there is a
hard error naming the document (engine/source_reader.py), never a silent switch: the rows must not
depend on which process saw the document first.
`zephon-titan validate --check-tokenizer` compares the two over a whole corpus.

Both backends return one flat id buffer and offsets (document i is ids[offsets[i]:offsets[i+1]]),
so no per-token Python object is made on the fast path.
"""

from __future__ import annotations

import json
import logging
import os
import unicodedata
from typing import Any, Protocol

import numpy as np
from tokenizers import Tokenizer

from zephon_titan.engine.cores import usable_cores

# The first documents each process checks against the reference on the fast backend (a safety net: on a
# difference the run stops; the rows never change): up to VERIFY_DOCUMENTS documents, and no more once
# VERIFY_CHARS characters are checked (the document that reaches it is checked whole). The reference
# encodes ~2.5 MB of text per core-second; 256 whole documents of a corpus of long texts took ~2.5 s of
# the first step at 1,024 lanes (issue 28), the character bound keeps it near 0.1 s.
VERIFY_DOCUMENTS = 256
VERIFY_CHARS = 256 << 10

# The fastokens release VERIFIED was checked with (the `.[fast]` extra pins it).
FASTOKENS_VERSION = "0.3.5"

# The pre-tokenizer regexes of the tokenizers on VERIFIED: cl100k's (Llama 3, OLMo-2's dolma2) and
# Qwen2's (cl100k with single digits).
CL100K_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_PATTERN = CL100K_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")


def _split_then_bytes(pattern: str, behavior: str, invert: bool) -> dict[str, Any]:
    split = {"type": "Split", "pattern": {"Regex": pattern}, "behavior": behavior, "invert": invert}
    return {
        "type": "Sequence",
        "pretokenizers": [split, {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}],
    }


# Pre-tokenizers (in canonical form, see _canonical_pre_tokenizer) on which fastokens FASTOKENS_VERSION
# was checked against `tokenizers`, each with every normalizer in VERIFIED_NORMALIZERS and both
# `ignore_merges` settings, on the probe set and ~16 MB of real text (C4, Wikipedia, Gutenberg,
# code; tests/unit/test_tokenizer_backends.py, the `slow` sweep). Splitting with "Isolated" and with
# "Removed" + invert keeps the same pieces.
VERIFIED: dict[str, dict[str, Any]] = {
    "byte-level (GPT-2, GPT-NeoX, Pythia)": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
    "cl100k split (Llama 3)": _split_then_bytes(CL100K_PATTERN, "Isolated", False),
    "cl100k split (OLMo-2)": _split_then_bytes(CL100K_PATTERN, "Removed", True),
    "Qwen2 split": _split_then_bytes(QWEN2_PATTERN, "Isolated", False),
    "Qwen2 split (inverted)": _split_then_bytes(QWEN2_PATTERN, "Removed", True),
}
VERIFIED_NORMALIZERS: tuple[Any, ...] = (None, {"type": "NFC"})

log = logging.getLogger("zephon_titan")


def _canonical_pre_tokenizer(pre: Any) -> Any:
    """The settings of a pre-tokenizer that decide ids, with defaults filled in (offsets-only
    settings such as trim_offsets dropped), so that equal behaviour compares equal."""
    if not isinstance(pre, dict):
        return pre
    kind = pre.get("type")
    if kind == "ByteLevel":
        return {
            "type": "ByteLevel",
            "add_prefix_space": pre.get("add_prefix_space", True),
            "use_regex": pre.get("use_regex", True),
        }
    if kind == "Sequence":
        return {
            "type": "Sequence",
            "pretokenizers": [_canonical_pre_tokenizer(p) for p in pre.get("pretokenizers", [])],
        }
    if kind == "Split":
        return {k: pre.get(k) for k in ("type", "pattern", "behavior", "invert")}
    return pre


def fast_eligibility(tokenizer_json: str) -> str | None:
    """None if fastokens may encode with this tokenizer.json (its encoding configuration is on
    VERIFIED), else why not, as a phrase. Compares structure, never samples text."""
    data = json.loads(tokenizer_json)
    normalizer = data.get("normalizer")
    if normalizer not in VERIFIED_NORMALIZERS:
        return f"its normalizer {_short(normalizer)} is not on the verified list"
    pre = _canonical_pre_tokenizer(data.get("pre_tokenizer"))
    if pre not in VERIFIED.values():
        return f"its pre-tokenizer {_short(pre)} is not on the verified list"
    model = data.get("model") or {}
    settings = {
        "type": model.get("type"),
        "dropout": model.get("dropout"),
        "unk_token": model.get("unk_token"),
        "continuing_subword_prefix": model.get("continuing_subword_prefix") or None,
        "end_of_word_suffix": model.get("end_of_word_suffix") or None,
        "fuse_unk": model.get("fuse_unk", False),
        "byte_fallback": model.get("byte_fallback", False),
    }
    expected = dict.fromkeys(settings)
    expected.update(type="BPE", fuse_unk=False, byte_fallback=False)
    if settings != expected or not isinstance(model.get("ignore_merges", False), bool):
        changed = {k: v for k, v in settings.items() if v != expected[k]}
        return f"its model settings {_short(changed or model.get('ignore_merges'))} are not on the verified list"
    for token in data.get("added_tokens") or []:
        flags = [k for k in ("single_word", "lstrip", "rstrip") if token.get(k)]
        content = str(token.get("content", ""))
        if normalizer is not None and token.get("normalized") and unicodedata.normalize("NFC", content) != content:
            flags.append("normalized (its text changes under NFC)")
        if flags:
            return f"its added token {content[:30]!r} sets {', '.join(flags)}, which is not on the verified list"
    return None


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 120 else text[:117] + "..."


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


class NotVerified(Exception):
    """fastokens is installed and could load the tokenizer, but is not used for it (the message says why)."""


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


def fastokens_version() -> str | None:
    """The installed fastokens release, or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fastokens")
    except PackageNotFoundError:
        return None


def load_fast(tokenizer_json: str) -> FastBackend | Exception:
    """fastokens over `tokenizer_json`, or why it is not used for it: ImportError (not installed),
    NotVerified (not the verified release, or a configuration off the verified list), or the
    exception fastokens raised loading it. A pure function of the file and the installed release."""
    installed = fastokens_version()
    if installed is None:
        return ImportError("fastokens is not installed")
    if installed != FASTOKENS_VERSION:
        return NotVerified(f"fastokens {installed} is installed; the verified list is for {FASTOKENS_VERSION}")
    why_not = fast_eligibility(tokenizer_json)
    if why_not is not None:
        return NotVerified(f"fastokens is not verified for this tokenizer: {why_not}")
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
    if isinstance(fast, NotVerified):
        return _fall_back(reference, setting, str(fast), announce)
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
    return fast, f"fastokens (a verified configuration; matches tokenizers on {len(texts)} probe texts)"


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
    cores = usable_cores()
    ranks = max(int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1), 1)
    share = max(1, cores // (ranks * max(num_workers, 1)))
    return share if num_workers == 0 else max(2, share)


def limit_threads(threads: int) -> None:
    """Size the tokenizers' thread pools (Rayon, read when first used), unless the user has."""
    os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
