"""Documents to token ids with a Hugging Face `tokenizers` tokenizer, BOS/EOS added here.

Special tokens are added by this module, never by the tokenizer's post-processor
(`add_special_tokens=False`), so the ids of a document depend only on the vocabulary
and these two explicit settings.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
from tokenizers import Tokenizer

from zephon_titan.errors import ConfigError

TOKEN_DTYPE = np.int32


class DocumentTokenizer:
    """Turns texts into int32 token arrays: [BOS] + encode(text) + [EOS]."""

    def __init__(self, tokenizer: Tokenizer, bos_id: int | None = None, eos_id: int | None = None):
        self.tokenizer = tokenizer
        self.bos_id = bos_id
        self.eos_id = eos_id
        vocab = tokenizer.get_vocab_size(with_added_tokens=True)
        for label, token_id in (("bos", bos_id), ("eos", eos_id)):
            if token_id is not None and not 0 <= token_id < vocab:
                raise ConfigError(f"{label} token id {token_id} is outside the vocabulary (size {vocab})")
        self._prefix = [bos_id] if bos_id is not None else []
        self._suffix = [eos_id] if eos_id is not None else []
        self._digest: str | None = None

    def encode(self, texts: list) -> list[np.ndarray]:
        """[BOS] + ids + [EOS] per document; items that are already token-id arrays are not tokenized."""
        strings = [t for t in texts if isinstance(t, str)]
        encodings = iter(self.tokenizer.encode_batch_fast(strings, add_special_tokens=False) if strings else [])
        out = []
        for t in texts:
            if isinstance(t, str):
                out.append(np.array(self._prefix + next(encodings).ids + self._suffix, dtype=TOKEN_DTYPE))
            else:
                out.append(np.concatenate([np.array(self._prefix, dtype=TOKEN_DTYPE), t,
                                           np.array(self._suffix, dtype=TOKEN_DTYPE)]))
        return out

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def digest(self) -> str:
        """SHA-256 of the vocabulary, merges and settings, and of the BOS/EOS choice."""
        if self._digest is None:
            h = hashlib.sha256(self.tokenizer.to_str().encode("utf-8"))
            h.update(json.dumps([self.bos_id, self.eos_id]).encode())
            self._digest = h.hexdigest()
        return self._digest


def _special_token_id(tokenizer: Tokenizer, token, path: str, label: str) -> int | None:
    if token is None:
        return None
    if isinstance(token, dict):  # {"content": "<s>", ...} as transformers writes it
        token = token.get("content")
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise ConfigError(f"{path}: {label} token {token!r} is not in the tokenizer's vocabulary")
    return token_id


def load_tokenizer(path: str, add_bos: bool = True, add_eos: bool = True) -> DocumentTokenizer:
    """Load `tokenizer.json` (a file, or a directory holding it).

    BOS/EOS tokens come from a `tokenizer_config.json` beside it (`bos_token`,
    `eos_token`), the convention of Hugging Face model repositories and TorchTitan.
    """
    directory, file = (path, os.path.join(path, "tokenizer.json")) if os.path.isdir(path) else (
        os.path.dirname(path), path)
    if not os.path.isfile(file):
        raise ConfigError(f"tokenizer {file} does not exist; point [dataloader] tokenizer_path at a tokenizer.json")
    tokenizer = Tokenizer.from_file(file)
    special: dict = {}
    config_file = os.path.join(directory, "tokenizer_config.json")
    if os.path.isfile(config_file):
        with open(config_file, encoding="utf-8") as f:
            special = json.load(f)
    bos = _special_token_id(tokenizer, special.get("bos_token"), config_file, "bos") if add_bos else None
    eos = _special_token_id(tokenizer, special.get("eos_token"), config_file, "eos") if add_eos else None
    return DocumentTokenizer(tokenizer, bos, eos)
