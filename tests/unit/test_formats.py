"""Every format yields the same rows as the same documents stored as plain JSONL (where comparable)."""

import gzip
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import make_spec, rows_digest

from zephon_titan.engine import DataError, LaneStream


def _lanes(spec, rows=12):
    return [rows_digest(LaneStream(spec, lane).take(rows)) for lane in range(spec.num_lanes)]


def _source(paths, **extra):
    return {"web": {"paths": paths, "block_bytes": 1 << 30, **extra}}


@pytest.mark.parametrize("codec, suffix", [("gzip", ".gz"), ("zstd", ".zst")])
def test_compressed_jsonl_equals_plain_jsonl(tmp_path, plain, corpus_dir, tokenizer_dir, codec, suffix):
    for name in sorted(os.listdir(plain)):
        with pa.output_stream(str(tmp_path / (name + suffix)), compression=codec) as out:
            out.write((plain / name).read_bytes())
    reference = make_spec(corpus_dir, tokenizer_dir, sources=_source([str(plain / "*.jsonl")]))
    compressed = make_spec(corpus_dir, tokenizer_dir, sources=_source([str(tmp_path / f"*.jsonl{suffix}")]))
    assert compressed.sources[0].num_blocks == reference.sources[0].num_blocks == 3
    assert _lanes(compressed) == _lanes(reference)


def test_corrupt_compressed_file_is_named(tmp_path, corpus_dir, tokenizer_dir):
    (tmp_path / "bad.jsonl.gz").write_bytes(gzip.compress(b'{"text": "x"}\n')[:-8] + b"garbage!")
    spec = make_spec(corpus_dir, tokenizer_dir, sources=_source([str(tmp_path / "bad.jsonl.gz")]), num_lanes=1)
    with pytest.raises(DataError, match=r"bad.jsonl.gz: cannot decompress as gzip"):
        LaneStream(spec, 0).take(1)


def test_parquet_text_column_equals_plain_jsonl(tmp_path, plain, corpus_dir, tokenizer_dir):
    for name in sorted(os.listdir(plain)):
        docs = [json.loads(line)["text"] for line in (plain / name).read_text(encoding="utf-8").splitlines()]
        pq.write_table(pa.table({"content": docs}), tmp_path / (name + ".parquet"), row_group_size=10**6)
    reference = make_spec(corpus_dir, tokenizer_dir, sources=_source([str(plain / "*.jsonl")]))
    parquet = make_spec(
        corpus_dir, tokenizer_dir, sources={"web": {"paths": [str(tmp_path / "*.parquet")], "text_field": "content"}}
    )
    assert _lanes(parquet) == _lanes(reference)


def test_pretokenized_parquet_equals_tokenizing_the_text(tmp_path, plain, corpus_dir, tokenizer_dir):
    reference = make_spec(corpus_dir, tokenizer_dir, sources=_source([str(plain / "*.jsonl")]))
    bare = reference.tokenizer.tokenizer
    for name in sorted(os.listdir(plain)):
        docs = [json.loads(line)["text"] for line in (plain / name).read_text(encoding="utf-8").splitlines()]
        ids = [e.ids for e in bare.encode_batch(docs, add_special_tokens=False)]
        pq.write_table(
            pa.table({"tokens": pa.array(ids, type=pa.list_(pa.int32()))}),
            tmp_path / (name + ".parquet"),
            row_group_size=10**6,
        )
    pretokenized = make_spec(
        corpus_dir, tokenizer_dir, sources={"web": {"paths": [str(tmp_path / "*.parquet")], "token_field": "tokens"}}
    )
    assert _lanes(pretokenized) == _lanes(reference)


def test_out_of_vocabulary_token_ids_are_named(tmp_path, corpus_dir, tokenizer_dir):
    pq.write_table(
        pa.table({"tokens": pa.array([[1, 2, 3], [4, 99999]], type=pa.list_(pa.int64()))}), tmp_path / "ids.parquet"
    )
    spec = make_spec(
        corpus_dir,
        tokenizer_dir,
        num_lanes=1,
        sources={"web": {"paths": [str(tmp_path / "ids.parquet")], "token_field": "tokens"}},
    )
    with pytest.raises(DataError, match=r"ids.parquet row 1: token id 99999 is outside the tokenizer's vocabulary"):
        LaneStream(spec, 0).take(1)


def test_token_field_needs_parquet(plain, corpus_dir, tokenizer_dir):
    from zephon_titan.engine import ConfigError

    with pytest.raises(ConfigError, match="token_field needs Parquet files"):
        make_spec(corpus_dir, tokenizer_dir, sources=_source([str(plain / "*.jsonl")], token_field="ids"))


def _write_lance(plain, uri, column="text", mode="create"):
    """The plain files' documents as one Lance dataset, one fragment per file."""
    lance = pytest.importorskip("lance")
    for i, name in enumerate(sorted(os.listdir(plain))):
        docs = [json.loads(line)["text"] for line in (plain / name).read_text(encoding="utf-8").splitlines()]
        lance.write_dataset(pa.table({column: docs}), uri, mode=mode if i == 0 else "append")
    return lance


def test_lance_dataset_equals_plain_jsonl(tmp_path, plain, corpus_dir, tokenizer_dir):
    uri = str(tmp_path / "web.lance")
    _write_lance(plain, uri, column="content")
    reference = make_spec(corpus_dir, tokenizer_dir, sources=_source([str(plain / "*.jsonl")]))
    sources = {"web": {"paths": [uri], "text_field": "content", "block_rows": 10**6}}
    lance_spec = make_spec(corpus_dir, tokenizer_dir, sources=sources)
    assert lance_spec.sources[0].num_blocks == 3  # one block per fragment, as one per plain file
    assert lance_spec.sources[0].files[0].path == f"{uri}?version=3&fragment=0"
    assert _lanes(lance_spec) == _lanes(reference)
    # Smaller blocks: every document still exactly once per epoch, in fragment order within a block.
    small = make_spec(corpus_dir, tokenizer_dir, sources={"web": {**sources["web"], "block_rows": 7}})
    texts = [t for b in range(small.sources[0].num_blocks) for t in small.sources[0].read_block(b).texts]
    plain_texts = [
        json.loads(line)["text"]
        for name in sorted(os.listdir(plain))
        for line in (plain / name).read_text(encoding="utf-8").splitlines()
    ]
    assert texts == plain_texts


def test_lance_version_is_pinned_and_a_new_version_is_a_named_change(tmp_path, plain, corpus_dir, tokenizer_dir):
    from zephon_titan.engine.fingerprint import check_fingerprint, fingerprint
    from zephon_titan.errors import ResumeError

    uri = str(tmp_path / "web.lance")
    lance = _write_lance(plain, uri)
    sources = {"web": {"paths": [uri], "block_rows": 16, "index": str(tmp_path / "web.index.json")}}
    before = make_spec(corpus_dir, tokenizer_dir, sources=sources)
    expected = _lanes(before)
    lance.write_dataset(pa.table({"text": ["appended later"] * 5}), uri, mode="append")
    assert _lanes(before) == expected  # a running job keeps reading the version it listed
    indexed = make_spec(corpus_dir, tokenizer_dir, sources=sources)  # the index pins version 3 too
    assert _lanes(indexed) == expected
    relisted = make_spec(corpus_dir, tokenizer_dir, sources={"web": {"paths": [uri], "block_rows": 16}})
    with pytest.raises(ResumeError, match=r"files\.web: 3 files.* -> 4 files"):
        check_fingerprint(fingerprint(before), fingerprint(relisted))


def test_lance_mistakes_are_named(tmp_path, plain, corpus_dir, tokenizer_dir, monkeypatch):
    from zephon_titan.engine import ConfigError

    uri = str(tmp_path / "web.lance")
    _write_lance(plain, uri)
    with pytest.raises(DataError, match=r"web.lance: no column 'content' \(columns: text\); set text_field"):
        make_spec(corpus_dir, tokenizer_dir, sources={"web": {"paths": [uri], "text_field": "content"}})
    with pytest.raises(ConfigError, match=r"path '.*nothing.lance' matches no Lance dataset directory"):
        make_spec(corpus_dir, tokenizer_dir, sources={"web": {"paths": [str(tmp_path / "nothing.lance")]}})
    monkeypatch.setitem(__import__("sys").modules, "lance", None)  # as if pylance were not installed
    with pytest.raises(ConfigError, match=r"need pylance: pip install 'zephon-titan\[lance\]'"):
        make_spec(corpus_dir, tokenizer_dir, sources={"web": {"paths": [uri]}})


def test_an_index_naming_a_missing_lance_fragment_is_one_line(tmp_path, plain, corpus_dir, tokenizer_dir):
    from zephon_titan.engine.sources.lance import block_name

    uri = str(tmp_path / "web.lance")
    _write_lance(plain, uri)
    index = tmp_path / "web.index.json"
    sources = {"web": {"paths": [uri], "block_rows": 10**6, "index": str(index)}}
    honest = make_spec(corpus_dir, tokenizer_dir, sources=sources)  # writes the index
    assert honest.sources[0].read_block(0).texts  # negative control: the honest index reads
    document = json.loads(index.read_text())
    document["files"][-1][0] = block_name(uri, 3, 99)  # a fragment version 3 does not have
    index.write_text(json.dumps(document))
    doctored = make_spec(corpus_dir, tokenizer_dir, sources=sources)
    with pytest.raises(DataError, match=r"version 3 of the dataset has no fragment 99; .*rebuild it"):
        doctored.sources[0].read_block(doctored.sources[0].num_blocks - 1)


def test_a_dictionary_encoded_text_column_equals_plain_strings(tmp_path, code_docs, corpus_dir, tokenizer_dir):
    """Arrow writers keep low-cardinality string columns dictionary-encoded: the same texts, the same rows (it was
    refused as "expected a string", and init found "no string column"); `init` picks it as the text column."""
    from zephon_titan.engine.sources.init_sample import string_columns as _string_columns

    docs = code_docs[:30] + code_docs[:10]  # repeats: what a dictionary is for
    os.makedirs(tmp_path / "plain")
    os.makedirs(tmp_path / "dict")
    pq.write_table(pa.table({"text": docs}), str(tmp_path / "plain" / "a.parquet"), row_group_size=8)
    table = pa.table({"text": pa.array(docs).dictionary_encode()})
    pq.write_table(table, str(tmp_path / "dict" / "a.parquet"), row_group_size=8)
    assert pa.types.is_dictionary(pq.ParquetFile(str(tmp_path / "dict" / "a.parquet")).schema_arrow.field("text").type)
    specs = [make_spec(corpus_dir, tokenizer_dir, num_lanes=2, sources=_source([str(tmp_path / d / "*.parquet")]))
             for d in ("plain", "dict")]  # fmt: skip
    assert _lanes(specs[0]) == _lanes(specs[1])
    assert _string_columns(table.schema) == (["text"], {})
    table = pa.table({"text": pa.array([1, 2, 1]).dictionary_encode()})  # control: not strings stays refused
    assert _string_columns(table.schema)[0] == []
