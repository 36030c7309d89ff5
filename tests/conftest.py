"""Shared fixtures: a real BPE tokenizer and real-text corpora, built once per session."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(__file__))
# The offline corpora and the demo live in examples/ (not in the installed package).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

import corpus  # noqa: E402

# Remembered job resolutions (job_record.py) stay in this session's own folder, never in the user's cache.
if "ZEPHON_TITAN_CACHE" not in os.environ:
    os.environ["ZEPHON_TITAN_CACHE"] = tempfile.mkdtemp(prefix="zephon-titan-cache-")
    atexit.register(shutil.rmtree, os.environ["ZEPHON_TITAN_CACHE"], ignore_errors=True)
# No progress lines unless a test asks for them (test_progress.py sets its own): a loaded machine takes over
# progress.AFTER seconds to import or resolve a job, and the tests that count a command's stderr lines (one error
# line) failed at load 5-6 on a "where: importing TorchTitan ..." line.
os.environ.setdefault("ZEPHON_TITAN_PROGRESS_SECONDS", "600")


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


@pytest.fixture(scope="session")
def plain(tmp_path_factory, prose_docs):
    """The prose documents in 3 JSONL files, each one block with block_bytes past their size (the
    way a compressed file is one block): test_formats and test_token_files compare other formats with them."""
    root = tmp_path_factory.mktemp("plain")
    size = -(-len(prose_docs) // 3)
    for i in range(3):
        with open(root / f"part-{i}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in prose_docs[i * size : (i + 1) * size])
    return root


def _serving(server):
    """Point this process at `server` through its provider's usual environment variables (as a job on
    a cluster would be) while the session lasts; then restore them and stop it."""
    from zephon_titan.engine.sources import storage

    saved = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)
    storage._filesystem.cache_clear()
    yield server
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    storage._filesystem.cache_clear()
    server.stop()


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """A real S3-compatible server (moto, server mode) on loopback."""
    from s3server import S3Server

    yield from _serving(S3Server(str(tmp_path_factory.mktemp("s3"))))


@pytest.fixture(scope="session")
def gcs(tmp_path_factory):
    """A real GCS emulator (gcp-storage-emulator) on loopback, reached through STORAGE_EMULATOR_HOST."""
    pytest.importorskip("gcp_storage_emulator", reason="gcp-storage-emulator is not installed (the test extra)")
    from gcsserver import GcsServer

    yield from _serving(GcsServer(str(tmp_path_factory.mktemp("gcs"))))


@pytest.fixture(scope="session")
def azure(tmp_path_factory):
    """Azurite (npm) on loopback behind a logging proxy, reached through AZURE_STORAGE_CONNECTION_STRING."""
    from azureserver import AzureServer, azurite_binary

    binary, why_not = azurite_binary()
    if binary is None:
        pytest.skip(why_not)
    yield from _serving(AzureServer(str(tmp_path_factory.mktemp("azure")), binary))


@pytest.fixture(scope="session")
def hub(tmp_path_factory):
    """A stand-in Hugging Face Hub file API on loopback (tests/hubserver.py), reached through HF_ENDPOINT
    and HF_TOKEN."""
    from hubserver import HubServer

    yield from _serving(HubServer(str(tmp_path_factory.mktemp("hub"))))


@pytest.fixture(scope="session")
def s3_corpus(s3, corpus_dir) -> str:
    """The test corpus (prose JSONL + code Parquet) uploaded to the bucket; its s3:// URI."""
    return s3.upload(corpus_dir, "corpus")


@pytest.fixture(scope="session")
def gcs_corpus(gcs, corpus_dir) -> str:
    """The test corpus uploaded to the GCS emulator's bucket; its gs:// URI."""
    return gcs.upload(corpus_dir, "corpus")


@pytest.fixture(scope="session")
def azure_corpus(azure, corpus_dir) -> str:
    """The test corpus uploaded to Azurite's container; its az:// URI."""
    return azure.upload(corpus_dir, "corpus")


@pytest.fixture(scope="session")
def scored(tmp_path_factory, prose_docs, code_docs) -> str:
    """prose (JSONL) and code (Parquet) documents with a quality, a language and a nested meta column
    (helpers.write_scored): what keep, repeat and transform read."""
    from helpers import write_scored

    return write_scored(str(tmp_path_factory.mktemp("scored")), prose_docs, code_docs)
