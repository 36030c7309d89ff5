"""The source index: written on first use or by `zephon-titan index`, used instead of listing, covered by
the fingerprint, and never trusted for a file that changed after it was written."""

from __future__ import annotations

import json
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import make_spec, rows_digest

from zephon_titan.cli import main
from zephon_titan.engine import DataError, LaneStream, open_lane_group
from zephon_titan.engine.fingerprint import check_fingerprint, fingerprint
from zephon_titan.errors import ConfigError, ResumeError


@pytest.fixture
def corpus(tmp_path, corpus_dir) -> str:
    """A private copy of the test corpus (these tests change files)."""
    root = str(tmp_path / "corpus")
    shutil.copytree(corpus_dir, root)
    return root


def _sources(corpus, **extra):
    return {
        "code": {"paths": [f"{corpus}/code/*.parquet"], "index": f"{corpus}/code.index.json", **extra},
        "prose": {
            "paths": [f"{corpus}/prose/*.jsonl"],
            "block_bytes": 16384,
            "index": f"{corpus}/prose.index.json",
            **extra,
        },
    }


def test_written_on_first_use_then_read_instead_of_listing(corpus, tokenizer_dir):
    listed = make_spec(corpus, tokenizer_dir, sources=_sources(corpus))
    index = json.load(open(f"{corpus}/prose.index.json"))
    assert index["format"] == "jsonl" and index["block_bytes"] == 16384 and len(index["files"]) == 3
    # Proof that the index, not a listing, is used: a file added under the glob is not seen.
    shutil.copy(f"{corpus}/prose/part-00000.jsonl", f"{corpus}/prose/part-00009.jsonl")
    indexed = make_spec(corpus, tokenizer_dir, sources=_sources(corpus))
    relisted = make_spec(corpus, tokenizer_dir, sources=_sources(corpus, index=""))
    assert fingerprint(indexed) == fingerprint(listed) != fingerprint(relisted)
    assert rows_digest(LaneStream(indexed, 2).take(20)) == rows_digest(LaneStream(listed, 2).take(20))


def test_worker_processes_use_the_listing_of_the_process_that_started_them(corpus, tokenizer_dir):
    spec = make_spec(corpus, tokenizer_dir)  # no index: listed once, here
    with open_lane_group(spec, range(8), 2, num_workers=0) as group:
        expected = [group.next_step() for _ in range(3)]
    shutil.copy(f"{corpus}/prose/part-00000.jsonl", f"{corpus}/prose/part-00009.jsonl")  # a listing would see it
    with open_lane_group(spec, range(8), 2, num_workers=2) as group:
        got = [group.next_step() for _ in range(3)]
    assert [[rows_digest(r) for r in step] for step in got] == [[rows_digest(r) for r in step] for step in expected]


def test_the_fingerprint_covers_the_index(corpus, tokenizer_dir):
    saved = fingerprint(make_spec(corpus, tokenizer_dir, sources=_sources(corpus)))
    path = f"{corpus}/prose.index.json"
    index = json.load(open(path))
    index["files"].pop()
    json.dump(index, open(path, "w"))
    doctored = fingerprint(make_spec(corpus, tokenizer_dir, sources=_sources(corpus)))
    with pytest.raises(ResumeError, match=r"files\.prose: 3 files.* -> 2 files"):
        check_fingerprint(saved, doctored)


def test_a_file_changed_after_the_index_is_named_when_read(corpus, tokenizer_dir):
    spec = make_spec(corpus, tokenizer_dir, sources=_sources(corpus))
    with open(f"{corpus}/prose/part-00001.jsonl", "a") as f:
        f.write(json.dumps({"text": "appended later"}) + "\n")
    table = pq.read_table(f"{corpus}/code/part-00002.parquet")
    pq.write_table(table, f"{corpus}/code/part-00002.parquet", row_group_size=3)
    with pytest.raises(DataError, match=r"part-00001\.jsonl: it now has .* bytes, but it had .* the file changed"):
        for block in range(spec.sources[1].num_blocks):
            spec.sources[1].read_block(block)
    with pytest.raises(DataError, match=r"part-00002\.parquet: it now has [0-9,]+ bytes, .* the file changed"):
        for block in range(spec.sources[0].num_blocks):
            spec.sources[0].read_block(block)


def test_an_index_for_other_settings_or_not_an_index_is_refused(corpus, tokenizer_dir):
    make_spec(corpus, tokenizer_dir, sources=_sources(corpus))
    sources = _sources(corpus)
    sources["prose"]["block_bytes"] = 4096
    with pytest.raises(
        ConfigError,
        match=r"prose.index.json was written for other settings \(block_bytes: 16384 "
        r"-> 4096\); rebuild it with `zephon-titan index",
    ):
        make_spec(corpus, tokenizer_dir, sources=sources)
    with open(f"{corpus}/code.index.json", "w") as f:
        f.write("not json")
    with pytest.raises(ConfigError, match="code.index.json is not a zephon index"):
        make_spec(corpus, tokenizer_dir, sources=_sources(corpus))


def test_the_index_command_writes_and_checks(tmp_path, corpus, tokenizer_dir, capsys):
    job = tmp_path / "job.toml"
    job.write_text(f"""
[model]
module = "llama3"
config = "llama3_debugmodel"
[dataloader]
tokenizer_path = "{tokenizer_dir}"
[dataloader.sources.code]
paths = ["{corpus}/code/*.parquet"]
index = "{corpus}/code.index.json"
[dataloader.sources.prose]
paths = ["{corpus}/prose/*.jsonl"]
""")
    assert main(["index", str(job), "--check"]) == 1
    assert "code.index.json: STALE: missing" in capsys.readouterr().out
    assert main(["index", str(job)]) == 0
    assert "code: wrote" in capsys.readouterr().out and os.path.exists(f"{corpus}/code.index.json")
    assert main(["index", str(job), "--check"]) == 0
    assert "up to date" in capsys.readouterr().out
    pq.write_table(pa.table({"text": ["new"]}), f"{corpus}/code/part-00007.parquet")
    assert main(["index", str(job), "--check"]) == 1
    assert "part-00007.parquet is new" in capsys.readouterr().out
    job.write_text(job.read_text().replace(f'index = "{corpus}/code.index.json"', ""))
    assert main(["index", str(job)]) == 2
    assert "no source of" in capsys.readouterr().err
