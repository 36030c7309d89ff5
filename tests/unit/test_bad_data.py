"""Bad input: each case has one defined behaviour, a clear error naming file and row, never a silent skip."""

import json
import os
import shutil

import numpy as np
import pytest
from helpers import make_spec, rows_digest, within_seconds

from zephon_titan.engine import ConfigError, DataError, LaneStream, ResumeError, check_fingerprint, fingerprint


def _spec_over(tmp_path, corpus_dir, tokenizer_dir, lines, **overrides):
    path = tmp_path / "web.jsonl"
    path.write_bytes(b"".join(lines))
    return make_spec(corpus_dir, tokenizer_dir, sources={"web": {"paths": [str(path)]}}, num_lanes=1, **overrides)


def _first_rows(spec, n=3):
    return LaneStream(spec, 0).take(n)


def test_corrupt_parquet_fails_at_startup_naming_the_file(tmp_path, corpus_dir, tokenizer_dir):
    bad = tmp_path / "broken.parquet"
    bad.write_bytes(b"PAR1 this is not a parquet file")
    with pytest.raises(DataError, match=r"broken.parquet: cannot read as Parquet"):
        make_spec(corpus_dir, tokenizer_dir, sources={"web": {"paths": [str(bad)]}})


def test_invalid_utf8_names_file_and_byte(tmp_path, corpus_dir, tokenizer_dir):
    spec = _spec_over(tmp_path, corpus_dir, tokenizer_dir, [b'{"text": "fine"}\n', b'{"text": "caf\xe9"}\n'])
    with pytest.raises(DataError, match=r"web.jsonl line 2 \(at byte 17\): line is not valid UTF-8"):
        _first_rows(spec)


def test_truncated_last_line_names_file_and_byte(tmp_path, corpus_dir, tokenizer_dir):
    spec = _spec_over(tmp_path, corpus_dir, tokenizer_dir, [b'{"text": "fine"}\n', b'{"text": "cut in the mid'])
    with pytest.raises(DataError, match=r"web.jsonl line 2 \(at byte 17\): line is not valid JSON"):
        _first_rows(spec)


def test_non_string_text_is_an_error(tmp_path, corpus_dir, tokenizer_dir):
    spec = _spec_over(tmp_path, corpus_dir, tokenizer_dir, [b'{"text": null}\n'])
    with pytest.raises(DataError, match=r"web.jsonl line 1 \(at byte 0\): field 'text' is NoneType, expected a string"):
        _first_rows(spec)


@pytest.mark.parametrize("labels", ["document", "stream"])
def test_empty_documents_become_bos_eos(tmp_path, corpus_dir, tokenizer_dir, labels):
    lines = [json.dumps({"text": t}).encode() + b"\n" for t in ["", "hello world", ""]]
    spec = _spec_over(tmp_path, corpus_dir, tokenizer_dir, lines, exhaustion="redistribute", labels=labels)
    bos, eos = spec.tokenizer.bos_id, spec.tokenizer.eos_id
    row = LaneStream(spec, 0).take(1)[0]
    within = labels == "document"
    empty = [p for p in row.pieces if p.length == (1 if within else 2)]
    assert len(empty) == 2  # both empty documents are there: [BOS, EOS], one pair BOS -> EOS under "document"
    if within:
        starts = [int(at) for at in np.flatnonzero(row.positions == 0)]
        pairs = [(row.inputs[at], row.labels[at]) for at, p in zip(starts, row.pieces) if p.length == 1]
        assert pairs == [(bos, eos)] * 2
    else:
        assert [bos, eos] in [row.inputs.tolist()[i : i + 2] for i in range(len(row.inputs) - 1)]
    bare = _spec_over(
        tmp_path,
        corpus_dir,
        tokenizer_dir,
        lines,
        exhaustion="redistribute",
        add_bos=False,
        add_eos=False,
        labels=labels,
    )
    # With neither BOS nor EOS an empty document has no token: nothing to place, nothing lost.
    assert [p.length for p in LaneStream(bare, 0).take(1)[0].pieces] == [
        len(spec.tokenizer.encode(["hello world"])[0]) - 2 - within
    ]


def test_a_100_mb_document_is_a_clear_error(tmp_path, corpus_dir, tokenizer_dir):
    huge = json.dumps({"text": "x" * (100 << 20)}).encode() + b"\n"
    spec = _spec_over(tmp_path, corpus_dir, tokenizer_dir, [b'{"text": "small"}\n', huge])
    with pytest.raises(
        DataError,
        match=r"web.jsonl line 2 \(at byte 18\): a document of 104,857,600 characters is over "
        r"\[dataloader\] max_document_chars = 67,108,864",
    ):
        _first_rows(spec)


def _copy_corpus(tmp_path, corpus_dir):
    copy = tmp_path / "corpus"
    shutil.copytree(corpus_dir, copy)
    return str(copy)


def test_file_missing_at_resume_is_named(tmp_path, corpus_dir, tokenizer_dir):
    corpus = _copy_corpus(tmp_path, corpus_dir)
    saved = fingerprint(make_spec(corpus, tokenizer_dir))
    os.remove(os.path.join(corpus, "prose", "part-00002.jsonl"))
    with pytest.raises(ResumeError, match=r"files.prose: 3 files, [\d,]+ bytes, \d+ blocks -> 2 files"):
        check_fingerprint(saved, fingerprint(make_spec(corpus, tokenizer_dir)))


def test_changed_file_is_named_and_a_touch_can_be_allowed(tmp_path, corpus_dir, tokenizer_dir):
    corpus = _copy_corpus(tmp_path, corpus_dir)
    saved = fingerprint(make_spec(corpus, tokenizer_dir))
    target = os.path.join(corpus, "prose", "part-00001.jsonl")
    os.utime(target, ns=(0, 10**18))  # same bytes, new modification time (a copy)
    with pytest.raises(ResumeError, match=r"changed: mtimes.prose: .*resume_allow"):
        check_fingerprint(saved, fingerprint(make_spec(corpus, tokenizer_dir)))
    check_fingerprint(saved, fingerprint(make_spec(corpus, tokenizer_dir)), allow=["mtimes"])
    with open(target, "a") as f:
        f.write(json.dumps({"text": "one more document"}) + "\n")
    with pytest.raises(ResumeError, match=r"files.prose: .* -> .*layout.prose: "):
        check_fingerprint(saved, fingerprint(make_spec(corpus, tokenizer_dir)), allow=["mtimes"])


def test_only_harmless_changes_can_be_allowed(corpus_dir, tokenizer_dir):
    with pytest.raises(
        ConfigError, match=r"resume_allow: 'seed' cannot be allowed \(it changes the rows\); allowed: mtimes"
    ):
        make_spec(corpus_dir, tokenizer_dir, resume_allow=["seed"])


def test_parquet_null_text_names_file_and_row(tmp_path, corpus_dir, tokenizer_dir):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "nulls.parquet"
    pq.write_table(pa.table({"text": ["a", "b", None]}), path)
    spec = make_spec(corpus_dir, tokenizer_dir, sources={"web": {"paths": [str(path)]}}, num_lanes=1)
    with pytest.raises(DataError, match=r"nulls.parquet row 2: column 'text' is null"):
        _first_rows(spec)


def test_a_source_mixing_formats_is_refused(tmp_path, corpus_dir, tokenizer_dir):
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    shutil.copy(os.path.join(corpus_dir, "code", "part-00000.parquet"), tmp_path / "b.parquet")
    with pytest.raises(ConfigError, match=r"mixes formats \(jsonl, parquet\); split it into one source per format"):
        make_spec(corpus_dir, tokenizer_dir, sources={"web": {"paths": [str(tmp_path / "*")]}})


def test_blank_lines_are_not_documents(tmp_path, corpus_dir, tokenizer_dir):
    spec = _spec_over(
        tmp_path,
        corpus_dir,
        tokenizer_dir,
        [b'{"text": "one"}\n', b"\n", b"   \n", b'{"text": "two"}\n'],
        exhaustion="redistribute",
    )
    block = spec.sources[0].read_block(0)
    assert block.texts == ["one", "two"] and block.rows == [0, 21]


def test_data_moved_elsewhere_is_named_and_can_be_allowed(tmp_path, corpus_dir, tokenizer_dir):
    corpus = _copy_corpus(tmp_path, corpus_dir)
    before = make_spec(corpus, tokenizer_dir)
    saved = fingerprint(before)
    moved = str(tmp_path / "moved" / "elsewhere")
    shutil.copytree(corpus, moved)  # copy2: same names, sizes, bytes and mtimes
    after = make_spec(moved, tokenizer_dir)
    with pytest.raises(ResumeError, match=r"changed: locations.code: .*locations.prose: [0-9a-f]+ -> [0-9a-f]+\. "):
        check_fingerprint(saved, fingerprint(after))
    check_fingerprint(saved, fingerprint(after), allow=["locations"])
    assert rows_digest(LaneStream(after, 3).take(20)) == rows_digest(LaneStream(before, 3).take(20))
    os.rename(os.path.join(moved, "prose", "part-00002.jsonl"), os.path.join(moved, "prose", "part-00009.jsonl"))
    with pytest.raises(ResumeError, match=r"layout.prose: "):  # a renamed file is not a move
        check_fingerprint(saved, fingerprint(make_spec(moved, tokenizer_dir)), allow=["locations", "mtimes"])


def _jsonl_with_an_empty_tail_block(path, block_bytes, full_blocks):
    """Lines filling `full_blocks` blocks, the last of them running on into one more block, in which no line
    starts: that block holds no document (a file's tail block often does not)."""
    lines, size, i = [], 0, 0
    while size < (full_blocks - 1) * block_bytes:
        lines.append(json.dumps({"text": f"document {i} " + "word " * 20}).encode() + b"\n")
        size += len(lines[-1])
        i += 1
    lines.append(json.dumps({"text": "x" * (full_blocks * block_bytes - size + block_bytes // 2)}).encode() + b"\n")
    path.write_bytes(b"".join(lines))


def test_lanes_whose_window_is_only_empty_blocks_read_on(tmp_path, corpus_dir, tokenizer_dir):
    """256 lanes over a source of 3 blocks whose last holds no document: some lanes' first window is that
    block twice (2-block windows). They read on to the next window instead of calling the source empty
    (counting blocks as if every lane's window were one lane's made that an error at once)."""
    path = tmp_path / "web.jsonl"
    _jsonl_with_an_empty_tail_block(path, 1024, 2)
    spec = make_spec(
        corpus_dir,
        tokenizer_dir,
        sources={"web": {"paths": [str(path)], "block_bytes": 1024}},
        num_lanes=256,
        shuffle_window_blocks=2,
    )
    assert spec.sources[0].num_blocks == 3
    assert len(spec.sources[0].read_block(2).texts) == 0  # the tail block: no line starts in it
    streams = [LaneStream(spec, lane) for lane in range(256)]
    empty_first = [s for s in streams if set(s.feed.readers[0].windows.window_block_ids(0)) == {2}]
    assert empty_first, "the fixture should give some lane a first window of the empty block only"
    for stream in streams:
        (row,) = stream.take(1)
        assert row.pieces and row.pieces[0].file == str(path)


def test_a_source_of_only_empty_blocks_is_an_error_naming_it(tmp_path, corpus_dir, tokenizer_dir):
    """The guard still stops a source with no document in any block (blank lines only), once every block
    was met empty, rather than reading on forever."""
    path = tmp_path / "web.jsonl"
    path.write_bytes(b"\n \n" * 2000)
    spec = make_spec(
        corpus_dir, tokenizer_dir, sources={"web": {"paths": [str(path)], "block_bytes": 1024}}, num_lanes=4
    )
    with pytest.raises(DataError, match=r"source 'web': lane 0 found no document in its blocks \(all 6 of"):
        LaneStream(spec, 0).take(1)


def _lines(texts):
    return [json.dumps({"text": t}).encode() + b"\n" for t in texts]


def _bare_texts_spec(tmp_path, corpus_dir, tokenizer_dir, texts, **overrides):
    """One source "web" of `texts` in 1 KiB blocks, without BOS/EOS (an empty text gives no token)."""
    path = tmp_path / "web.jsonl"
    path.write_bytes(b"".join(_lines(texts)))
    sources = {"web": {"paths": [str(path)], "block_bytes": 1024}}
    return make_spec(corpus_dir, tokenizer_dir, sources=sources, add_bos=False, add_eos=False, **overrides)


@pytest.mark.parametrize("packing", ["wrap", "best_fit"])
def test_a_source_whose_documents_give_no_token_is_an_error_not_a_hang(tmp_path, corpus_dir, tokenizer_dir, packing):
    """Empty texts without BOS/EOS give no token: an endless lane would read that source forever (its count of
    tokens never grows, so the mixer keeps choosing it). One line naming the source, once all its blocks met."""
    spec = _bare_texts_spec(tmp_path, corpus_dir, tokenizer_dir, [""] * 300, num_lanes=2, packing=packing)
    with (
        within_seconds(60),
        pytest.raises(DataError, match=r"source 'web': lane 1 met all 4 of its blocks without a doc"),
    ):
        LaneStream(spec, 1).take(1)


def test_a_weighted_source_of_one_token_documents_is_named(tmp_path, corpus_dir, tokenizer_dir):
    """labels = "document": a document of one token (an empty text with BOS) has no (input, label) pair. A source
    of only such documents would hold its weight with nothing in the rows: named, not left silently empty."""
    (tmp_path / "bos_only").mkdir()
    (tmp_path / "bos_only" / "a.jsonl").write_bytes(b"".join(_lines([""] * 200)))
    sources = {
        "bos_only": {"paths": [str(tmp_path / "bos_only" / "a.jsonl")], "block_bytes": 1024},
        "prose": {"paths": [os.path.join(corpus_dir, "prose", "*.jsonl")], "block_bytes": 16384},
    }
    spec = make_spec(corpus_dir, tokenizer_dir, sources=sources, num_lanes=1, add_bos=True, add_eos=False)
    with within_seconds(60), pytest.raises(DataError, match=r"source 'bos_only': lane 0 met all \d+ of its blocks"):
        LaneStream(spec, 0).take(20)
    # Control: the same documents under the stream rule give their BOS tokens, and rows come.
    stream = make_spec(corpus_dir, tokenizer_dir, sources=sources, num_lanes=1, add_bos=True, add_eos=False,
                       labels="stream")  # fmt: skip
    assert any(p.source == 0 for r in LaneStream(stream, 0).take(20) for p in r.pieces)


def test_many_empty_documents_before_a_real_one_are_read_past(tmp_path, corpus_dir, tokenizer_dir):
    """Control for the guard: a long run of empty texts, over several blocks and windows, is no error while one
    document of the source gives tokens."""
    texts = [""] * 600 + ["the one document with words in it"] + [""] * 600
    spec = _bare_texts_spec(tmp_path, corpus_dir, tokenizer_dir, texts, num_lanes=1, shuffle_window_blocks=1)
    with within_seconds(60):
        rows = LaneStream(spec, 0).take(3)
    at = 600 * len(_lines([""])[0])  # a JSONL document's row is its line's byte offset
    assert {p.row for r in rows for p in r.pieces} == {at}  # the one document, again and again


def test_an_unshuffled_lane_whose_share_of_blocks_gives_no_token_is_an_error(tmp_path, corpus_dir, tokenizer_dir):
    """shuffle = false: lane 0 of 2 meets blocks 0 and 2 only. Both hold only empty texts (blocks 1 and 3 real
    ones), so the lane never meets every block; the count of its own blocks in a row stops it instead of a hang."""
    texts, size = [], 0
    for boundary, text in ((1024, ""), (2048, "a real document " * 4), (3072, ""), (4096, "another one " * 4)):
        while size < boundary and (boundary < 4096 or size + len(_lines([text])[0]) <= boundary):  # 4 blocks
            texts.append(text)
            size += len(_lines([text])[0])
    spec = _bare_texts_spec(tmp_path, corpus_dir, tokenizer_dir, texts, num_lanes=2, shuffle=False)
    assert spec.sources[0].num_blocks == 4
    with (
        within_seconds(60),
        pytest.raises(DataError, match=r"source 'web': lane 0 met 40[0-9] of its 4 blocks in a row without a doc"),
    ):
        LaneStream(spec, 0).take(1)
    assert LaneStream(spec, 1).take(1)[0].pieces  # control: lane 1 meets blocks 1 and 3
