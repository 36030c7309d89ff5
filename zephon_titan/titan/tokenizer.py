"""The one way to get the ids of a job: TorchTitan's own tokenizer, wrapped for the engine.

TorchTitan's `HuggingFaceTokenizer` does more than load `tokenizer.json`: it adds every
special token its `tokenizer_config.json` lists (`bos_token`, ..., `added_tokens_decoder`)
to the vocabulary, so a document containing `<|image|>` gets that token's id, and it reads
the BOS/EOS choice from `add_bos_token`/`add_eos_token`. Every entry point (the trainer,
`data_run`, `plan`, `inspect`, `validate`) therefore builds its tokenizer here, from the
same class the trainer uses; the trainer's own tokenizer object goes through the same
`document_tokenizer()`. There is no second way to load one.

BOS/EOS, per document (`[dataloader] add_bos` / `add_eos` override both rules):
  1. the tokenizer's post-processor adds the token to every encoding: added (as TorchTitan does);
  2. else `add_bos_token` / `add_eos_token` in tokenizer_config.json, when present;
  3. else added (TorchTitan's pretraining dataset encodes with add_bos=True, add_eos=True).
A token the tokenizer does not define is never added.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from zephon_titan.config import DataConfig
from zephon_titan.engine.tokenize import DocumentTokenizer, SpecialTokenChoice
from zephon_titan.errors import ConfigError


def load_tokenizer(
    path: str,
    add_bos: bool | None = None,
    add_eos: bool | None = None,
    key: str = "[dataloader] tokenizer_path",
    backend: str = "auto",
) -> DocumentTokenizer:
    """Load the tokenizer directory `path` exactly as TorchTitan's trainer does (`key` names the
    setting it came from, for errors)."""
    return document_tokenizer(load_hf_tokenizer(path, key), add_bos, add_eos, backend)


def loader_tokenizer(data: DataConfig, trainer_tokenizer: Callable[[], Any]) -> DocumentTokenizer:
    """The loader's tokenizer: `[dataloader] tokenizer_path` if set, else the trainer's own
    (`trainer_tokenizer()` is called only then). The trainer and `Job` both come here."""
    if data.tokenizer_path:
        return load_tokenizer(data.tokenizer_path, data.add_bos, data.add_eos, backend=data.tokenizer_backend)
    return document_tokenizer(trainer_tokenizer(), data.add_bos, data.add_eos, data.tokenizer_backend)


def load_hf_tokenizer(path: str, key: str = "hf_assets_path", config: Any = None) -> Any:
    """The tokenizer the trainer builds for the directory `path` (`config.build(tokenizer_path=path)`,
    TorchTitan's HuggingFaceTokenizer by default); a ConfigError naming `key` otherwise."""
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    config = config if config is not None else HuggingFaceTokenizer.Config()

    where = f"{key} = {path!r}" + (f" ({os.path.abspath(path)})" if path and not os.path.isabs(path) else "")
    if not path or not os.path.isdir(path):
        hint = (
            "is a file: point it at the directory holding tokenizer.json"
            if path and os.path.isfile(path)
            else "does not exist"
        )
        raise ConfigError(
            f"{where} {hint}; it must name a directory holding tokenizer.json and "
            "tokenizer_config.json (relative paths start from the current directory)"
        )
    _refuse_special_files(path, where)
    try:
        return config.build(tokenizer_path=path)
    except FileNotFoundError as e:
        raise ConfigError(f"{where} holds no tokenizer.json ({e})") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where}: tokenizer_config.json is not valid JSON ({e}); restore it") from None
    except Exception as e:  # the tokenizers library reports a corrupt tokenizer.json as a plain Exception
        first = str(e).splitlines()[0] if str(e) else repr(e)
        raise ConfigError(
            f"{where}: cannot load the tokenizer ({type(e).__name__}: {first}); "
            "restore tokenizer.json and tokenizer_config.json"
        ) from None


# The files a Hugging Face tokenizer folder may hold that TorchTitan's tokenizer reads; each is read whole.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "config.json",
    "generation_config.json",
)
MAX_TOKENIZER_FILE_BYTES = 1 << 30


def _refuse_special_files(path: str, where: str) -> None:
    """A FIFO, a device, a /proc file or a file of gigabytes in the tokenizer folder is refused before the
    tokenizer library opens it (a FIFO would block it forever, /dev/zero never end), as every file the job
    names."""
    from zephon_titan.engine.sources import guards

    for name in TOKENIZER_FILES:
        file = os.path.join(path, name)
        try:
            st = os.stat(file)
        except OSError:  # absent (or a dangling link): the library says what it misses
            continue
        guards.check_regular(file, st, ConfigError, f"{where}: point it at a folder of regular tokenizer files")
        if st.st_size > MAX_TOKENIZER_FILE_BYTES:
            raise ConfigError(
                f"{where}: {name} has {st.st_size:,} bytes, more than the {MAX_TOKENIZER_FILE_BYTES:,} a tokenizer "
                "file may have; point it at the tokenizer's own folder"
            )


def document_tokenizer(
    hf: Any, add_bos: bool | None = None, add_eos: bool | None = None, backend: str = "auto"
) -> DocumentTokenizer:
    """Wrap a TorchTitan HuggingFaceTokenizer (the trainer's, or one from load_hf_tokenizer)."""
    inner = getattr(hf, "tokenizer", None)
    if inner is None or not hasattr(inner, "encode_batch_fast"):
        raise ConfigError(
            f"the trainer's tokenizer ({type(hf).__name__}) is not TorchTitan's HuggingFaceTokenizer; "
            "zephon_titan needs a Hugging Face `tokenizers` tokenizer (set [tokenizer] back to the default)"
        )
    settings = getattr(hf, "_hf_config", None) or {}
    bos = _choose("bos", getattr(hf, "bos_id", None), getattr(hf, "hf_adds_bos", False), settings, add_bos)
    eos = _choose("eos", getattr(hf, "eos_id", None), getattr(hf, "hf_adds_eos", False), settings, add_eos)
    return DocumentTokenizer(inner, bos, eos, backend, folder=getattr(hf, "tokenizer_path", "") or "")


def _choose(
    name: str, token_id: int | None, post_processor_adds: bool, settings: dict, override: bool | None
) -> SpecialTokenChoice:
    if token_id is None:
        return SpecialTokenChoice(None, f"the tokenizer defines no {name.upper()} token")
    if override is not None:
        return SpecialTokenChoice(token_id if override else None, f"[dataloader] add_{name} = {str(override).lower()}")
    if post_processor_adds:
        return SpecialTokenChoice(token_id, "the tokenizer's post-processor adds it")
    setting = settings.get(f"add_{name}_token")
    if setting is not None:
        return SpecialTokenChoice(
            token_id if setting else None, f"tokenizer_config.json add_{name}_token = {str(bool(setting)).lower()}"
        )
    return SpecialTokenChoice(token_id, f"default (tokenizer_config.json has no add_{name}_token)")
