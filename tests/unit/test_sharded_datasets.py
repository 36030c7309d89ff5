"""Mosaic Streaming (MDS) and LitData datasets as sources, read from shards the real writers wrote
(tests/fixtures/mds_litdata: streaming.MDSWriter and litdata.optimize, uncompressed and compressed): the same documents
stored as JSONL (and their token ids as Parquet) give equal rows and ledgers, locally and from the S3 server;
`format = "auto"` tells them from JSONL by the index.json's first bytes; a changed shard or index is a named change
at resume; every doctored index.json and damaged shard is one line naming the file."""

import json
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import make_spec, rows_digest

from zephon_titan.config import SourceConfig
from zephon_titan.engine import DataError, LaneStream
from zephon_titan.engine.fingerprint import check_fingerprint, fingerprint
from zephon_titan.engine.lane_digests import step_digests
from zephon_titan.engine.lanes import LaneGroup
from zephon_titan.engine.sources import open_source, storage
from zephon_titan.errors import ConfigError, ResumeError

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "mds_litdata")
DATASETS = ["mds/plain", "mds/zstd", "mds/snappy", "litdata/plain", "litdata/zstd", "litdata/batch", "litdata/sample"]
WHOLE = {"mds/zstd", "mds/snappy", "litdata/zstd"}  # compressed whole; litdata/batch and /sample: zstd inside


def _documents() -> list[dict]:
    with open(os.path.join(FIXTURE, "documents.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _shard_samples(dataset: str) -> list[int]:
    """Samples per shard, as the writer's index.json lists them."""
    with open(os.path.join(FIXTURE, dataset, "index.json")) as f:
        index = json.load(f)
    return [s["samples"] for s in index["shards"]] if "shards" in index else [c["chunk_size"] for c in index["chunks"]]


def _shard_names(dataset: str) -> list[str]:
    with open(os.path.join(FIXTURE, dataset, "index.json")) as f:
        index = json.load(f)
    if "chunks" in index:
        return [c["filename"] for c in index["chunks"]]
    return [(s["zip_data"] or s["raw_data"])["basename"] for s in index["shards"]]


def _per_shard(dataset: str, docs: list) -> list[list]:
    out, at = [], 0
    for n in _shard_samples(dataset):
        out.append(docs[at : at + n])
        at += n
    assert at == len(docs)
    return out


def _copy(tmp_path, dataset: str) -> str:
    """A writable copy of a fixture dataset; its index.json's path."""
    target = tmp_path / dataset.replace("/", "_")
    shutil.copytree(os.path.join(FIXTURE, dataset), target)
    return str(target / "index.json")


def _jsonl(tmp_path, dataset: str, texts: list[str], name: str = "jsonl") -> str:
    """The documents as JSONL, one file per shard (one block each, as one shard with block_rows past its samples)."""
    root = tmp_path / name
    root.mkdir()
    for i, part in enumerate(_per_shard(dataset, texts)):
        (root / f"part-{i}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in part), encoding="utf-8")
    return str(root / "*.jsonl")


def _lanes(spec, rows=10):
    return [rows_digest(LaneStream(spec, lane).take(rows)) for lane in range(spec.num_lanes)]


def _ledger(spec, steps=3, rows=2):
    return list(step_digests(LaneGroup(spec, range(spec.num_lanes), rows, None, 0), len(spec.sources), 0, steps))


def _spec(corpus_dir, tokenizer_dir, paths, **extra):
    return make_spec(corpus_dir, tokenizer_dir, num_lanes=4, sources={"web": {"paths": paths, **extra}})


def _open(path, **kw) -> object:
    return open_source(SourceConfig(name="web", paths=[path], **kw))


@pytest.mark.parametrize("dataset", DATASETS)
def test_rows_and_ledger_equal_the_same_documents_as_jsonl(tmp_path, corpus_dir, tokenizer_dir, dataset):
    texts = [d["text"] for d in _documents()]
    index = os.path.join(FIXTURE, dataset, "index.json")
    spec = _spec(corpus_dir, tokenizer_dir, [index], block_rows=1 << 20)
    assert spec.sources[0].format_name == dataset.split("/")[0]  # format = "auto": told by the index's first bytes
    assert spec.sources[0].num_blocks == len(_shard_samples(dataset)) == 3
    reference = _spec(corpus_dir, tokenizer_dir, [_jsonl(tmp_path, dataset, texts)], block_bytes=1 << 30)
    assert _lanes(spec) == _lanes(reference)
    want = _ledger(reference)
    assert _ledger(spec) == want
    # Negative control: the document lane 0's first row starts with, changed in the JSONL: the ledger differs.
    piece = LaneStream(spec, 0).take(1)[0].pieces[0]
    shard = _shard_names(dataset).index(os.path.basename(piece.file))
    doc = sum(_shard_samples(dataset)[:shard]) + piece.row
    edited = [*texts[:doc], "changed " + texts[doc], *texts[doc + 1 :]]
    changed = _spec(corpus_dir, tokenizer_dir, [_jsonl(tmp_path, dataset, edited, "edited")], block_bytes=1 << 30)
    assert _ledger(changed) != want


@pytest.mark.parametrize("dataset", DATASETS)
def test_blocks_of_block_rows_samples_hold_each_document_once_in_order(dataset):
    docs = _documents()
    source = _open(os.path.join(FIXTURE, dataset, "index.json"), block_rows=7)
    compressed = dataset in WHOLE  # a shard compressed whole is one block: it cannot be read from its middle
    per_shard = [1 if compressed else -(-n // 7) for n in _shard_samples(dataset)]
    assert source.num_blocks == sum(per_shard)
    blocks = [source.read_block(b) for b in range(source.num_blocks)]
    assert [t for b in blocks for t in b.texts] == [d["text"] for d in docs]
    first = 0
    for shard, n in enumerate(per_shard):  # rows are sample numbers in the shard, files the shards
        rows = [r for b in blocks[first : first + n] for r in b.rows]
        assert rows == list(range(_shard_samples(dataset)[shard]))
        assert {b.file for b in blocks[first : first + n]} == {blocks[first].file}
        first += n
    assert len({b.file for b in blocks}) == 3
    tokens = _open(os.path.join(FIXTURE, dataset, "index.json"), token_field="tokens", block_rows=5)
    assert [list(map(int, t)) for b in range(tokens.num_blocks) for t in tokens.read_block(b).texts] == [
        d["tokens"] for d in docs
    ]


@pytest.mark.parametrize("dataset", ["mds/plain", "litdata/zstd"])
def test_a_token_column_equals_the_same_ids_as_parquet(tmp_path, corpus_dir, tokenizer_dir, dataset):
    ids = [d["tokens"] for d in _documents()]

    def parquet(name, ids):
        os.makedirs(tmp_path / name)
        for i, part in enumerate(_per_shard(dataset, ids)):
            pq.write_table(pa.table({"tokens": pa.array(part, type=pa.list_(pa.int32()))}), tmp_path / name / f"{i}.pq")
        return _spec(corpus_dir, tokenizer_dir, [str(tmp_path / name / "*.pq")], token_field="tokens")

    index = os.path.join(FIXTURE, dataset, "index.json")
    spec = _spec(corpus_dir, tokenizer_dir, [index], token_field="tokens", block_rows=1 << 20)
    want = _ledger(parquet("same", ids))
    assert _ledger(spec) == want
    piece = LaneStream(spec, 0).take(1)[0].pieces[0]  # negative control: an id of lane 0's first document changed
    doc = sum(_shard_samples(dataset)[: _shard_names(dataset).index(os.path.basename(piece.file))]) + piece.row
    ids[doc] = [ids[doc][0] % 997 + 1, *ids[doc][1:]]
    assert _ledger(parquet("changed", ids)) != want


def test_auto_tells_the_formats_apart_by_the_index_and_a_jsonl_index_stays_jsonl(tmp_path):
    assert _open(os.path.join(FIXTURE, "mds/zstd/index.json")).format_name == "mds"
    assert _open(os.path.join(FIXTURE, "litdata/plain/index.json")).format_name == "litdata"
    # Negative control: a JSON Lines file named index.json is JSONL, as before.
    (tmp_path / "index.json").write_text('{"text": "a line"}\n{"text": "another"}\n')
    jsonl = _open(str(tmp_path / "index.json"))
    assert jsonl.format_name == "jsonl" and list(jsonl.read_block(0).texts) == ["a line", "another"]
    with pytest.raises(DataError, match=r"litdata/plain/index.json: not an MDS index"):
        _open(os.path.join(FIXTURE, "litdata/plain/index.json"), format="mds")
    with pytest.raises(ConfigError, match=r"mixes formats \(litdata, mds\)"):
        open_source(
            SourceConfig(
                name="web", paths=[os.path.join(FIXTURE, d, "index.json") for d in ("mds/plain", "litdata/zstd")]
            )
        )
    with pytest.raises(DataError, match=r"no column 'content' \(columns: id, text, tokens\); set text_field"):
        _open(os.path.join(FIXTURE, "mds/plain/index.json"), text_field="content")
    with pytest.raises(DataError, match=r"column 'id' is encoded as 'int', not text"):
        _open(os.path.join(FIXTURE, "litdata/plain/index.json"), text_field="id")
    with pytest.raises(DataError, match=r"column 'text' is encoded as 'str', not a 1-D array of integer token ids"):
        _open(os.path.join(FIXTURE, "mds/plain/index.json"), token_field="text")


@pytest.mark.parametrize("dataset", ["mds/plain", "litdata/zstd"])
def test_a_changed_shard_or_index_is_a_named_change_at_resume(tmp_path, corpus_dir, tokenizer_dir, dataset):
    index = _copy(tmp_path, dataset)
    folder = os.path.dirname(index)
    before = fingerprint(_spec(corpus_dir, tokenizer_dir, [index]))
    check_fingerprint(before, fingerprint(_spec(corpus_dir, tokenizer_dir, [index])))  # negative control: unchanged
    shard = os.path.join(folder, sorted(f for f in os.listdir(folder) if f != "index.json")[1])
    os.utime(shard, ns=(1, 1))  # the same bytes, written again
    with pytest.raises(ResumeError, match=r"mtimes\.web"):
        check_fingerprint(before, fingerprint(_spec(corpus_dir, tokenizer_dir, [index])))
    with open(index) as f:
        document = json.load(f)
    key = "shards" if "shards" in document else "chunks"
    document[key] = document[key][:2]  # a shard dropped from the dataset
    with open(index, "w") as f:
        json.dump(document, f)
    with pytest.raises(ResumeError, match=r"layout\.web"):
        check_fingerprint(before, fingerprint(_spec(corpus_dir, tokenizer_dir, [index])))


def test_a_shard_changed_during_the_run_is_named_when_read(tmp_path):
    index = _copy(tmp_path, "mds/plain")
    source = _open(index, block_rows=8)
    assert source.read_block(0).texts[0]
    shard = os.path.join(os.path.dirname(index), "shard.00001.mds")
    data = open(shard, "rb").read()
    with open(shard, "wb") as f:
        f.write(data[:-1] + b"x")
    with pytest.raises(DataError, match=r"shard.00001.mds: the shard changed since it was listed"):
        source.read_block(source.num_blocks - 2)


# ---- hostile inputs: one line naming the file, before a step where it can be ----------------------------


def _one_line(excinfo, *names):
    message = str(excinfo.value)
    assert "\n" not in message and "Traceback" not in message, message
    for name in names:
        assert name in message, message
    return message


def _edit_index(index: str, edit) -> None:
    with open(index) as f:
        document = json.load(f)
    edit(document)
    with open(index, "w") as f:
        json.dump(document, f, sort_keys=True)


def _mds_shard(key, value):
    def edit(document):
        document["shards"][1][key] = value

    return edit


def _lit_chunk(key, value):
    def edit(document):
        document["chunks"][1][key] = value

    return edit


HOSTILE_INDEXES = [
    ("mds/plain", _mds_shard("samples", 2**31), r"2,147,483,648 samples cannot fit in a shard of"),
    ("mds/plain", _mds_shard("samples", "many"), r"shard 1: expected an integer in \[0, 2\*\*32\), got 'many'"),
    ("mds/plain", _mds_shard("samples", True), r"expected an integer in \[0, 2\*\*32\), got True"),
    ("mds/plain", _mds_shard("raw_data", {"basename": "../../etc/passwd", "bytes": 100}), r"outside the dataset"),
    ("mds/plain", _mds_shard("raw_data", {"basename": "shard.00001.mds", "bytes": 99999}), r"says 99,999"),
    ("mds/plain", _mds_shard("column_names", "text"), r"must be lists"),
    ("mds/plain", _mds_shard("column_names", ["a", "b", "c"]), r"shard 1 has other columns than shard 0"),
    ("mds/plain", _mds_shard("format", "jsonl"), r"format is 'jsonl'; zephon reads Streaming's 'mds'"),
    ("mds/zstd", _mds_shard("compression", "lz4"), r"compression 'lz4' is not read \(zstd, gz, bz2, br, snappy"),
    ("mds/plain", lambda d: d.update(shards={}), r"not an MDS index"),
    ("litdata/plain", _lit_chunk("chunk_size", 10**9), r"chunk 1: 1,000,000,000 samples cannot fit"),
    ("litdata/plain", _lit_chunk("filename", None), r"chunk 1: a shard's name must be a relative path, got None"),
    ("litdata/plain", lambda d: d["config"].update(item_loader="TokensLoader"), r"item_loader is 'TokensLoader'"),
    ("litdata/plain", lambda d: d["config"].update(data_spec="[1, 2]"), r"data_spec is not a pytree"),
    ("litdata/zstd", lambda d: d["config"].update(compression_level="frame"), r"compression_level 'frame' is not"),
    ("litdata/batch", lambda d: d["config"].update(compression="lz4"), r"compression 'lz4' is not read"),
]


@pytest.mark.parametrize("dataset, edit, says", HOSTILE_INDEXES, ids=[f"{d}-{s[:24]}" for d, _, s in HOSTILE_INDEXES])
def test_a_doctored_index_is_one_line_naming_it(tmp_path, dataset, edit, says):
    index = _copy(tmp_path, dataset)
    _open(index).read_block(0)  # negative control: the writer's index reads
    _edit_index(index, edit)
    with pytest.raises(DataError, match=says) as e:
        _open(index)
    _one_line(e, "index.json" if "says" not in says else "shard.00001.mds")


def test_an_index_that_is_not_json_or_too_large_is_one_line(tmp_path, monkeypatch):
    from zephon_titan.engine.sources import shard_index

    index = _copy(tmp_path, "mds/plain")
    with open(index, "r+") as f:
        f.truncate(300)  # cut mid-way: still sniffed as MDS, not JSON
    with pytest.raises(DataError, match=r"index.json: not JSON") as e:
        _open(index)
    _one_line(e)
    monkeypatch.setattr(shard_index, "MAX_INDEX_BYTES", 100)
    with pytest.raises(DataError, match=r"index.json: 300 bytes, more than the 100") as e:
        _open(index)


@pytest.mark.parametrize("dataset", ["mds/plain", "litdata/plain", "mds/zstd"])
def test_a_truncated_shard_is_named_at_startup(tmp_path, dataset):
    index = _copy(tmp_path, dataset)
    folder = os.path.dirname(index)
    shard = os.path.join(folder, sorted(f for f in os.listdir(folder) if f != "index.json")[0])
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) // 2)
    with pytest.raises(DataError, match=r"a truncated or replaced shard") as e:
        _open(index)
    _one_line(e, shard)


def test_a_missing_shard_is_named(tmp_path):
    index = _copy(tmp_path, "litdata/plain")
    os.remove(os.path.join(os.path.dirname(index), "chunk-0-1.bin"))
    with pytest.raises(DataError, match=r"chunk-0-1.bin: named by .*index.json, but it cannot be read") as e:
        _open(index)
    _one_line(e)


def _rewrite_shard(path: str, edit) -> None:
    """Edit a shard's bytes in place, keeping its size (so startup's size check passes)."""
    data = bytearray(open(path, "rb").read())
    edit(data)
    open(path, "wb").write(bytes(data))


@pytest.mark.parametrize(
    "edit, says",
    [
        (lambda d: d.__setitem__(slice(0, 4), (7).to_bytes(4, "little")), r"holds 7 samples, its index.json says"),
        (lambda d: d.__setitem__(slice(8, 12), (10**6).to_bytes(4, "little")), r"out of order|cut short"),
        (lambda d: d.__setitem__(slice(4, 8), (0).to_bytes(4, "little")), r"out of order"),
    ],
)
def test_a_damaged_shard_is_one_line_naming_it(tmp_path, edit, says):
    index = _copy(tmp_path, "mds/plain")
    shard = os.path.join(os.path.dirname(index), "shard.00000.mds")
    _rewrite_shard(shard, edit)
    source = _open(index)
    with pytest.raises(DataError, match=says) as e:
        list(source.read_block(0).texts)
    _one_line(e, shard)


def test_a_sample_whose_sizes_do_not_add_up_is_named_with_its_number(tmp_path):
    index = _copy(tmp_path, "litdata/plain")
    shard = os.path.join(os.path.dirname(index), "chunk-0-0.bin")
    data = bytearray(open(shard, "rb").read())
    (start,) = np.frombuffer(bytes(data[8:12]), "<u4")  # sample 1's first byte: its text's size
    data[start : start + 4] = (10**5).to_bytes(4, "little")
    open(shard, "wb").write(bytes(data))
    texts = _open(index).read_block(0).texts
    assert texts[0] == _documents()[0]["text"]  # the samples before it read
    with pytest.raises(DataError, match=r"chunk-0-0.bin sample 1: its column sizes do not add up") as e:
        texts[1]
    _one_line(e)


def test_a_compressed_shard_that_inflates_past_its_stated_size_is_refused_without_holding_it(tmp_path):
    index = _copy(tmp_path, "mds/zstd")
    _edit_index(index, lambda d: d["shards"][0]["raw_data"].update(bytes=1000))
    source = _open(index)
    with pytest.raises(DataError, match=r"shard.00000.mds.zstd: decompresses to more than the 1,000 bytes") as e:
        source.read_block(0)
    _one_line(e)
    index = _copy(tmp_path / "cut", "mds/zstd")
    shard = os.path.join(os.path.dirname(index), "shard.00002.mds.zstd")
    _rewrite_shard(shard, lambda d: d.__setitem__(slice(20, 40), b"\xff" * 20))
    with pytest.raises(DataError, match=r"shard.00002.mds.zstd: cannot decompress as zstd|decompresses to") as e:
        _open(index).read_block(2)
    _one_line(e)


# ---- the source index and object storage -----------------------------------------------------------------


def test_an_index_gives_the_same_source_and_a_doctored_record_is_refused(tmp_path):
    dataset = _copy(tmp_path, "mds/plain")
    saved = tmp_path / "web.index.json"
    first = _open(dataset, block_rows=8, index=str(saved))
    again = _open(dataset, block_rows=8, index=str(saved))
    assert again.files == first.files and again.read_block(3).texts == first.read_block(3).texts
    document = json.loads(saved.read_text())
    blocks = first.num_blocks
    document["files"][0][3] += 1
    saved.write_text(json.dumps(document))
    with pytest.raises(
        ConfigError, match=rf"num_blocks is {blocks + 1}, but its shards in blocks of 8 samples make {blocks}"
    ):
        _open(dataset, block_rows=8, index=str(saved))
    document["files"][0][3] -= 1
    document["files"][0][4][0] -= 8  # shard 0 with 8 samples fewer (and a block fewer): its index.json disagrees
    document["files"][0][3] -= 1
    saved.write_text(json.dumps(document))
    with pytest.raises(DataError, match=r"its shards are not the ones listed"):
        _open(dataset, block_rows=8, index=str(saved)).read_block(0)


def test_datasets_in_the_bucket_equal_them_on_disk_read_by_ranges(s3, tmp_path, corpus_dir, tokenizer_dir):
    uri = s3.upload(FIXTURE, "sharded")
    for dataset in DATASETS:
        local = _open(os.path.join(FIXTURE, dataset, "index.json"), block_rows=8)
        remote = _open(f"{uri}/{dataset}/index.json", block_rows=8)
        assert remote.format_name == local.format_name and remote.num_blocks == local.num_blocks
        for block in (0, remote.num_blocks - 1):
            storage.open_input_file.cache_clear()
            s3.clear_requests()
            mine, theirs = remote.read_block(block), local.read_block(block)
            assert list(mine.texts) == list(theirs.texts) and mine.rows == theirs.rows
            gets = [r for r in s3.requests() if r["method"] == "GET" and not r["query"]]
            if dataset not in WHOLE:  # an uncompressed or framed shard's block: range requests only
                assert gets and all(r["range"] for r in gets), gets
                assert sum(r["bytes"] for r in gets) < (1000 if dataset == "litdata/batch" else 3000), gets
        sources = {"web": {"paths": [os.path.join(FIXTURE, dataset, "index.json")]}}
        on_disk = fingerprint(make_spec(corpus_dir, tokenizer_dir, sources=sources))
        sources = {"web": {"paths": [f"{uri}/{dataset}/index.json"]}}
        in_bucket = fingerprint(make_spec(corpus_dir, tokenizer_dir, sources=sources))
        with pytest.raises(ResumeError, match=r"locations.web"):
            check_fingerprint(on_disk, in_bucket)
        check_fingerprint(on_disk, in_bucket, allow=["locations", "mtimes"])


def test_init_samples_a_dataset_folder_and_writes_a_job_that_reads_it(tmp_path, tokenizer_dir, monkeypatch, capsys):
    from zephon_titan.cli import main

    shutil.copytree(os.path.join(FIXTURE, "litdata", "zstd"), tmp_path / "lit")
    monkeypatch.chdir(tmp_path)
    assert main(["init", "lit", "--tokenizer", tokenizer_dir, "--gpus", "1,2", "-o", "job.toml"]) == 0
    said = capsys.readouterr().out
    assert "lit: litdata, 1 file" in said and " 90 documents" in said and "text_field 'text'" in said, said
    job = (tmp_path / "job.toml").read_text()
    assert 'paths = ["lit/**/*index.json"]' in job, job
    # Negative control: without its index.json the folder is no dataset; its chunks end in .bin, Megatron's ending.
    os.remove(tmp_path / "lit" / "index.json")
    assert main(["init", "lit", "--tokenizer", tokenizer_dir, "-o", "other.toml"]) == 2
    assert "chunk-0-0.zstd.idx beside it; a Megatron dataset" in capsys.readouterr().err


def test_keep_on_a_column_is_refused_in_one_line_and_a_numeric_repeat_reads(corpus_dir, tokenizer_dir):
    """The formats' other columns are not read for keep and repeat yet: a condition on one is refused, saying so
    (not that the files hold no columns); a repeat that is a number needs none and reads as for any format."""
    from zephon_titan.errors import ConfigError

    index = os.path.join(FIXTURE, DATASETS[0], "index.json")
    with pytest.raises(
        ConfigError, match=r"keep or repeat reads 'id', but \w+ files hold columns this loader does"
    ) as e:
        _spec(corpus_dir, tokenizer_dir, [index], keep="id > 3")
    assert "\n" not in str(e.value) and "only token ids" not in str(e.value)
    repeated = _spec(corpus_dir, tokenizer_dir, [index], repeat="2")
    assert repeated.sources[0].slots == 2 and _ledger(repeated)  # two slots per document, read as any format's


def _documents_read(spec) -> list[str]:
    """Every document of the source's blocks, in block order."""
    source = spec.sources[0]
    return [str(t) for b in range(source.num_blocks) for t in source.read_block(b).texts]


def test_a_merged_root_index_reads_its_parts_once_and_both_together_are_refused(corpus_dir, tokenizer_dir):
    """Mosaic's merge_index writes a root index.json (its keys not sorted: "version" first) naming the shards of the
    per-rank folders, each with its own index.json. The root alone and the parts alone read every document once;
    `**/index.json` lists both, which would read every sample twice: one line naming a shard and both indexes."""
    merged = os.path.join(FIXTURE, "mds/merged")
    texts = sorted(d["text"] for d in _documents())
    root = _spec(corpus_dir, tokenizer_dir, [os.path.join(merged, "index.json")])
    parts = _spec(corpus_dir, tokenizer_dir, [os.path.join(merged, "*", "index.json")])
    assert root.sources[0].format_name == parts.sources[0].format_name == "mds"
    assert sorted(_documents_read(root)) == sorted(_documents_read(parts)) == texts
    with pytest.raises(ConfigError) as refused:
        _spec(corpus_dir, tokenizer_dir, [os.path.join(merged, "**", "index.json")])
    message = str(refused.value)
    assert "is named by both" in message and os.path.join(merged, "index.json") in message
    assert "read twice" in message and len(message.splitlines()) == 1
