import json
import os
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_titan.config import SourceConfig
from zephon_titan.engine.sources import open_source
from zephon_titan.errors import ConfigError, DataError


def _all_docs(source):
    out = []
    for b in range(source.num_blocks):
        block = source.read_block(b)
        out.extend(zip([block.file] * len(block.texts), block.rows, block.texts))
    return out


@given(block_bytes=st.integers(1024, 40_000))
@settings(max_examples=25, deadline=None)
def test_jsonl_blocks_partition_the_lines_exactly(corpus_dir, prose_docs, block_bytes):
    source = open_source(
        SourceConfig(name="prose", paths=[os.path.join(corpus_dir, "prose", "*.jsonl")], block_bytes=block_bytes)
    )
    docs = _all_docs(source)
    assert [text for _, _, text in docs] == prose_docs  # every line once, in file order
    for path, offset, text in docs[:5]:  # rows are byte offsets of the line
        with open(path, "rb") as f:
            f.seek(offset)
            assert json.loads(f.readline())["text"] == text


def test_parquet_row_groups_are_blocks(corpus_dir, code_docs):
    source = open_source(SourceConfig(name="code", paths=[os.path.join(corpus_dir, "code", "*.parquet")]))
    assert source.num_blocks == sum(pq.ParquetFile(f.path).num_row_groups for f in source.files)
    docs = _all_docs(source)
    assert [text for _, _, text in docs] == code_docs
    path, row, text = docs[-1]
    assert pq.read_table(path).column("text")[row].as_py() == text


def test_glob_matching_nothing_names_source_and_pattern(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative path is shown resolved against the current directory
    where = re.escape(str(tmp_path / "nope" / "*.jsonl"))
    with pytest.raises(
        ConfigError,
        match=rf"source 'web': path 'nope/\*.jsonl' matches no file \(relative to the "
        rf"current directory: {where}\)",
    ):
        open_source(SourceConfig(name="web", paths=["nope/*.jsonl"]))


def test_a_folder_path_says_how_to_name_its_files(tmp_path):
    """A folder (a dataset's, as Mosaic and LitData users name theirs) lists no file: the line says it is one and
    how to name its files or its index.json; a missing path still says it matches nothing."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.jsonl").write_text('{"text": "x"}\n')
    for folder in (str(tmp_path / "data"), str(tmp_path / "data") + "/"):
        with pytest.raises(ConfigError) as refused:
            open_source(SourceConfig(name="web", paths=[folder]))
        assert f"path {folder!r} is a folder; name its files with a glob" in str(refused.value)
        assert f"'{tmp_path / 'data'}/index.json'" in str(refused.value)
    assert len(open_source(SourceConfig(name="web", paths=[str(tmp_path / "data" / "*.jsonl")])).files) == 1
    with pytest.raises(ConfigError, match="matches no file"):
        open_source(SourceConfig(name="web", paths=[str(tmp_path / "other")]))


def test_missing_text_field_names_file_offset_and_fields(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "ok"}\n{"body": "x", "id": 1}\n')
    source = open_source(SourceConfig(name="web", paths=[str(path)]))
    texts = source.read_block(0).texts  # a line is parsed when its document is read
    assert texts[0] == "ok"
    with pytest.raises(DataError, match=r"a.jsonl line 2 \(at byte 15\): no field 'text' \(fields: body, id\)"):
        texts[1]


def test_invalid_json_line_is_an_error_not_a_skip(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "ok"}\n{"text": "cut\n')
    with pytest.raises(DataError, match=r"line 2 \(at byte 15\): line is not valid JSON"):
        list(open_source(SourceConfig(name="web", paths=[str(path)])).read_block(0).texts)


def test_parquet_without_the_column_fails_at_open(tmp_path):
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"content": ["x"]}), path)
    with pytest.raises(DataError, match=r"no column 'text' \(columns: content\)"):
        open_source(SourceConfig(name="web", paths=[str(path)]))


def test_unknown_extension_asks_for_a_format(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("x")
    with pytest.raises(ConfigError, match="set format to one of jsonl, lance, litdata, mds, megatron, olmo, parquet"):
        open_source(SourceConfig(name="web", paths=[str(path)]))
