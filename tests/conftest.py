"""Shared fixtures: a real BPE tokenizer and real-text corpora, built once per session."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from zephon_titan.testing import corpus  # noqa: E402


@pytest.fixture(scope="session")
def prose_docs() -> list[str]:
    return corpus.prose_documents()


@pytest.fixture(scope="session")
def code_docs() -> list[str]:
    return corpus.code_documents(max_files=40)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory, prose_docs, code_docs) -> str:
    return corpus.train_tokenizer(prose_docs + code_docs, str(tmp_path_factory.mktemp("tokenizer")), vocab_size=2000)


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory, prose_docs, code_docs) -> str:
    """prose: 3 JSONL files; code: 3 Parquet files with 4 rows per row group."""
    root = str(tmp_path_factory.mktemp("corpus"))
    corpus.write_jsonl(prose_docs, os.path.join(root, "prose"), num_files=3)
    corpus.write_parquet(code_docs, os.path.join(root, "code"), num_files=3, row_group_size=4)
    return root
