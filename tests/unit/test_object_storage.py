"""Sources in object storage, against a real S3-compatible server (moto, server mode) on loopback.

The server logs every request with the bytes it sent, so the tests can count a reader's requests
and bound the bytes it asked for.
"""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import assert_same_files_and_blocks, assert_same_lane_rows, data_table, make_spec, rows_digest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_titan.config import SourceConfig
from zephon_titan.engine import LaneStream
from zephon_titan.engine.fingerprint import check_fingerprint, fingerprint
from zephon_titan.engine.sources import globs, open_source, storage
from zephon_titan.engine.sources.base import expand_paths
from zephon_titan.engine.sources.jsonl import TAIL_READ_BYTES
from zephon_titan.engine.sources.parquet import _open as open_parquet
from zephon_titan.errors import ConfigError, ResumeError

SOURCES = {"prose": ("*.jsonl", {"block_bytes": 16384}), "code": ("*.parquet", {})}


def _gets(requests, key_suffix=""):
    return [r for r in requests if r["method"] == "GET" and r["key"].endswith(key_suffix) and not r["query"]]


def _forget_open_files():
    """What a fresh process starts with: no cached file handle or Parquet footer."""
    open_parquet.cache_clear()
    storage.open_input_file.cache_clear()


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_every_block_in_the_bucket_equals_the_same_block_on_disk(s3_corpus, corpus_dir, name):
    pattern, options = SOURCES[name]
    local = open_source(SourceConfig(name=name, paths=[f"{corpus_dir}/{name}/{pattern}"], **options))
    remote = open_source(SourceConfig(name=name, paths=[f"{s3_corpus}/{name}/{pattern}"], **options))
    assert all(f.path.startswith(f"{s3_corpus}/{name}/") for f in remote.files)
    assert_same_files_and_blocks(remote, local, name)


def test_lane_rows_from_the_bucket_equal_the_rows_from_disk(s3_corpus, corpus_dir, tokenizer_dir):
    def sources(root):
        return {
            name: {"paths": [f"{root}/{name}/{pattern}"], **options} for name, (pattern, options) in SOURCES.items()
        }

    local = make_spec(corpus_dir, tokenizer_dir, sources=sources(corpus_dir))
    remote = make_spec(corpus_dir, tokenizer_dir, sources=sources(s3_corpus))
    other_seed = make_spec(corpus_dir, tokenizer_dir, sources=sources(s3_corpus), seed=8)
    assert_same_lane_rows(local, remote, other_seed)
    # A run started on local disk may resume from the bucket once told that only the location changed.
    with pytest.raises(ResumeError, match=r"locations.code: .*mtimes.prose: "):
        check_fingerprint(fingerprint(local), fingerprint(remote))
    check_fingerprint(fingerprint(local), fingerprint(remote), allow=["locations", "mtimes"])


def test_a_jsonl_block_costs_range_requests_of_about_one_block(s3, tmp_path, prose_docs):
    data = tmp_path / "big"
    data.mkdir()
    lines = [json.dumps({"text": prose_docs[i % len(prose_docs)][:3000]}) + "\n" for i in range(2000)]
    (data / "big.jsonl").write_text("".join(lines))
    size = os.path.getsize(data / "big.jsonl")
    uri = s3.upload(str(data), "big_jsonl")
    block_bytes = 64 << 10
    remote = open_source(SourceConfig(name="big", paths=[f"{uri}/*.jsonl"], block_bytes=block_bytes))
    local = open_source(SourceConfig(name="big", paths=[str(data / "big.jsonl")], block_bytes=block_bytes))
    assert size > 20 * block_bytes
    for block in (0, 7, remote.num_blocks - 1):
        _forget_open_files()
        s3.clear_requests()
        assert remote.read_block(block).texts == local.read_block(block).texts
        gets = _gets(s3.requests(), "big.jsonl")
        assert gets and all(r["range"] for r in gets), gets
        assert sum(r["bytes"] for r in gets) <= block_bytes + 1 + TAIL_READ_BYTES
    # Negative control: the log sees a whole-object read for what it is.
    s3.clear_requests()
    storage.read_bytes(f"{uri}/big.jsonl")
    assert sum(r["bytes"] for r in _gets(s3.requests(), "big.jsonl")) == size


def test_a_parquet_row_group_costs_the_footer_and_its_column_chunk(s3, tmp_path, prose_docs):
    data = tmp_path / "pq"
    data.mkdir()
    texts = [prose_docs[i % len(prose_docs)] for i in range(600)]
    table = pa.table({"text": texts, "other": [t[::-1] for t in texts]})  # a column the reader must not fetch
    pq.write_table(table, data / "many_groups.parquet", row_group_size=30)
    size = os.path.getsize(data / "many_groups.parquet")
    meta = pq.ParquetFile(data / "many_groups.parquet").metadata
    uri = s3.upload(str(data), "pq")
    s3.clear_requests()
    source = open_source(SourceConfig(name="pq", paths=[f"{uri}/*.parquet"]))
    assert source.num_blocks == meta.num_row_groups == 20
    footer = sum(r["bytes"] for r in _gets(s3.requests()))
    assert footer <= max(64 << 10, meta.serialized_size + 8)  # the footer only, not the file
    for block in (3, 19):
        _forget_open_files()  # a fresh process: footer + row group
        s3.clear_requests()
        expected = texts[block * 30 : (block + 1) * 30]
        assert source.read_block(block).texts == expected
        chunk = meta.row_group(block).column(0).total_compressed_size
        fetched = sum(r["bytes"] for r in _gets(s3.requests(), "many_groups.parquet"))
        assert fetched <= (64 << 10) + chunk + 1024
        assert fetched < size / 4, (fetched, size)


@pytest.mark.parametrize(
    "pattern",
    [
        "*/*.jsonl",
        "**/*.parquet",
        "prose/part-0000[01].jsonl",
        "prose/part-?????.jsonl",
        "**/part-00001.*",
        "code/*",
        "*.jsonl",
    ],
)
def test_globs_in_the_bucket_match_what_local_globs_match(s3_corpus, corpus_dir, pattern):
    def names(root):
        try:
            return [
                os.path.relpath(f.path, root) if not storage.is_uri(f.path) else f.path[len(root) + 1 :]
                for f in expand_paths("s", [f"{root}/{pattern}"])
            ]
        except ConfigError:
            return "no match"

    assert names(s3_corpus) == names(corpus_dir)


def test_unknown_locations_are_named(s3, s3_corpus):
    with pytest.raises(ConfigError, match=r"path 's3://zephon-test/nothing/\*.jsonl' matches no file"):
        expand_paths("s", ["s3://zephon-test/nothing/*.jsonl"])
    with pytest.raises(ConfigError, match="cannot open 'nosuchfs://x'"):
        expand_paths("s", ["nosuchfs://x/y.jsonl"])
    with pytest.raises(
        ConfigError,
        match=r"cannot list 's3://no-such-bucket/x/\*.jsonl': bucket 'no-such-bucket' does not "
        r"exist; check the bucket name, "
        rf"the endpoint \({s3.endpoint}\) and the credentials",
    ):
        expand_paths("s", ["s3://no-such-bucket/x/*.jsonl"])


def test_with_an_index_startup_reads_one_object_per_source(s3, s3_corpus, corpus_dir, tokenizer_dir):
    sources = {
        name: {"paths": [f"{s3_corpus}/{name}/{pattern}"], "index": f"s3://zephon-test/indexes/{name}.json", **options}
        for name, (pattern, options) in SOURCES.items()
    }
    _forget_open_files()
    s3.clear_requests()
    listed = make_spec(corpus_dir, tokenizer_dir, sources=sources)  # no index yet: lists, reads footers, writes it
    first = s3.requests()
    assert sum(1 for r in first if "list-type" in r["query"]) >= 2
    assert len(_gets(first, ".parquet")) == 3  # one footer per Parquet file
    assert {r["key"] for r in first if r["method"] == "PUT"} == {
        "/zephon-test/indexes/code.json",
        "/zephon-test/indexes/prose.json",
    }
    _forget_open_files()
    s3.clear_requests()
    indexed = make_spec(corpus_dir, tokenizer_dir, sources=sources)
    # Per source one object: its index (a HEAD for the size and one GET); no listing, no footer.
    assert sorted((r["method"], r["key"]) for r in s3.requests()) == sorted(
        (method, f"/zephon-test/indexes/{name}.json") for name in SOURCES for method in ("GET", "HEAD")
    )
    assert fingerprint(indexed) == fingerprint(listed)
    for lane in (0, 3):
        assert rows_digest(LaneStream(indexed, lane).take(20)) == rows_digest(LaneStream(listed, lane).take(20))


def test_a_lance_dataset_in_the_bucket_equals_the_same_dataset_on_disk(s3, tmp_path, prose_docs):
    lance = pytest.importorskip("lance")
    table = pa.table({"text": prose_docs})
    half = len(prose_docs) // 2
    local_uri, remote_uri = str(tmp_path / "docs.lance"), "s3://zephon-test/lance/docs.lance"
    for uri, options in ((local_uri, None), (remote_uri, {"allow_http": "true"})):
        lance.write_dataset(table.slice(0, half), uri, storage_options=options)
        lance.write_dataset(table.slice(half), uri, mode="append", storage_options=options)
    local = open_source(SourceConfig(name="l", paths=[local_uri], block_rows=16))
    remote = open_source(SourceConfig(name="l", paths=[remote_uri], block_rows=16))
    assert remote.num_blocks == local.num_blocks == -(-half // 16) + -(-(len(prose_docs) - half) // 16)
    for block in range(local.num_blocks):
        assert remote.read_block(block).texts == local.read_block(block).texts


_TREE = [
    "a/b/x1.txt",
    "a/x2.txt",
    "ab/c/d/y.txt",
    "b.txt",
    "a/b/c/z1.txt",
    "ab/x1.jsonl",
    "c/a/b/x3.txt",
    ".h.txt",
    "a/.x1.txt",
    "a/.b/x1.txt",
    ".a/b.txt",
    "ab/.c/d/y.txt",
]  # dot-names: hidden from wildcards
_SEGMENTS = [
    "a",
    "b",
    "ab",
    "*",
    "?",
    "**",
    "x*",
    "*.txt",
    "[ab]",
    "[!a]*",
    "a?",
    "*1*",
    "c",
    "x?.txt",
    ".*",
    ".a",
    ".b",
    "[.]h.txt",
    "?h.txt",
]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(_SEGMENTS), min_size=1, max_size=4))
def test_object_key_globs_follow_python_glob(tmp_path_factory, segments):
    """The glob matcher used for object keys (no directories to walk) agrees with glob.glob on disk."""
    import glob

    root = tmp_path_factory.getbasetemp() / "glob_tree"
    if not root.exists():
        for rel in _TREE:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text("x")
    pattern = "/".join(segments)
    on_disk = {os.path.relpath(m, root) for m in glob.glob(str(root / pattern), recursive=True) if os.path.isfile(m)}
    regex = globs.glob_regex(pattern)
    assert {rel for rel in _TREE if regex.fullmatch(rel)} == on_disk, pattern


def test_a_naive_key_matcher_would_fail_the_glob_property():
    """Negative control: fnmatch lets `*` cross `/`, which the property above catches."""
    import fnmatch

    assert re_match(fnmatch.translate("a/*.txt"), "a/b/x1.txt") and not globs.glob_regex("a/*.txt").fullmatch(
        "a/b/x1.txt"
    )


def re_match(regex: str, text: str) -> bool:
    import re

    return re.fullmatch(regex, text) is not None


def test_a_bad_line_read_ahead_in_the_background_is_raised_where_it_is_needed(
    s3, tmp_path, corpus_dir, tokenizer_dir, prose_docs
):
    from zephon_titan.engine import DataError

    data = tmp_path / "bad"
    data.mkdir()
    lines = [json.dumps({"text": t}) + "\n" for t in prose_docs[:40]]
    lines.insert(30, '{"text": "unterminated\n')
    (data / "bad.jsonl").write_text("".join(lines))
    bad_offset = sum(len(line.encode()) for line in lines[:30])
    uri = s3.upload(str(data), "bad_jsonl")
    spec = make_spec(
        corpus_dir,
        tokenizer_dir,
        num_lanes=1,
        shuffle_window_blocks=1,
        sources={"web": {"paths": [f"{uri}/bad.jsonl"], "block_bytes": 4096}},
    )
    assert spec.sources[0].remote and spec.sources[0].num_blocks > 4
    stream = LaneStream(spec, 0)
    # Named by line (31, counted with ranged reads of the object) and byte.
    with pytest.raises(DataError, match=rf"{uri}/bad.jsonl line 31 \(at byte {bad_offset:,}\): line is not valid JSON"):
        stream.take(10_000)


def test_building_the_loader_reads_no_document(s3, s3_corpus, corpus_dir, tokenizer_dir):
    # Lane states before the first row are known without data: construction lists files and reads
    # Parquet footers (block counts), never a block of documents.
    from zephon_titan.config import config_from_dict
    from zephon_titan.titan.dataloader import ZephonDataLoader

    sources = {
        "prose": {"paths": [f"{s3_corpus}/prose/*.jsonl"], "block_bytes": 16384},
        "code": {"paths": [f"{s3_corpus}/code/*.parquet"]},
    }
    config = ZephonDataLoader.Config(
        data=config_from_dict(data_table(corpus_dir, tokenizer_dir, sources=sources)), global_batch_size=16
    )
    _forget_open_files()
    s3.clear_requests()
    loader = config.build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=32, local_batch_size=2)
    assert _gets(s3.requests(), ".jsonl") == []
    loader.state_dict()  # saving before the first step reads nothing either
    assert _gets(s3.requests(), ".jsonl") == []
    next(iter(loader))  # negative control: the first batch does read documents
    assert _gets(s3.requests(), ".jsonl")
    loader.close()


def _bucket_sources(root):
    return {name: {"paths": [f"{root}/{name}/{pattern}"], **options} for name, (pattern, options) in SOURCES.items()}


@pytest.mark.parametrize("kind", ["503", "short"])
def test_lane_rows_under_storage_faults_equal_the_rows_from_disk(s3, s3_corpus, corpus_dir, tokenizer_dir, kind):
    """JSONL and Parquet, blocks read ahead by threads: whoever absorbs the faults (the client or the block's
    attempts), the rows are the rows of the files on disk."""
    local = make_spec(corpus_dir, tokenizer_dir, sources=_bucket_sources(corpus_dir))
    want = [rows_digest(LaneStream(local, lane).take(6)) for lane in (0, 5)]
    _forget_open_files()
    remote = make_spec(corpus_dir, tokenizer_dir, sources=_bucket_sources(s3_corpus))
    served = len(s3.faults_served())
    s3.inject(kind, 8)
    try:
        got = [rows_digest(LaneStream(remote, lane).take(6)) for lane in (0, 5)]
    finally:
        s3.inject(kind, 0)
    assert got == want and len(s3.faults_served()) - served == 8


def test_a_fault_that_outlasts_the_attempts_ends_in_one_line(s3, s3_corpus, corpus_dir, tokenizer_dir, monkeypatch):
    from zephon_titan.engine.sources import retry
    from zephon_titan.errors import DataError

    monkeypatch.setattr(retry, "FIRST_DELAY_S", 0.01)  # the same attempts, sooner
    _forget_open_files()
    remote = make_spec(corpus_dir, tokenizer_dir, sources=_bucket_sources(s3_corpus))
    s3.inject("503", 10_000)
    try:
        with pytest.raises(DataError) as e:
            LaneStream(remote, 0).take(2)
    finally:
        s3.inject("503", 0)
    message = str(e.value)
    assert "\n" not in message and "gave up after 6 attempts" in message and s3_corpus in message, message


# What the providers' clients (pyarrow's S3, GCS and Azure filesystems) said, as caught from the test servers.
TRANSIENT_ERRORS = [
    "When reading information for key 'corpus/a.jsonl' in bucket 'b': AWS Error SLOW_DOWN during GetObject "
    "operation: Please reduce your request rate.",
    'google::cloud::Status(UNAVAILABLE: Retry policy exhausted, with a last message of {"error": {"code": 503, '
    '"message": "Backend Error"}}',
    "google::cloud::Status(UNAVAILABLE: Retry policy exhausted, with a last message of PerformWork() - CURL error "
    "[56]=Failure when receiving data from the peer",
    "google::cloud::Status(DEADLINE_EXCEEDED: Retry policy exhausted in Read(): Retry policy exhausted before "
    "first request attempt error_info={reason=DEADLINE_EXCEEDED, domain=gcloud-cpp}",
    "ReadAt failed to read the required byte range. Azure Error: [] Error while reading from network socket. "
    "CURLE code: 56. Failure when receiving data from the peer",
    "Azure Error: [ServerBusy] 503 The server is currently unable to receive requests.",
]
PERMANENT_ERRORS = [
    "When reading information for key 'corpus/a.jsonl' in bucket 'b': AWS Error NO_SUCH_KEY during GetObject "
    "operation: The specified key does not exist.",
    "AWS Error ACCESS_DENIED during GetObject operation: Access Denied",
    "google::cloud::Status(NOT_FOUND: Permanent error, with a last message of No such object: b/a.jsonl",
    "Azure Error: [BlobNotFound] 404 The specified blob does not exist.",
    "Azure Error: [AuthenticationFailed] 403 Server failed to authenticate the request.",
]


def test_retryable_errors_are_told_from_permanent_ones():
    from zephon_titan.engine.sources.retry import transient

    assert [transient(OSError(m)) for m in TRANSIENT_ERRORS] == [True] * len(TRANSIENT_ERRORS)
    assert [transient(OSError(m)) for m in PERMANENT_ERRORS] == [False] * len(PERMANENT_ERRORS)
    assert not transient(ValueError(TRANSIENT_ERRORS[0]))  # a bug in the reader is never retried


def test_a_missing_object_is_not_retried(s3, tmp_path, corpus_dir, tokenizer_dir, caplog):
    """A permanent error (the object deleted after the listing) is one line at once, with no retry."""
    from zephon_titan.errors import DataError

    root = s3.upload(os.path.join(corpus_dir, "prose"), "gone_prose")
    source = open_source(SourceConfig(name="prose", paths=[f"{root}/*.jsonl"], block_bytes=16384))
    s3.filesystem().delete_file(source.files[0].path.removeprefix("s3://"))
    _forget_open_files()
    with caplog.at_level("WARNING", logger="zephon_titan"), pytest.raises(DataError) as e:
        source.read_block(0)
    assert source.files[0].path in str(e.value)
    assert not [r for r in caplog.records if "retrying" in r.getMessage()]
