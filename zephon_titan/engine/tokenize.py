"""Documents to token ids with a Hugging Face `tokenizers` tokenizer, BOS/EOS added here.

BOS/EOS are added by this module, never by the tokenizer's post-processor
(`add_special_tokens=False`), so the ids of a document depend only on the vocabulary
(special tokens included) and these two explicit choices. Which tokenizer and which
choices a job uses is decided in one place, zephon_titan/titan/tokenizer.py. Which
code computes the ids (a speed knob only) is engine/tokenizer_backends.py.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from zephon_titan.engine import tokenizer_backends
from zephon_titan.engine.tokenizer_backends import Backend, ReferenceBackend
from zephon_titan.errors import ConfigError

TOKEN_DTYPE = np.int32


@dataclass(frozen=True, slots=True)
class SpecialTokenChoice:
    """Whether each document gets a BOS (or EOS) token, and why (shown by `validate`)."""

    token_id: int | None
    """The id added to every document, or None."""
    reason: str


class DocumentTokenizer:
    """Turns texts into int32 token arrays: [BOS] + encode(text) + [EOS]."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        bos: SpecialTokenChoice | int | None = None,
        eos: SpecialTokenChoice | int | None = None,
        backend: str = "auto",
        loading: BackendLoad | None = None,
    ):
        """`loading`: the backend's load, started before the reference was (worker processes)."""
        self.tokenizer = tokenizer
        self.backend_setting = backend
        self._reference = ReferenceBackend(tokenizer)
        self._backend: Backend | None = None  # chosen at the first encode, in the process that encodes
        self._loading = loading  # the backend being loaded meanwhile (start_backend(), or given)
        self._done_by_reference: list[tuple[str, np.ndarray]] = []  # while it loads: (text, ids) to check it on
        self.backend_reason = ""
        self._verify_left = tokenizer_backends.VERIFY_DOCUMENTS
        self.bos = bos if isinstance(bos, SpecialTokenChoice) else SpecialTokenChoice(bos, "given")
        self.eos = eos if isinstance(eos, SpecialTokenChoice) else SpecialTokenChoice(eos, "given")
        bos_id, eos_id = self.bos.token_id, self.eos.token_id
        self.bos_id = bos_id
        self.eos_id = eos_id
        vocab = tokenizer.get_vocab_size(with_added_tokens=True)
        for label, token_id in (("bos", bos_id), ("eos", eos_id)):
            if token_id is not None and not 0 <= token_id < vocab:
                raise ConfigError(f"{label} token id {token_id} is outside the vocabulary (size {vocab})")
        self._prefix = [bos_id] if bos_id is not None else []
        self._suffix = [eos_id] if eos_id is not None else []
        self._digest: str | None = None

    def select_backend(self, announce: bool = True) -> str:
        """Choose the backend now (probe check included); returns its name. Idempotent."""
        if self._loading is not None:  # start_backend() began it: wait for it
            self._adopt_loaded(announce)
        if self._backend is None:
            self._take(*tokenizer_backends.select_backend(self.tokenizer, self.backend_setting, announce=announce))
        assert self._backend is not None
        return self._backend.name

    def _take(self, backend: Backend, reason: str) -> None:
        self._backend = self._reference if backend.name == self._reference.name else backend
        self.backend_reason = reason

    def start_backend(self) -> None:
        """Load and probe-check the backend in a background thread (fastokens loads without holding the
        GIL), so that tokenizing starts at once: until the backend is ready the reference tokenizes, and
        the backend is then checked first on those same documents. Idempotent. Measured in process (one
        rank, 8 lanes, GPT-2): the first batch 0.71-0.74 s -> 0.49-0.57 s, at the same throughput."""
        if self._backend is None and self._loading is None:
            self._loading = BackendLoad(self.tokenizer, self.backend_setting)

    def _adopt_loaded(self, announce: bool = False) -> None:
        """Take the background load's result and check it on the documents the reference did meanwhile."""
        assert self._loading is not None
        self._take(*self._loading.result(self.tokenizer, announce))  # raises tokenizer_backend = fastokens' ConfigError
        self._loading = None
        done, self._done_by_reference = self._done_by_reference, []
        if done and self._backend is not self._reference:
            texts = [text for text, _ in done]
            lengths = np.fromiter((len(ids) for _, ids in done), dtype=np.int64, count=len(done))
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            self._checked(texts, (np.concatenate([ids for _, ids in done]), offsets), None)

    def encode(self, texts: Sequence[str | np.ndarray]) -> list[np.ndarray]:
        """[BOS] + ids + [EOS] per document; items that are already token-id arrays are not tokenized."""
        strings = [t for t in texts if isinstance(t, str)]
        encoded = iter(self._with_specials(*self._encode_checked(strings)) if strings else [])
        prefix, suffix = np.array(self._prefix, dtype=TOKEN_DTYPE), np.array(self._suffix, dtype=TOKEN_DTYPE)
        return [next(encoded) if isinstance(t, str) else np.concatenate([prefix, t, suffix]) for t in texts]

    def _encode_checked(self, strings: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The reference's ids for `strings`, computed by the chosen backend once it has matched the
        reference on this process's first documents."""
        if self._backend is None:
            self.start_backend()
            assert self._loading is not None
            if self._loading.done():
                self._adopt_loaded()
        if self._backend is None:  # still loading: the reference's ids, kept to check the backend on
            ids, offsets = self._reference.encode_flat(strings)
            room = self._verify_left - len(self._done_by_reference)
            bounds = offsets.tolist()
            self._done_by_reference += [
                (strings[i], ids[bounds[i] : bounds[i + 1]]) for i in range(min(room, len(strings)))
            ]
            return ids, offsets
        if self._backend is self._reference:
            return self._reference.encode_flat(strings)
        try:
            ids, offsets = self._backend.encode_flat(strings)
        except Exception as e:  # a text the fast backend cannot encode: the reference can
            return self._use_reference(f"failed on a document ({type(e).__name__}: {e})", strings)
        if self._verify_left <= 0:
            return ids, offsets
        k = min(len(strings), self._verify_left)
        return self._checked(strings, self._reference.encode_flat(strings[:k]), (ids, offsets))

    def _checked(
        self,
        strings: list[str],
        reference: tuple[np.ndarray, np.ndarray],
        fast: tuple[np.ndarray, np.ndarray] | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ids of `strings` once the backend's (`fast`, computed here if None) agree with the
        `reference` ids of the first strings; on a difference this process uses the reference for good."""
        assert self._backend is not None
        if fast is None:
            try:
                fast = self._backend.encode_flat(strings)
            except Exception as e:
                return self._use_reference(f"failed on a document ({type(e).__name__}: {e})", strings)
        (ids, offsets), (ref_ids, ref_offsets) = fast, reference
        k = len(ref_offsets) - 1
        if np.array_equal(ref_offsets, offsets[: k + 1]) and np.array_equal(ref_ids, ids[: offsets[k]]):
            self._verify_left -= k
            return ids, offsets
        return self._use_reference("gave other ids than tokenizers for a document", strings)

    def _use_reference(self, what: str, strings: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Switch this process to the reference for good, saying so once; the ids are always the reference's."""
        assert self._backend is not None
        tokenizer_backends.log.warning(
            "zephon_titan: %s %s; this process tokenizes with tokenizers from now on (the rows are unchanged: "
            "they are tokenizers' ids either way). `zephon-titan validate --check-tokenizer` finds the document.",
            self._backend.name,
            what,
        )
        self._backend, self.backend_reason = self._reference, f"tokenizers ({self._backend.name} {what})"
        return self._reference.encode_flat(strings)

    def _with_specials(self, ids: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
        """Per document, a view [BOS] + ids + [EOS] into one new int32 buffer (no per-token Python work)."""
        n, before, extra = len(offsets) - 1, len(self._prefix), len(self._prefix) + len(self._suffix)
        starts = offsets + np.arange(n + 1, dtype=np.int64) * extra  # document i: out[starts[i]:starts[i+1]]
        out = np.empty(int(starts[-1]), dtype=TOKEN_DTYPE)
        if extra:
            shift = np.repeat(starts[:-1] + before - offsets[:-1], np.diff(offsets))
            out[np.arange(len(ids), dtype=np.int64) + shift] = ids
            if self._prefix:
                out[starts[:-1]] = self._prefix[0]
            if self._suffix:
                out[starts[1:] - 1] = self._suffix[0]
        else:
            out[:] = ids
        bounds = starts.tolist()
        return [out[bounds[i] : bounds[i + 1]] for i in range(n)]

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def decode(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def digest(self) -> str:
        """SHA-256 of the vocabulary, merges and settings, and of the BOS/EOS choice."""
        if self._digest is None:
            h = hashlib.sha256(self.tokenizer.to_str().encode("utf-8"))
            h.update(json.dumps([self.bos_id, self.eos_id]).encode())
            self._digest = h.hexdigest()
        return self._digest


class BackendLoad:
    """A tokenizer backend loaded in a thread (fastokens loads without holding the GIL).

    Only the load: the probe check runs in the thread that encodes (`result()`), so one thread at a
    time uses the tokenizers. `source` is the tokenizer.json's text, or the reference Tokenizer to
    take it from (in the thread)."""

    def __init__(self, source: str | Tokenizer, setting: str):
        self._source, self._setting = source, setting
        self._loaded: tokenizer_backends.FastBackend | Exception | None = None
        # Not a daemon: at exit, Python would stop a daemon thread inside fastokens' Rust code (an abort).
        self._thread = threading.Thread(target=self._run, name="zephon-backend-load")
        self._thread.start()

    def _run(self) -> None:
        if self._setting != "tokenizers":
            text = self._source if isinstance(self._source, str) else self._source.to_str()
            self._loaded = tokenizer_backends.load_fast(text)

    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self) -> None:
        self._thread.join()

    def result(self, tokenizer: Tokenizer, announce: bool) -> tuple[Backend, str]:
        """The backend and why, after the probe check against `tokenizer` (raises the ConfigError of
        tokenizer_backend = fastokens); `announce`: log a fallback."""
        self._thread.join()
        return tokenizer_backends.select_backend(tokenizer, self._setting, announce=announce, loaded=self._loaded)
