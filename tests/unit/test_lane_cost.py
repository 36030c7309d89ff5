"""What a lane holds (issue 28, "lanes that cost little"): where its documents are, not their bytes;
blocks shared by the lanes of a process. benchmarks/lane_cost.py measures it; the rows are unchanged
(test_stream.py, test_step_hashes.py, test_old_checkpoint.py)."""

from __future__ import annotations

import gc
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon_titan.config import SourceConfig
from zephon_titan.engine.sources import open_source
from zephon_titan.errors import DataError


def _jsonl(tmp_path, texts):
    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path, open_source(SourceConfig(name="web", paths=[str(path)]))


def test_a_local_jsonl_block_reads_each_document_when_it_is_due(tmp_path):
    path, source = _jsonl(tmp_path, ["one", "two", "three"])
    block = source.read_block(0)
    assert list(block.texts) == ["one", "two", "three"] and block.rows == [0, 16, 32]
    load = block.texts._load  # the block keeps no bytes of its lines (white box: the loader's closure)
    assert dict(zip(load.__code__.co_freevars, (c.cell_contents for c in load.__closure__)))["held"] is None
    path.write_text(path.read_text().replace("three", "THREE"))  # same size, new mtime
    with pytest.raises(DataError, match="modified"):
        block.texts[2]  # read from the file now: refused, never the new bytes


def test_lanes_of_a_process_share_a_block_while_one_holds_it(tmp_path):
    _, source = _jsonl(tmp_path, ["one", "two"])
    held = source.read_block(0)
    assert source.read_block(0) is held
    del held
    gc.collect()
    assert not source._held  # released with the last window holding it


def test_a_parquet_block_holds_its_column_not_a_python_object_per_row(tmp_path):
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"text": [f"doc {i}" for i in range(1000)]}), path, row_group_size=500)
    source = open_source(SourceConfig(name="pq", paths=[str(path)]))
    block = source.read_block(1)
    assert block.rows == range(500, 1000) and block.texts[7] == "doc 507" and len(block.texts) == 500
    assert block.texts[-1] == "doc 999" and block.texts[:2] == ["doc 500", "doc 501"]
