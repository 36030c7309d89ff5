"""Real text that is always present offline, written as small Parquet/JSONL corpora.

- prose: the Python documentation topics (`pydoc_data.topics`), one document per topic;
- code: the Python standard library's own modules, one document per file.
Plus a small byte-level BPE trained on them with `tokenizers`.
"""

from __future__ import annotations

import json
import os
import sysconfig

import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"


def prose_documents() -> list[str]:
    from pydoc_data.topics import topics

    return [topics[name] for name in sorted(topics)]


def code_documents(max_files: int = 40, max_bytes: int = 20_000) -> list[str]:
    """Standard-library modules (sorted by name) no larger than max_bytes."""
    stdlib = sysconfig.get_paths()["stdlib"]
    docs = []
    for name in sorted(os.listdir(stdlib)):
        path = os.path.join(stdlib, name)
        if name.endswith(".py") and os.path.getsize(path) <= max_bytes:
            with open(path, encoding="utf-8") as f:
                docs.append(f.read())
            if len(docs) == max_files:
                break
    return docs


def _split(docs: list[str], num_files: int) -> list[list[str]]:
    """Contiguous, nearly equal parts (file order = document order)."""
    size = -(-len(docs) // num_files)
    return [docs[i : i + size] for i in range(0, len(docs), size)]


def write_jsonl(docs: list[str], directory: str, num_files: int = 1, field: str = "text") -> list[str]:
    os.makedirs(directory, exist_ok=True)
    paths = []
    for i, part in enumerate(_split(docs, num_files)):
        path = os.path.join(directory, f"part-{i:05d}.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for text in part:
                f.write(json.dumps({field: text, "id": len(paths)}) + "\n")
        paths.append(path)
    return paths


def write_parquet(
    docs: list[str], directory: str, num_files: int = 1, row_group_size: int = 8, field: str = "text"
) -> list[str]:
    os.makedirs(directory, exist_ok=True)
    paths = []
    for i, part in enumerate(_split(docs, num_files)):
        path = os.path.join(directory, f"part-{i:05d}.parquet")
        pq.write_table(pa.table({field: part}), path, row_group_size=row_group_size)
        paths.append(path)
    return paths


def train_tokenizer(texts: list[str], directory: str, vocab_size: int = 2000) -> str:
    """Train a byte-level BPE and write tokenizer.json + tokenizer_config.json; returns the directory."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    os.makedirs(directory, exist_ok=True)
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}, f)
    return directory


def two_source_table(root: str, tokenizer: str, num_lanes: int, seed: int | None = None) -> dict[str, object]:
    """The [dataloader] table of the prose (JSONL, 0.7) and code (Parquet, 0.3) corpus written under `root` (as the
    tests' corpus_dir fixture and the benchmarks write it)."""
    table: dict[str, object] = {
        "tokenizer_path": tokenizer,
        "num_lanes": num_lanes,
        "sources": {
            "prose": {"paths": [f"{root}/prose/*.jsonl"], "weight": 0.7},
            "code": {"paths": [f"{root}/code/*.parquet"], "weight": 0.3},
        },
    }
    return table if seed is None else {**table, "seed": seed}
