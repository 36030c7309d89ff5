"""The compressions read inside sample shards (engine/sources/shard_codecs.py), on doctored copies of the chunks
the real writers wrote (tests/fixtures/mds_litdata: litdata/batch, litdata/sample, mds/snappy): a damaged header,
frame table or frame is one line naming the file and the frame or sample, and a frame that inflates past the
size stated for it is refused. (Their rows and ledgers equal JSONL's in test_sharded_datasets.py.)"""

import json
import os
import shutil
import struct

import numpy as np
import pytest

from zephon_titan.config import SourceConfig
from zephon_titan.engine import DataError
from zephon_titan.engine.sources import open_source

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "mds_litdata")
PREFIX, FRAME = struct.Struct("<8sHHIII"), struct.Struct("<IIQII")
SAMPLES = 41  # in litdata/batch's chunk-0-0.bin, in frames of 8 (compression_batch_size)
TABLE = PREFIX.size + 4 * (SAMPLES + 1)


def _texts() -> list[str]:
    with open(os.path.join(FIXTURE, "documents.jsonl"), encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def _copy(tmp_path, dataset: str) -> str:
    target = tmp_path / dataset.replace("/", "_")
    shutil.copytree(os.path.join(FIXTURE, dataset), target)
    return str(target / "index.json")


def _open(index: str, block_rows: int = 8):
    return open_source(SourceConfig(name="web", paths=[index], block_rows=block_rows))


def _edit(path: str, edit) -> None:
    data = bytearray(open(path, "rb").read())
    edit(data)
    open(path, "wb").write(bytes(data))


def _raises(source, block: int, says: str, *names: str) -> None:
    with pytest.raises(DataError, match=says) as e:
        list(source.read_block(block).texts)
    message = str(e.value)
    assert "\n" not in message and "Traceback" not in message, message
    for name in names:
        assert name in message, message


def _frame_field(frame: int, field: int, value: int):
    """Set one field of a frame table entry (first_item, n_items, compressed_off, compressed_len, uncompressed)."""

    def edit(data: bytearray) -> None:
        entry = list(FRAME.unpack_from(data, TABLE + FRAME.size * frame))
        entry[field] = value(entry[field])
        FRAME.pack_into(data, TABLE + FRAME.size * frame, *entry)

    return edit


def _prefix_field(field: int, value):
    def edit(data: bytearray) -> None:
        prefix = list(PREFIX.unpack_from(data, 0))
        prefix[field] = value
        PREFIX.pack_into(data, 0, *prefix)

    return edit


DOCTORED_BATCH = [
    (
        _frame_field(5, 3, lambda n: n + 1),
        5,
        r"chunk-0-0.bin frame 5: the frame table says samples 40\+1, 145 bytes, 134",
    ),
    (_frame_field(1, 3, lambda n: n + 1), 1, r"chunk-0-0.bin frame 1: cannot decompress as zstd"),
    (_frame_field(1, 0, lambda n: 9), 1, r"chunk-0-0.bin frame 1: the frame table says samples 9\+8"),
    (_frame_field(1, 4, lambda n: n - 1), 1, r"chunk-0-0.bin frame 1: .* the header and offsets say .* 1,054 bytes"),
    (_frame_field(2, 2, lambda n: 10**6), 2, r"chunk-0-0.bin frame 2: .* compressed at byte 1,000,000"),
    (_frame_field(0, 2, lambda n: n - 1), 0, r"chunk-0-0.bin frame 0: .* compressed at byte 335"),
    (_prefix_field(0, b"LDFZ02\0\0"), 0, r"chunk-0-0.bin: does not open with LitData's framed zstd magic"),
    (_prefix_field(1, 2), 0, r"chunk-0-0.bin: framed zstd version 2 \(flags 0\); zephon reads version 1"),
    (_prefix_field(3, 40), 0, r"chunk-0-0.bin: holds 40 samples, its index.json says 41"),
    (_prefix_field(5, 99), 0, r"chunk-0-0.bin: its header says 99 frames of 8 samples for 41"),
    (_prefix_field(4, 0), 0, r"chunk-0-0.bin: its header says 6 frames of 0 samples for 41"),
    (lambda d: d.__setitem__(slice(28, 32), b"\xff\xff\xff\x00"), 0, r"offsets of samples 0..7 are out of order"),
    (lambda d: d.__setitem__(slice(400, 440), b"\x00" * 40), 0, r"chunk-0-0.bin frame 0: cannot decompress as zstd"),
]


@pytest.mark.parametrize("edit, block, says", DOCTORED_BATCH, ids=[s[:40] for _, _, s in DOCTORED_BATCH])
def test_a_doctored_framed_chunk_is_one_line_naming_the_file_and_frame(tmp_path, edit, block, says):
    index = _copy(tmp_path, "litdata/batch")
    chunk = os.path.join(os.path.dirname(index), "chunk-0-0.bin")
    texts = _texts()
    assert (
        list(_open(index).read_block(block).texts) == texts[8 * block : min(8 * block + 8, SAMPLES)]
    )  # negative control
    _edit(chunk, edit)
    _raises(_open(index), block, says, chunk)


def test_a_truncated_framed_chunk_is_one_line_naming_the_frame(tmp_path):
    """Cut short with its index.json agreeing (else startup names it): the frames past the end, or the header."""
    index = _copy(tmp_path, "litdata/batch")
    chunk = os.path.join(os.path.dirname(index), "chunk-0-0.bin")

    def cut(size: int) -> None:
        with open(chunk, "r+b") as f:
            f.truncate(size)
        with open(index) as f:
            document = json.load(f)
        document["chunks"][0]["chunk_bytes"] = size
        with open(index, "w") as f:
            json.dump(document, f)

    cut(os.path.getsize(chunk) - 50)
    source = _open(index)
    assert list(source.read_block(0).texts) == _texts()[:8]  # the frames before the cut read
    _raises(
        source,
        5,
        r"frame 5: the frame table says samples 40\+1, 145 bytes, 133 compressed at byte 2,924; .* "
        r"in a chunk of 3,007",
        chunk,
    )
    cut(200)
    _raises(_open(index), 0, r"its header, offsets and frame table take 336 bytes, the chunk has 200", chunk)


def test_a_frame_that_inflates_past_its_stated_size_is_refused(tmp_path):
    """The frame table and the offsets agree on 10 bytes fewer than the frame holds (litdata/batch), a sample's
    zstd header states 5 bytes fewer (litdata/sample): refused, the frame or sample named."""
    index = _copy(tmp_path, "litdata/batch")
    chunk = os.path.join(os.path.dirname(index), "chunk-0-2.bin")  # 5 samples: one frame

    def fewer(data: bytearray) -> None:
        last = PREFIX.size + 4 * 5
        (end,) = struct.unpack_from("<I", data, last)
        struct.pack_into("<I", data, last, end - 10)
        entry = list(FRAME.unpack_from(data, last + 4))
        entry[4] -= 10
        FRAME.pack_into(data, last + 4, *entry)

    _edit(chunk, fewer)
    _raises(
        _open(index, 100), 2, r"chunk-0-2.bin frame 0: decompresses to more than the 648 bytes its frame table", chunk
    )
    index = _copy(tmp_path, "litdata/sample")
    chunk = os.path.join(os.path.dirname(index), "chunk-0-0.bin")
    data = bytearray(open(chunk, "rb").read())
    (start,) = np.frombuffer(bytes(data[8:12]), "<u4")  # sample 1's zstd frame: magic, descriptor 0x20, size (u8)
    assert data[start + 4] == 0x20
    source = _open(index)
    assert source.read_block(0).texts[1] == _texts()[1]  # negative control
    data[start + 5] -= 5
    open(chunk, "wb").write(bytes(data))
    # zstd checks a frame against the size its header states (and a frame stating none is refused).
    _raises(_open(index), 0, r"chunk-0-0.bin sample 1: cannot decompress as zstd \(.*corruption", chunk)
    data[start + 4] = 0x00  # a descriptor stating no content size: nothing would bound the sample
    open(chunk, "wb").write(bytes(data))
    _raises(_open(index), 0, r"chunk-0-0.bin sample 1: its zstd frame does not state its size", chunk)
    data[start : start + 4] = b"\0\0\0\0"
    open(chunk, "wb").write(bytes(data))
    _raises(_open(index), 0, r"chunk-0-0.bin sample 1: not a zstd frame", chunk)


def test_a_snappy_shard_is_checked_against_its_stated_size(tmp_path):
    index = _copy(tmp_path, "mds/snappy")
    assert list(_open(index, 100).read_block(2).texts) == _texts()[-1:]  # negative control
    with open(index) as f:
        document = json.load(f)
    document["shards"][2]["raw_data"]["bytes"] -= 1
    with open(index, "w") as f:
        json.dump(document, f)
    shard = os.path.join(os.path.dirname(index), "shard.00002.mds.snappy")
    _raises(_open(index, 100), 2, r"shard.00002.mds.snappy: snappy data of 345 bytes, not the 344 its index", shard)
    document["shards"][2]["raw_data"]["bytes"] += 1
    with open(index, "w") as f:
        json.dump(document, f)
    _edit(shard, lambda d: d.__setitem__(slice(40, 80), b"\xff" * 40))
    _raises(_open(index, 100), 2, r"shard.00002.mds.snappy: cannot decompress as snappy", shard)


@pytest.mark.parametrize("dataset", ["litdata/batch", "litdata/sample"])
def test_init_samples_a_chunk_with_zstd_inside(dataset):
    from zephon_titan.engine.sources.litdata import LITDATA
    from zephon_titan.engine.sources.storage import FileStat

    index = os.path.join(FIXTURE, dataset, "index.json")
    assert LITDATA.init is not None and LITDATA.init.sample_file is not None
    sample = LITDATA.init.sample_file(FileStat(index, os.path.getsize(index), 0))
    assert sample.texts["text"] == _texts()[: len(sample.texts["text"])] and sample.texts["text"]


def test_inflate_stops_one_byte_past_the_stated_size(monkeypatch):
    """A bomb (16 MiB of zeros in a few hundred bytes) stated as 1,000 bytes: refused, and what is read of it is
    bounded by the statement, not by what it would inflate to."""
    import pyarrow as pa

    from zephon_titan.engine.sources import shard_codecs

    bomb = pa.Codec("zstd").compress(b"\0" * (16 << 20), asbytes=True)
    reads: list[int] = []
    real = pa.input_stream

    def spied(*args, **kwargs):
        stream = real(*args, **kwargs)

        class Spy:
            def __enter__(self):
                stream.__enter__()
                return self

            def __exit__(self, *exc):
                return stream.__exit__(*exc)

            def read(self, n):
                reads.append(n)
                return stream.read(n)

        return Spy()

    monkeypatch.setattr(pa, "input_stream", spied)
    with pytest.raises(DataError, match=r"f frame 3: decompresses to more than the 1,000 bytes it states"):
        shard_codecs.inflate(bomb, "zstd", 1000, "f frame 3", "it states", "rewrite it")
    assert sum(reads) <= 1001, reads
    assert shard_codecs.inflate(bomb, "zstd", 16 << 20, "f", "", "") == b"\0" * (16 << 20)  # negative control


@pytest.mark.parametrize("dataset", ["mds/zstd", "mds/snappy", "litdata/zstd"])
def test_a_shard_compressed_whole_comes_through_the_node_cache(s3, tmp_path, dataset):
    """From object storage with `cache_dir`, a shard compressed whole is one download per node: a second source
    (another process of the node) reads the node's copy, asking the object store nothing about the shards."""
    from zephon_titan.engine.sources import storage
    from zephon_titan.engine.sources.storage import StorageOptions

    uri = s3.upload(os.path.join(FIXTURE, dataset), f"shard_cache_{dataset.replace('/', '_')}")
    want = _texts()

    def read(cache_dir: str) -> list[dict]:
        storage.open_input_file.cache_clear()
        s3.clear_requests()
        source = open_source(
            SourceConfig(name="web", paths=[f"{uri}/index.json"]), options=StorageOptions(cache_dir=cache_dir)
        )
        assert [t for b in range(source.num_blocks) for t in source.read_block(b).texts] == want
        return [r for r in s3.requests() if "/shard." in r["key"] or "/chunk-" in r["key"]]

    cache = str(tmp_path / "cache")
    first = read(cache)
    assert len([r for r in first if r["method"] == "GET"]) == 3, first  # each shard downloaded once
    assert read(cache) == []  # the node's copies: no request for a shard
    assert len(os.listdir(cache)) >= 3
    assert len([r for r in read("") if r["method"] == "GET"]) == 3  # negative control: without the cache, read again
