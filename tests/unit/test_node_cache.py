"""The node cache of whole objects (engine/sources/node_cache.py): compressed JSONL files in the S3 test server
(moto, server mode, which logs every request), read with and without a cache folder shared by processes."""

from __future__ import annotations

import errno
import fcntl
import gzip
import json
import logging
import os
import subprocess
import sys
import time

import pytest
from helpers import make_spec, rows_digest

from zephon_titan.config import SourceConfig
from zephon_titan.engine import LaneStream
from zephon_titan.engine.fingerprint import check_fingerprint, fingerprint
from zephon_titan.engine.sources import node_cache, open_source, storage
from zephon_titan.engine.sources.storage import StorageOptions
from zephon_titan.errors import DataError, ResumeError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _write_gz(folder, docs, num_files=4, level=9) -> None:
    os.makedirs(folder, exist_ok=True)
    for i in range(num_files):
        lines = "".join(json.dumps({"text": t}) + "\n" for t in docs[i::num_files])
        with open(os.path.join(folder, f"part-{i}.jsonl.gz"), "wb") as f:
            f.write(gzip.compress(lines.encode(), level, mtime=0))


@pytest.fixture(scope="module")
def gz_uri(s3, tmp_path_factory, prose_docs) -> str:
    """The prose documents as 4 gzip JSONL objects (one block each) in the bucket."""
    folder = tmp_path_factory.mktemp("gz")
    _write_gz(str(folder), prose_docs)
    return s3.upload(str(folder), "node_cache_gz")


def _texts(source) -> list[list[str]]:
    return [list(source.read_block(b).texts) for b in range(source.num_blocks)]


def _data_gets(s3, prefix: str) -> list[dict]:
    return [r for r in s3.requests() if r["method"] == "GET" and r["range"] and prefix in r["key"]]


def _gz_source(uri: str, cache_dir: str = "", max_bytes: int = 64 << 30):
    options = StorageOptions(cache_dir=cache_dir, cache_max_bytes=max_bytes)
    return open_source(SourceConfig(name="prose", paths=[f"{uri}/*.jsonl.gz"]), options=options)


def test_lane_rows_with_the_cache_equal_the_rows_without(gz_uri, corpus_dir, tokenizer_dir, tmp_path):
    def spec(**overrides):
        return make_spec(corpus_dir, tokenizer_dir, sources={"prose": {"paths": [f"{gz_uri}/*.jsonl.gz"]}}, **overrides)

    cache = str(tmp_path / "cache")
    without, other_seed = spec(), spec(seed=8)
    for lane in (0, 5):
        expected = rows_digest(LaneStream(without, lane).take(20))
        assert rows_digest(LaneStream(spec(cache_dir=cache), lane).take(20)) == expected  # downloads (lane 0)
        assert rows_digest(LaneStream(spec(cache_dir=cache), lane).take(20)) == expected  # the node's copies
        assert rows_digest(LaneStream(other_seed, lane).take(20)) != expected  # the comparison can fail
    assert len([n for n in os.listdir(cache) if n.endswith(".data")]) == 4
    assert fingerprint(spec(cache_dir=cache)) == fingerprint(without)


_READER = """
import hashlib, json, sys
from zephon_titan.config import SourceConfig
from zephon_titan.engine.sources import open_source
from zephon_titan.engine.sources.storage import StorageOptions
source = open_source(SourceConfig(name="prose", paths=[sys.argv[1] + "/*.jsonl.gz"]), options=StorageOptions(cache_dir=sys.argv[2]))
texts = [list(source.read_block(b).texts) for b in range(source.num_blocks)]
print(hashlib.sha256(json.dumps(texts).encode()).hexdigest())
"""


def test_two_processes_sharing_a_cache_download_each_object_once(s3, gz_uri, tmp_path):
    cache = str(tmp_path / "cache")
    env = {**os.environ, **s3.env, "PYTHONPATH": REPO}
    s3.clear_requests()
    ranks = [
        subprocess.Popen([sys.executable, "-c", _READER, gz_uri, cache], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    digests = {rank.communicate(timeout=60)[0].strip() for rank in ranks}
    assert all(rank.returncode == 0 for rank in ranks)
    assert len(digests) == 1
    gets = _data_gets(s3, "node_cache_gz/")
    assert sorted(r["key"] for r in gets) == sorted(f"/zephon-test/node_cache_gz/part-{i}.jsonl.gz" for i in range(4))
    # Negative control: two readers without the cache (fresh handles, as in two processes) download each twice.
    s3.clear_requests()
    for _ in range(2):
        storage.open_input_file.cache_clear()
        _texts(_gz_source(gz_uri))
    assert len(_data_gets(s3, "node_cache_gz/")) == 8


def test_a_rewritten_object_is_never_served_from_the_cache(s3, tmp_path, prose_docs):
    folder, cache = str(tmp_path / "data"), str(tmp_path / "cache")
    _write_gz(folder, prose_docs[:40], num_files=1, level=0)  # stored: the size is the text's
    uri = s3.upload(folder, "node_cache_rewritten")
    before = _gz_source(uri, cache)
    old = _texts(before)
    time.sleep(1.1)  # a listing's mtime is to the second: the rewrite gets another
    reversed_docs = [t[::-1] for t in prose_docs[:40]]  # the same size, other bytes
    _write_gz(folder, reversed_docs, num_files=1, level=0)
    assert os.path.getsize(f"{folder}/part-0.jsonl.gz") == before.files[0].size
    s3.upload(folder, "node_cache_rewritten")
    after = _gz_source(uri, cache)
    assert (after.files[0].size, after.files[0].mtime_ns) != (before.files[0].size, before.files[0].mtime_ns)
    assert _texts(after) == [reversed_docs] != old
    # A source listed before the rewrite, with no copy on its node, is refused as today (not cached under its key).
    storage.open_input_file.cache_clear()
    with pytest.raises(DataError, match="part-0.jsonl.gz: it was replaced since it was listed"):
        _stale_read(before, tmp_path)
    assert not [n for n in os.listdir(tmp_path / "stale") if n.endswith(".data")]


def _stale_read(before, tmp_path):
    """Block 0 of `before` (listed before the rewrite) through an empty cache folder."""
    before.storage_options = StorageOptions(cache_dir=str(tmp_path / "stale"))
    before.set_pipelines(before.era_pipelines, before.slots)  # forget the block it holds
    return before.read_block(0)


def test_a_run_resumed_on_a_rewritten_object_is_refused_with_the_cache(
    s3, tmp_path, prose_docs, corpus_dir, tokenizer_dir
):
    folder, cache = str(tmp_path / "data"), str(tmp_path / "cache")
    _write_gz(folder, prose_docs[:40], num_files=1)
    uri = s3.upload(folder, "node_cache_resumed")

    def spec():
        sources = {"prose": {"paths": [f"{uri}/*.jsonl.gz"]}}
        return make_spec(corpus_dir, tokenizer_dir, sources=sources, cache_dir=cache)

    saved = spec()
    LaneStream(saved, 0).take(2)
    _write_gz(folder, prose_docs[:39], num_files=1)
    s3.upload(folder, "node_cache_resumed")
    with pytest.raises(ResumeError, match="prose"):
        check_fingerprint(fingerprint(saved), fingerprint(spec()))


def _fake(size: int, downloads: list[str], name: str):
    def download() -> bytes:
        downloads.append(name)
        return name.encode().ljust(size, b".")

    return download


def test_the_size_limit_evicts_the_least_recently_used_and_says_when_it_thrashes(tmp_path, caplog):
    cache, downloads = node_cache.NodeCache(str(tmp_path / "c"), max_bytes=2500), []
    fetch = lambda name: cache.fetch(f"s3://b/{name}", 1000, 1, _fake(1000, downloads, name))  # noqa: E731
    assert [fetch(n)[:1] for n in "ab"] == [b"a", b"b"]
    fetch("a")  # a is now the more recently used
    fetch("c")  # over the limit: b goes
    fetch("a")
    assert downloads == ["a", "b", "c"] and cache.stats["evictions"] == 1
    # An entry another process holds is never evicted, however old.
    with open(cache._path(node_cache.key_of("s3://b/a", 1000, 1), "lock")) as held:
        fcntl.flock(held, fcntl.LOCK_SH)
        os.utime(cache._path(node_cache.key_of("s3://b/a", 1000, 1), "data"), (0, 0))
        fetch("d")
    assert os.path.exists(cache._path(node_cache.key_of("s3://b/a", 1000, 1), "data"))
    assert "thrash" not in caplog.text and "fetched again" not in caplog.text
    # A working set of 4 in room for 2: every round evicts what the next one needs.
    with caplog.at_level(logging.WARNING, logger="zephon_titan"):
        for _ in range(3):
            for n in "abcd":
                fetch(n)
    notes = [r.message for r in caplog.records if "fetched again" in r.message]
    assert len(notes) == 1, notes
    assert "cache_max_bytes = 2,500; raise it to at least" in notes[0]
    assert sum(os.path.getsize(p) for p in tmp_path.glob("c/*.data")) <= 2500


def test_a_cache_folder_that_cannot_be_written_is_one_warning(s3, gz_uri, tmp_path, caplog):
    (tmp_path / "a_file").write_text("in the way")
    expected = _texts(_gz_source(gz_uri))
    node_cache._cache.cache_clear()
    with caplog.at_level(logging.WARNING, logger="zephon_titan"):
        assert _texts(_gz_source(gz_uri, str(tmp_path / "a_file" / "cache"))) == expected
    warnings = [r.message for r in caplog.records if "node cache" in r.message]
    assert len(warnings) == 1 and "cannot be used" in warnings[0] and "\n" not in warnings[0], warnings


def test_a_full_disk_is_one_warning_and_the_bytes_still_come(tmp_path, caplog, monkeypatch):
    def full(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(node_cache.os, "replace", full)
    cache, downloads = node_cache.NodeCache(str(tmp_path / "c"), max_bytes=1 << 20), []
    with caplog.at_level(logging.WARNING, logger="zephon_titan"):
        assert [cache.fetch(f"s3://b/{n}", 10, 1, _fake(10, downloads, n))[:1] for n in "aba"] == [b"a", b"b", b"a"]
    warnings = [r.message for r in caplog.records if "node cache" in r.message]
    assert len(warnings) == 1 and "it is full" in warnings[0], warnings
    assert cache.off and not list(tmp_path.glob("c/*.tmp*")) and not list(tmp_path.glob("c/*.data"))


def test_readers_racing_for_one_object_download_it_once(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    cache, downloads = node_cache.NodeCache(str(tmp_path / "c"), max_bytes=1 << 20), []

    def slow(name):  # long enough that every reader arrives while the first downloads
        time.sleep(0.2)
        return _fake(100, downloads, name)()

    with ThreadPoolExecutor(8) as pool:  # each thread opens the lock file itself, as a process does
        got = list(pool.map(lambda _: cache.fetch("s3://b/x", 100, 1, lambda: slow("x")), range(8)))
    assert downloads == ["x"] and len(set(got)) == 1 and cache.stats["hits"] == 7
