import json
import os
import subprocess
import sys
from collections import defaultdict

import pytest
from helpers import data_table, drain_pieces, make_spec, rows_digest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_titan.engine import LaneExhausted, LaneState, LaneStream, open_lane_group
from zephon_titan.testing import assert_each_document_once, assert_restores_exactly


@pytest.mark.parametrize("packing", ["wrap", "best_fit"])
@given(
    lane=st.integers(0, 7),
    cut=st.integers(0, 60),
    after=st.integers(1, 8),
    labels=st.sampled_from(["document", "stream"]),
    shuffle=st.booleans(),
)
@settings(max_examples=20, deadline=None)
def test_restore_is_exact_at_random_cuts(corpus_dir, tokenizer_dir, packing, lane, cut, after, labels, shuffle):
    # Each side builds its own engine (fresh spec, sources and tokenizer objects).
    def factory():
        return make_spec(
            corpus_dir,
            tokenizer_dir,
            seq_len=48,
            packing=packing,
            best_fit_window_docs=8,
            labels=labels,
            shuffle=shuffle,
        )

    assert_restores_exactly(factory, lane, [cut], rows=after)


def test_state_is_small_json_of_integers(corpus_dir, tokenizer_dir):
    stream = LaneStream(make_spec(corpus_dir, tokenizer_dir), 4)
    stream.take(37)
    encoded = json.dumps(stream.state().to_dict())
    assert len(encoded) < 200, encoded
    assert LaneState.from_dict(json.loads(encoded)) == stream.state()


_CHILD = """
import json, sys
from zephon_titan.config import config_from_dict
from zephon_titan.engine import LaneState, LaneStream, build_engine
sys.path.insert(0, {tests!r})
from helpers import rows_digest, spec_of
spec = spec_of(config_from_dict(json.loads({table!r})), 48)
stream = LaneStream(spec, {lane}, LaneState.from_dict(json.loads({state!r})))
print(rows_digest(stream.take(6)))
"""


def test_restore_in_a_fresh_process(corpus_dir, tokenizer_dir):
    table = data_table(corpus_dir, tokenizer_dir)
    stream = LaneStream(make_spec(corpus_dir, tokenizer_dir, seq_len=48), 6)
    stream.take(23)
    state = json.dumps(stream.state().to_dict())
    expected = rows_digest(stream.take(6))
    code = _CHILD.format(tests=os.path.dirname(os.path.dirname(__file__)), table=json.dumps(table), lane=6, state=state)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == expected


@given(workers=st.integers(0, 3), prefetch=st.integers(1, 3), lanes=st.sets(st.integers(0, 7), min_size=1, max_size=8))
@settings(max_examples=8, deadline=None)
def test_lane_purity_alone_or_beside_others_with_any_workers(corpus_dir, tokenizer_dir, workers, prefetch, lanes):
    spec = make_spec(corpus_dir, tokenizer_dir)
    lane = min(lanes)
    alone = LaneStream(spec, lane).take(12)
    with open_lane_group(spec, sorted(lanes), 3, num_workers=workers, prefetch_factor=prefetch) as group:
        steps = [group.next_step() for _ in range(4)]
    beside = [row for step in steps for row in step[0]]
    assert [r.to_bytes() for r in beside] == [r.to_bytes() for r in alone]


def test_lanes_differ_and_seeds_matter(corpus_dir, tokenizer_dir):
    # Negative controls: other lanes and other seeds give other streams.
    spec = make_spec(corpus_dir, tokenizer_dir)
    digests = {rows_digest(LaneStream(spec, lane).take(4)) for lane in range(8)}
    assert len(digests) == 8
    other = make_spec(corpus_dir, tokenizer_dir, seed=8)
    assert rows_digest(LaneStream(other, 0).take(4)) != rows_digest(LaneStream(spec, 0).take(4))


@pytest.mark.parametrize("packing", ["wrap", "best_fit"])
def test_one_epoch_appears_exactly_once_across_lanes(corpus_dir, tokenizer_dir, prose_docs, code_docs, packing):
    spec = make_spec(corpus_dir, tokenizer_dir, seq_len=128, exhaustion="redistribute", packing=packing)
    # Every document of both sources once: tokens of its pieces tile [0, len) with no gap or overlap.
    assert assert_each_document_once(spec) == len(prose_docs) + len(code_docs)


@pytest.mark.parametrize("labels", ["document", "stream"])
def test_epoch_tokens_are_the_tokenized_documents(corpus_dir, tokenizer_dir, labels):
    # The bytes, not just the bookkeeping: rebuild every document from the rows.
    spec = make_spec(corpus_dir, tokenizer_dir, seq_len=100, exhaustion="redistribute", labels=labels)
    rebuilt = defaultdict(dict)
    pair_labels = defaultdict(dict)
    for piece, row in drain_pieces(spec):
        at = sum(p.length for p in row.pieces[: row.pieces.index(piece)])
        if labels == "document":  # the piece's inputs, and its labels: the same tokens one further
            rebuilt[(piece.file, piece.row)][piece.doc_offset] = row.inputs[at : at + piece.length].tolist()
            pair_labels[(piece.file, piece.row)][piece.doc_offset] = row.labels[at : at + piece.length].tolist()
        else:
            full = list(row.inputs) + [row.labels[-1]] if row.padding == 0 else list(row.inputs)
            rebuilt[(piece.file, piece.row)][piece.doc_offset] = [int(t) for t in full[at : at + piece.length]]
    for source in spec.sources:
        block = source.read_block(0)
        for row, tokens in zip(block.rows, spec.tokenizer.encode(block.texts)):
            parts = rebuilt[(block.file, row)]
            joined = [t for offset in sorted(parts) for t in parts[offset]]
            if labels == "document":
                targets = [t for offset in sorted(parts) for t in pair_labels[(block.file, row)][offset]]
                assert joined == tokens.tolist()[:-1] and targets == tokens.tolist()[1:]
            else:
                assert joined == tokens.tolist()


def test_source_with_fewer_blocks_than_lanes(tmp_path, corpus_dir, tokenizer_dir, code_docs):
    from corpus import write_parquet

    write_parquet(code_docs[:6], str(tmp_path / "tiny"), num_files=1, row_group_size=3)  # 2 blocks, 8 lanes
    sources = {
        "prose": {"paths": [os.path.join(corpus_dir, "prose", "*.jsonl")], "block_bytes": 16384},
        "tiny": {"paths": [str(tmp_path / "tiny" / "*.parquet")], "weight": 0.5},
    }
    spec = make_spec(corpus_dir, tokenizer_dir, sources=sources)
    assert spec.sources[1].num_blocks == 2
    for lane in range(8):  # every lane gets tiny's documents (from later epochs) and mixes them in
        stream = LaneStream(spec, lane)
        stream.take(400)  # a lane may start inside a 10k-token document
        assert stream.feed.state().cursors[1].tokens > 0
    finite = make_spec(corpus_dir, tokenizer_dir, sources=sources, exhaustion="redistribute")
    tiny_docs = {(p.file, p.row) for p, _ in drain_pieces(finite) if p.source == 1}
    assert len(tiny_docs) == 6


def test_a_lane_reads_only_its_own_blocks(corpus_dir, tokenizer_dir):
    spec = make_spec(corpus_dir, tokenizer_dir, exhaustion="redistribute")
    read_by_lane = {}
    for lane in range(spec.num_lanes):
        calls = []
        for s, source in enumerate(spec.sources):  # record, then forward to the real source (reads now or in threads)
            cls = type(source)
            source.read_block = lambda b, c=calls, s=s, src=source, cls=cls: c.append((s, b)) or cls.read_block(src, b)
            source.read_block_soon = lambda b, pool, c=calls, s=s, src=source, cls=cls: (
                c.append((s, b)) or cls.read_block_soon(src, b, pool)
            )
        stream = LaneStream(spec, lane)
        try:
            while True:
                stream.next_row()
        except LaneExhausted:
            pass
        read_by_lane[lane] = calls
    for s, source in enumerate(spec.sources):
        per_lane = [[b for src, b in read_by_lane[lane] if src == s] for lane in range(spec.num_lanes)]
        assert all(len(blocks) == len(set(blocks)) for blocks in per_lane)  # no block read twice
        everything = sorted(b for blocks in per_lane for b in blocks)
        assert everything == list(range(source.num_blocks))  # lanes split the source, nobody scans it all
        assert max(len(blocks) for blocks in per_lane) <= -(-source.num_blocks // spec.num_lanes)


def test_engine_imports_neither_torch_nor_torchtitan():
    code = "import sys, zephon_titan.engine, zephon_titan.config; print(sorted(m for m in ('torch', 'torchtitan') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
