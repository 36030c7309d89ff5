"""Documents to token ids with a Hugging Face `tokenizers` tokenizer, BOS/EOS added here.

BOS/EOS are added by this module, never by the tokenizer's post-processor
(`add_special_tokens=False`), so the ids of a document depend only on the vocabulary
(special tokens included) and these two explicit choices. Which tokenizer and which
choices a job uses is decided in one place, zephon_titan/titan/tokenizer.py.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

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
    ):
        self.tokenizer = tokenizer
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

    def encode(self, texts: Sequence[str | np.ndarray]) -> list[np.ndarray]:
        """[BOS] + ids + [EOS] per document; items that are already token-id arrays are not tokenized."""
        strings = [t for t in texts if isinstance(t, str)]
        encodings = iter(self.tokenizer.encode_batch_fast(strings, add_special_tokens=False) if strings else [])
        out: list[np.ndarray] = []
        for t in texts:
            if isinstance(t, str):
                out.append(np.array(self._prefix + next(encodings).ids + self._suffix, dtype=TOKEN_DTYPE))
            else:
                out.append(
                    np.concatenate(
                        [np.array(self._prefix, dtype=TOKEN_DTYPE), t, np.array(self._suffix, dtype=TOKEN_DTYPE)]
                    )
                )
        return out

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
