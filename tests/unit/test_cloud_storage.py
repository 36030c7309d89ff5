"""GCS (and the other clouds) tested like S3 (tests/unit/test_object_storage.py): sources read from a real
emulator on loopback (gcp-storage-emulator for gs://), reached through the provider's usual environment
variable, with every request logged so the tests see what a reader asked for."""

from __future__ import annotations

import json
from urllib.parse import unquote

import pytest
from helpers import assert_same_files_and_blocks, assert_same_lane_rows, listing_error, make_spec, rows_digest

from zephon_titan.config import SourceConfig
from zephon_titan.engine import LaneStream
from zephon_titan.engine.fingerprint import check_fingerprint, fingerprint
from zephon_titan.engine.sources import open_source, storage
from zephon_titan.engine.sources.base import expand_paths
from zephon_titan.engine.sources.jsonl import TAIL_READ_BYTES
from zephon_titan.engine.sources.parquet import _open as open_parquet
from zephon_titan.errors import ConfigError, ResumeError

SOURCES = {"prose": ("*.jsonl", {"block_bytes": 16384}), "code": ("*.parquet", {})}


class Gcs:
    """How the GCS JSON API names what a reader does, in the emulator's request log."""

    fixture, corpus = "gcs", "gcs_corpus"
    streams_per_open = 1

    @staticmethod
    def reads(requests, suffix=""):
        """Object-body GETs (`alt=media`), of objects whose name ends with `suffix`."""
        return [r for r in requests if "alt=media" in r["query"] and unquote(r["key"]).endswith(suffix)]

    @staticmethod
    def listings(requests):
        return [r for r in requests if r["key"].endswith("/o") and "prefix=" in r["query"]]

    @staticmethod
    def writes(requests):
        return {unquote(r["query"].split("name=", 1)[1].split("&", 1)[0]) for r in requests if "/upload/" in r["key"]}


class Azure:
    """How the Azure Blob REST API names what a reader does, in the proxy's request log."""

    fixture, corpus = "azure", "azure_corpus"
    streams_per_open = 0  # opening is a HEAD

    @staticmethod
    def reads(requests, suffix=""):
        """Blob GETs (no `comp=` or `restype=`: those are listings and properties)."""
        return [r for r in requests if r["method"] == "GET" and not r["query"] and r["key"].endswith(suffix)]

    @staticmethod
    def listings(requests):
        return [r for r in requests if "comp=list" in r["query"]]

    @staticmethod
    def writes(requests):
        return {r["key"].split("/", 3)[3] for r in requests if r["method"] == "PUT" and "comp=block" in r["query"]}


CLOUDS = [Gcs, Azure]


@pytest.fixture(params=CLOUDS, ids=lambda c: c.fixture)
def cloud(request):
    """(provider, its server, the test corpus's URI there)."""
    provider = request.param
    return provider, request.getfixturevalue(provider.fixture), request.getfixturevalue(provider.corpus)


def _forget_open_files():
    """What a fresh process starts with: no cached file handle or Parquet footer."""
    open_parquet.cache_clear()
    storage.open_input_file.cache_clear()


def _sources(root):
    return {name: {"paths": [f"{root}/{name}/{pattern}"], **options} for name, (pattern, options) in SOURCES.items()}


def test_every_block_in_the_bucket_equals_the_same_block_on_disk(cloud, corpus_dir):
    _, _, uri = cloud
    for name, (pattern, options) in SOURCES.items():
        local = open_source(SourceConfig(name=name, paths=[f"{corpus_dir}/{name}/{pattern}"], **options))
        remote = open_source(SourceConfig(name=name, paths=[f"{uri}/{name}/{pattern}"], **options))
        assert_same_files_and_blocks(remote, local, name)


def test_a_move_from_disk_to_the_bucket_needs_resume_allow(cloud, corpus_dir, tokenizer_dir):
    _, _, uri = cloud
    local = make_spec(corpus_dir, tokenizer_dir, sources=_sources(corpus_dir))
    remote = make_spec(corpus_dir, tokenizer_dir, sources=_sources(uri))
    # Uploaded objects keep names, sizes and blocks but get new modification times.
    with pytest.raises(ResumeError, match=r"locations.code: .*mtimes.prose: "):
        check_fingerprint(fingerprint(local), fingerprint(remote))
    check_fingerprint(fingerprint(local), fingerprint(remote), allow=["locations", "mtimes"])


@pytest.mark.slow  # the blocks are equal above; this is the whole path, and the slow resume checks it too
def test_lane_rows_from_the_bucket_equal_the_rows_from_disk(cloud, corpus_dir, tokenizer_dir):
    _, _, uri = cloud
    local = make_spec(corpus_dir, tokenizer_dir, sources=_sources(corpus_dir))
    remote = make_spec(corpus_dir, tokenizer_dir, sources=_sources(uri))
    other_seed = make_spec(corpus_dir, tokenizer_dir, sources=_sources(uri), seed=8)
    assert_same_lane_rows(local, remote, other_seed)


def test_a_block_is_read_with_range_requests_from_its_offset(cloud, tmp_path, prose_docs):
    provider, server, _ = cloud
    data = tmp_path / "big"
    data.mkdir()
    lines = [json.dumps({"text": prose_docs[i % len(prose_docs)][:3000]}) + "\n" for i in range(600)]
    (data / "big.jsonl").write_text("".join(lines))
    uri = server.upload(str(data), "big_jsonl")
    block_bytes = 64 << 10
    remote = open_source(SourceConfig(name="big", paths=[f"{uri}/*.jsonl"], block_bytes=block_bytes))
    local = open_source(SourceConfig(name="big", paths=[str(data / "big.jsonl")], block_bytes=block_bytes))
    assert remote.num_blocks > 10
    for block in (3, remote.num_blocks - 1):
        _forget_open_files()  # a fresh process: the open, then the block
        server.clear_requests()
        assert remote.read_block(block).texts == local.read_block(block).texts
        reads = provider.reads(server.requests(), "big.jsonl")
        ranged = [r for r in reads if r["range"]]
        # pyarrow's GCS client opens an object with a stream from byte 0 that it never reads from
        # (ReadAt asks for ranges); one per file and process, counted apart.
        assert len(reads) - len(ranged) == provider.streams_per_open, reads
        starts = [int(r["range"].removeprefix("bytes=").split("-")[0]) for r in ranged]
        assert ranged and min(starts) >= block * block_bytes - 1  # from the block (and the byte before it)
        assert sum(r["bytes"] for r in ranged) <= block_bytes + 1 + TAIL_READ_BYTES
    # Negative control: the log sees a whole-object read for what it is.
    server.clear_requests()
    storage.read_bytes(f"{uri}/big.jsonl")
    assert (
        sum(r["bytes"] for r in provider.reads(server.requests(), "big.jsonl")) == (data / "big.jsonl").stat().st_size
    )


def test_with_an_index_startup_reads_one_object_per_source(cloud, corpus_dir, tokenizer_dir):
    provider, server, uri = cloud
    bucket = uri.rsplit("/", 1)[0]
    sources = {name: {**source, "index": f"{bucket}/indexes/{name}.json"} for name, source in _sources(uri).items()}
    _forget_open_files()
    server.clear_requests()
    listed = make_spec(corpus_dir, tokenizer_dir, sources=sources)  # no index yet: lists, reads footers, writes it
    first = server.requests()
    assert len(provider.listings(first)) >= 2
    assert provider.writes(first) == {"indexes/code.json", "indexes/prose.json"}
    _forget_open_files()
    server.clear_requests()
    indexed = make_spec(corpus_dir, tokenizer_dir, sources=sources)
    again = server.requests()
    assert provider.listings(again) == [] and provider.reads(again, ".parquet") == []  # no listing, no footer
    assert sorted(unquote(r["key"]).rsplit("/", 1)[1] for r in provider.reads(again)) == ["code.json", "prose.json"]
    assert fingerprint(indexed) == fingerprint(listed)
    for lane in (0, 3):
        assert rows_digest(LaneStream(indexed, lane).take(20)) == rows_digest(LaneStream(listed, lane).take(20))


def test_a_missing_bucket_is_one_line_naming_the_url_and_the_emulator(cloud):
    provider, server, _ = cloud
    scheme = server.scheme
    with pytest.raises(ConfigError) as error:
        expand_paths("s", [f"{scheme}://no-such-bucket/x/*.jsonl"])
    message = str(error.value)
    assert "\n" not in message and f"cannot list '{scheme}://no-such-bucket/x/*.jsonl': " in message, message
    assert "'no-such-bucket' does not exist" in message and server.endpoint in message, message
    assert not any(secret in message for secret in _secrets(server)), message


def _secrets(server) -> list[str]:
    """The secret parts of a server's environment (Azurite's well-known key): never in an error or log."""
    from azureserver import ACCOUNT_KEY

    return [ACCOUNT_KEY] if server.scheme == "az" else []


def test_a_wrong_azure_key_is_one_line_that_does_not_show_it(azure, monkeypatch):
    """The connection string's key is refused by the account (403): one line naming the URL and where
    credentials come from; neither the wrong key nor the right one is printed."""
    import base64

    from azureserver import ACCOUNT_KEY

    wrong = base64.b64encode(b"ZEPHON-WRONG-KEY" * 4).decode()
    monkeypatch.setenv(
        "AZURE_STORAGE_CONNECTION_STRING", azure.env["AZURE_STORAGE_CONNECTION_STRING"].replace(ACCOUNT_KEY, wrong)
    )
    message = listing_error("az://zephon-test/corpus/*.jsonl")
    assert "cannot list 'az://zephon-test/corpus/*.jsonl': " in message, message
    assert "403" in message and "AZURE_STORAGE_CONNECTION_STRING" in message, message
    assert wrong not in message and ACCOUNT_KEY not in message


_WRONG_KEY = "-----BEGIN PRIVATE KEY-----\\nZEPHONSECRETKEYMATERIAL\\n-----END PRIVATE KEY-----\\n"


def test_wrong_gcs_credentials_are_one_line_that_does_not_show_them(tmp_path, monkeypatch):
    """Application default credentials from GOOGLE_APPLICATION_CREDENTIALS (no emulator): a key that does
    not parse is refused before any request, in one line naming the URL and where credentials come from."""
    key = tmp_path / "key.json"
    key.write_text(
        '{"type": "service_account", "client_email": "x@y.iam.gserviceaccount.com", '
        f'"private_key": "{_WRONG_KEY}", "token_uri": "http://127.0.0.1:9/token"}}'
    )
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
    message = listing_error("gs://zephon-test/corpus/*.jsonl")
    assert "cannot list 'gs://zephon-test/corpus/*.jsonl'" in message, message
    assert "GOOGLE_APPLICATION_CREDENTIALS" in message and "ZEPHONSECRET" not in message, message


def test_az_without_an_account_is_one_line(monkeypatch):
    for name in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_NAME"):
        monkeypatch.delenv(name, raising=False)
    storage._filesystem.cache_clear()
    with pytest.raises(
        ConfigError,
        match=r"^cannot open 'az://data': no Azure storage account in the environment; set AZURE_STORAGE_CONNECTION_STRING, or ",
    ):
        expand_paths("s", ["az://data/web/*.jsonl"])
    storage._filesystem.cache_clear()


# S3 in the gate; GCS and Azure in the slow tier: ~20 s each on GCS, whose client backs off 1, 2, 4 s... within
# its 10 s limit before the block's attempts see the fault.
# Faults in a row that outlast each client's own attempts (pyarrow's S3 client makes 3; Google's and Azure's more).
FAULTS = {"s3": 3, "gcs": 6, "azure": 6}
FAULTY = [("s3", "s3_corpus")] + [pytest.param(c.fixture, c.corpus, marks=pytest.mark.slow) for c in CLOUDS]


@pytest.mark.parametrize("kind", ["503", "500", "short", "reset"])
@pytest.mark.parametrize("fixture,corpus", FAULTY)
def test_transient_storage_faults_are_retried_to_the_same_blocks(request, fixture, corpus, corpus_dir, kind, caplog):
    """Throttling, internal errors, bodies cut short and connections reset, as each provider words them
    (served by the test servers' fault plans, tests/objectserver.py): every block read is the same as on disk.
    The faults outlast each client's own retries, so the block's attempts absorb the rest, logged; except a body
    cut short on Azure, whose client resumes a download where it stopped, so every fault makes progress there, and
    a body cut short on GCS, whose client retries a read for as long as its time budget allows: on a loaded machine
    it has given up to us (DEADLINE_EXCEEDED), on a quiet one absorbed all six itself (both seen in CI)."""
    server, root = request.getfixturevalue(fixture), request.getfixturevalue(corpus)
    pattern, options = SOURCES["prose"]
    local = open_source(SourceConfig(name="prose", paths=[f"{corpus_dir}/prose/{pattern}"], **options))
    _forget_open_files()
    remote = open_source(SourceConfig(name="prose", paths=[f"{root}/prose/{pattern}"], **options))
    served = len(server.faults_served())
    server.inject(kind, FAULTS[fixture])
    try:
        with caplog.at_level("WARNING", logger="zephon_titan"):
            got = [remote.read_block(b).texts for b in range(remote.num_blocks)]
    finally:
        server.inject(kind, 0)
    assert [list(t) for t in got] == [list(local.read_block(b).texts) for b in range(local.num_blocks)]
    assert len(server.faults_served()) - served == FAULTS[fixture]  # the faults did happen
    retried = [r.getMessage() for r in caplog.records if "failed, retrying in" in r.getMessage()]
    assert all(f"{root}/prose/" in m and "of 6 failed" in m for m in retried), retried
    assert retried or (fixture, kind) in (("azure", "short"), ("gcs", "short"))
