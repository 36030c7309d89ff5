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
from itertools import accumulate

import numpy as np
from tokenizers import Tokenizer

from zephon_titan.engine import tokenizer_backends
from zephon_titan.engine.buffers import lasting_array
from zephon_titan.engine.tokenizer_backends import Backend, ReferenceBackend
from zephon_titan.errors import ConfigError, DataError, ZephonError

TOKEN_DTYPE = np.int32


@dataclass(frozen=True, slots=True)
class SpecialTokenChoice:
    """Whether each document gets a BOS (or EOS) token, and why (shown by `validate`)."""

    token_id: int | None
    """The id added to every document, or None."""
    reason: str


class DocumentProblem(ZephonError):
    """The document at `index` among the strings of an encode call gives no ids the run can use; the caller, which
    knows where the document came from, names its file and row (`at`)."""

    def __init__(self, index: int, message: str):
        self.index = index
        super().__init__(message)

    def at(self, file: str, row_unit: str, row: int, source: str) -> DataError:
        return DataError(f"{file} {row_unit} {row} (source {source!r}): {self}")


class UnencodableText(DocumentProblem):
    """A text no tokenizer can encode: it holds a lone surrogate (a JSON escape such as \\ud800 without its pair, or
    those bytes encoded as UTF-8), which is no Unicode character. Python's json reads them; tokenizers cannot."""

    def __init__(self, index: int, error: UnicodeEncodeError):
        code = ord(error.object[error.start]) if isinstance(error.object, str) else 0
        super().__init__(
            index,
            f"the text holds a lone surrogate (U+{code:04X} at character {error.start:,}), which is not a Unicode "
            "character, so no tokenizer can encode it; fix the text (a JSON escape \\ud800-\\udfff must be one of "
            "a pair)",
        )


def check_encodable(strings: Sequence[str]) -> None:
    """Raise UnencodableText for the first string that is not Unicode text (after an encode call failed: the check
    costs a UTF-8 copy of each string, so it never runs on the way to valid ids)."""
    for index, text in enumerate(strings):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise UnencodableText(index, e) from None


class BackendMismatch(DocumentProblem):
    """The fast backend gave other ids than the reference for the document at `index` of an encode
    call (engine/source_reader.py names its file and row). The run stops: the rows must be the reference's."""

    def __init__(self, index: int, text: str, backend: str):
        super().__init__(
            index,
            f"{backend} gives other ids than tokenizers for this document ({text[:60]!r}); the rows would "
            'depend on the backend, so the run stops: set [dataloader] tokenizer_backend = "tokenizers" '
            "(and please report the document)",
        )


class DocumentTokenizer:
    """Turns texts into int32 token arrays: [BOS] + encode(text) + [EOS]."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        bos: SpecialTokenChoice | int | None = None,
        eos: SpecialTokenChoice | int | None = None,
        backend: str = "auto",
        loading: BackendLoad | None = None,
        folder: str = "",
    ):
        """`loading`: the backend's load, started before the reference was (worker processes)."""
        self.tokenizer = whole_documents(tokenizer)
        self.backend_setting = backend
        self._reference = ReferenceBackend(self.tokenizer)
        self._backend: Backend | None = None  # chosen at the first encode, in the process that encodes
        self._loading = loading  # the backend being loaded meanwhile (start_backend(), or given)
        self.backend_reason = ""
        self._verify_left = tokenizer_backends.VERIFY_DOCUMENTS
        self._verify_chars_left = tokenizer_backends.VERIFY_CHARS
        self._fast_failed = False  # said once: fastokens raised on a document the reference encoded
        self.folder = folder
        """The directory it was loaded from ("" if unknown): where a chat source finds its template (chat.py)."""
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
        """Choose the backend now (structural check, version and probes); returns its name. Idempotent.
        Waits for a load start_backend() began: which backend encodes never depends on timing."""
        if self._backend is None:
            if self._loading is not None:
                self._backend, self.backend_reason = self._loading.result(self.tokenizer, announce)
                self._loading = None
            else:
                self._backend, self.backend_reason = tokenizer_backends.select_backend(
                    self.tokenizer, self.backend_setting, announce=announce
                )
            if self._backend.name == self._reference.name:
                self._backend = self._reference  # one reference object: `is` tells the paths apart
        return self._backend.name

    def start_backend(self) -> None:
        """Load the backend in a background thread (fastokens loads without holding the GIL), so that
        it loads while the caller does other work (the trainer builds its model). Idempotent."""
        if self._backend is None and self._loading is None:
            self._loading = BackendLoad(self.tokenizer, self.backend_setting)

    def encode(
        self, texts: Sequence[str | np.ndarray], specials_in_tokens: bool = False, groups: Sequence[int] = ()
    ) -> list[np.ndarray]:
        """[BOS] + ids + [EOS] per document; items that are already token-id arrays are not tokenized (with
        `specials_in_tokens`, an array that already starts with BOS or ends with EOS gets none added there).
        `groups`: how many of the strings, in order, go to each buffer (readers that encode in one call each keep
        a buffer of their own: encode_calls.py); the rest share one. Raises BackendMismatch (with the index among
        `texts`' strings) if the fast backend differs."""
        strings = [t for t in texts if isinstance(t, str)]
        encoded = iter(self._with_specials(*self._encode_checked(strings), groups) if strings else [])
        prefix, suffix = np.array(self._prefix, dtype=TOKEN_DTYPE), np.array(self._suffix, dtype=TOKEN_DTYPE)
        return [
            next(encoded)
            if isinstance(t, str)
            else np.concatenate(
                [prefix, self._bare(t) if specials_in_tokens else t.astype(TOKEN_DTYPE, copy=False), suffix]
            )
            for t in texts
        ]

    def _bare(self, ids: np.ndarray) -> np.ndarray:
        """`ids` less a leading BOS and a trailing EOS where those are configured (encode adds them back):
        a pre-tokenized document that already has them does not get them twice. Unconfigured ones stay."""
        start = int(self.bos_id is not None and len(ids) > 0 and ids[0] == self.bos_id)
        stop = len(ids) - int(self.eos_id is not None and len(ids) > start and ids[-1] == self.eos_id)
        return ids[start:stop].astype(TOKEN_DTYPE, copy=False)

    def _encode_checked(self, strings: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The ids of `strings`: the chosen backend's, each document's a function of its text alone."""
        self.select_backend(announce=False)
        backend = self._backend
        assert backend is not None
        if backend is self._reference:
            return self._encode_reference(strings)
        try:
            ids, offsets = backend.encode_flat(strings)
        except Exception:  # some document it cannot encode: find it, so that the others stay fast's
            check_encodable(strings)  # none can, if it is no Unicode text
            ids, offsets = self._encode_one_by_one(backend, strings)
        if self._verify_left > 0 and self._verify_chars_left > 0:
            k = self._documents_to_verify(strings)
            ref_ids, ref_offsets = self._encode_reference(strings[:k])
            if not (np.array_equal(ref_offsets, offsets[: k + 1]) and np.array_equal(ref_ids, ids[: offsets[k]])):
                bad = tokenizer_backends.first_difference(self._reference, _Fixed(ids, offsets), strings[:k])
                index = bad if bad is not None else 0
                raise BackendMismatch(index, strings[index], backend.name)
            self._verify_left -= k
            self._verify_chars_left -= sum(len(text) for text in strings[:k])
        return ids, offsets

    def _encode_reference(self, strings: list[str]) -> tuple[np.ndarray, np.ndarray]:
        try:
            return self._reference.encode_flat(strings)
        except Exception:
            check_encodable(strings)  # the document that is no Unicode text, named; else tokenizers' own error
            raise

    def _documents_to_verify(self, strings: list[str]) -> int:
        """How many of the leading `strings` the reference checks: the documents left to check, up to and
        including the one that reaches the characters left to check."""
        k, chars = 0, 0
        while k < min(len(strings), self._verify_left) and chars < self._verify_chars_left:
            chars += len(strings[k])
            k += 1
        return k

    def _encode_one_by_one(self, backend: Backend, strings: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Each document by the backend, or by the reference where the backend raises on it: a document's
        ids depend on its own text, never on which documents shared its batch."""
        parts = []
        for text in strings:
            try:
                parts.append(backend.encode_flat([text])[0])
            except Exception as e:
                if not self._fast_failed:
                    self._fast_failed = True
                    tokenizer_backends.log.warning(
                        "zephon_titan: %s cannot encode a document (%s: %s); the reference encodes such documents",
                        backend.name,
                        type(e).__name__,
                        str(e).splitlines()[0][:200] if str(e) else "",
                    )
                parts.append(self._reference.encode_flat([text])[0])
        lengths = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))
        offsets = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(lengths)])
        ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint32)
        return ids.astype(np.uint32, copy=False), offsets

    def _with_specials(self, ids: np.ndarray, offsets: np.ndarray, groups: Sequence[int] = ()) -> list[np.ndarray]:
        """Per document, a view [BOS] + ids + [EOS] into a new int32 buffer, one per group of documents (`groups`:
        their counts; the documents past them share one more). A copy per document (a slice each), not one scatter
        over every token: 5-40x faster, and thousands of lanes each encode a few documents at a time (issue 28).
        A buffer per group, not one copied apart afterwards: each token is copied once (issue 47)."""
        before, after = len(self._prefix), len(self._suffix)
        bounds = offsets.tolist()
        cuts = [0, *accumulate(groups)]
        if cuts[-1] < len(bounds) - 1:
            cuts.append(len(bounds) - 1)
        documents: list[np.ndarray] = []
        for first, last in zip(cuts, cuts[1:]):
            if first == last:
                continue
            size = bounds[last] - bounds[first] + (last - first) * (before + after)
            out, at = lasting_array(size, np.dtype(TOKEN_DTYPE)), 0
            for start, stop in zip(bounds[first:last], bounds[first + 1 : last + 1]):
                end = at + before + stop - start + after
                out[at + before : end - after] = ids[start:stop]
                if before:
                    out[at] = self._prefix[0]
                if after:
                    out[end - 1] = self._suffix[0]
                documents.append(out[at:end])
                at = end
        return documents

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


class _Fixed:
    """Ids already computed, as a Backend (to locate the first difference)."""

    name = "fixed"

    def __init__(self, ids: np.ndarray, offsets: np.ndarray):
        self._ids, self._offsets = ids, offsets

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        k = len(texts)
        return self._ids[: self._offsets[k]], self._offsets[: k + 1]


def whole_documents(tokenizer: Tokenizer) -> Tokenizer:
    """The tokenizer without truncation or padding. A tokenizer.json may carry either (saved after a
    fine-tuning run, say): truncation would cut every document silently, and padding would make a
    document's ids depend on the longest document it was encoded with. A copy: the caller's object
    (TorchTitan's trainer tokenizer) is left as it is."""
    if tokenizer.truncation is None and tokenizer.padding is None:
        return tokenizer
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.no_truncation()
    copy.no_padding()
    return copy
