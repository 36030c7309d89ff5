"""Hugging Face Hub datasets (`hf://datasets/<org>/<name>@<commit>/<glob>`) through huggingface_hub's
HfFileSystem, against a stand-in for the Hub's file API on loopback (tests/hubserver.py, HF_ENDPOINT):
the way HfFileSystem really reads (repo and revision check, tree listing, ranged `resolve` GETs). The
Hub cache layout with HF_HUB_OFFLINE=1 is not used: HfFileSystem lists and reads over HTTP only."""

from __future__ import annotations

import os
import shutil

import pyarrow.parquet as pq
import pytest
from helpers import assert_same_files_and_blocks, listing_error, make_spec

from zephon_titan.config import SourceConfig
from zephon_titan.engine.fingerprint import check_fingerprint, fingerprint
from zephon_titan.engine.sources import open_source, storage
from zephon_titan.engine.sources.base import expand_paths
from zephon_titan.engine.sources.clouds import HUB_BLOCK_BYTES
from zephon_titan.engine.sources.parquet import _open as open_parquet
from zephon_titan.errors import ConfigError, ResumeError


@pytest.fixture(scope="module")
def dataset(hub, corpus_dir):
    """The test corpus's Parquet files as the Hub dataset zephon/code, at one commit: its hf:// URI."""
    return hub.publish(os.path.join(corpus_dir, "code"), "zephon/code")


def test_every_block_of_a_hub_dataset_equals_the_same_block_on_disk(dataset, corpus_dir):
    local = open_source(SourceConfig(name="code", paths=[f"{corpus_dir}/code/*.parquet"]))
    remote = open_source(SourceConfig(name="code", paths=[f"{dataset}/*.parquet"]))
    assert all(f.path.startswith(dataset + "/") for f in remote.files)
    assert_same_files_and_blocks(remote, local, "code")


def test_a_row_group_costs_range_requests_of_its_column_chunk_and_the_read_ahead(hub, dataset, corpus_dir):
    source = open_source(SourceConfig(name="code", paths=[f"{dataset}/*.parquet"]))
    first = source.files[0]
    meta = pq.ParquetFile(os.path.join(corpus_dir, "code", os.path.basename(first.path))).metadata
    open_parquet.cache_clear()
    storage.open_input_file.cache_clear()
    hub.clear_requests()
    source.read_block(1)
    gets = [r for r in hub.requests() if "/resolve/" in r["key"]]
    assert gets and all(r["range"] for r in gets), gets  # ranged reads only
    chunk = meta.row_group(1).column(0).total_compressed_size
    assert sum(r["bytes"] for r in gets) <= meta.serialized_size + 8 + chunk + 3 * HUB_BLOCK_BYTES
    assert sum(r["bytes"] for r in gets) < first.size or first.size < 4 * HUB_BLOCK_BYTES


def test_the_commit_is_in_the_fingerprint(hub, dataset, corpus_dir, tokenizer_dir, tmp_path):
    """Another commit of the same dataset, even with the same files, is another dataset to a resume."""
    shutil.copytree(os.path.join(corpus_dir, "code"), tmp_path / "code")
    (tmp_path / "code" / "README.md").write_text("a new commit, the same Parquet files\n")
    other_commit = hub.publish(str(tmp_path / "code"), "zephon/code")
    assert other_commit != dataset

    def spec(uri):
        return make_spec(corpus_dir, tokenizer_dir, sources={"code": {"paths": [f"{uri}/*.parquet"]}})

    with pytest.raises(ResumeError, match=r"changed: locations.code: "):  # resume_allow's "locations" only
        check_fingerprint(fingerprint(spec(dataset)), fingerprint(spec(other_commit)))


@pytest.mark.parametrize(
    "path",
    ["hf://datasets/zephon/code/*.parquet", "hf://datasets/zephon/code@main/*.parquet", "hf://datasets/zephon/*"],
)
def test_a_hub_path_without_a_commit_is_refused(hub, path):
    with pytest.raises(ConfigError) as error:
        expand_paths("s", [path])
    message = str(error.value)
    assert "\n" not in message and f"path {path!r} does not name a dataset at a commit" in message, message
    assert "dataset_info('<org>/<name>', revision='main').sha" in message


def test_a_missing_dataset_or_commit_is_one_line_naming_the_url(hub, dataset):
    missing = "hf://datasets/zephon/nothing@" + "0" * 40 + "/*.parquet"
    wrong_commit = dataset.rsplit("@", 1)[0] + "@" + "1" * 40 + "/*.parquet"
    for path in (missing, wrong_commit):
        with pytest.raises(ConfigError) as error:
            expand_paths("s", [path])
        message = str(error.value)
        assert "\n" not in message and f"cannot list {path!r}: " in message, message
        assert hub.endpoint in message and "HF_TOKEN" in message and hub.token not in message, message


def test_a_wrong_token_is_one_line_that_does_not_show_it(hub, dataset, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_ZephonWrongToken")
    message = listing_error(f"{dataset}/*.parquet")
    assert f"cannot list '{dataset}/*.parquet': " in message and "401" in message, message
    assert "hf_ZephonWrongToken" not in message and hub.token not in message
