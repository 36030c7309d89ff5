"""Fuzz: random small corpora and configs. Nothing crashes except with a clear ConfigError/DataError,
and every document of the epoch is accounted for exactly once."""

import json
import os
import tempfile

from helpers import spec_of
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zephon_titan.config import config_from_dict
from zephon_titan.engine import ConfigError, DataError, LaneStream
from zephon_titan.testing import assert_each_document_once

texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=300)
source = st.lists(st.lists(texts, min_size=0, max_size=12), min_size=1, max_size=3)  # files of documents


@given(
    sources=st.lists(source, min_size=1, max_size=3),
    weights=st.lists(st.floats(0.05, 5), min_size=3, max_size=3),
    lanes=st.integers(1, 5),
    seq_len=st.integers(1, 48),
    packing=st.sampled_from(["wrap", "best_fit"]),
    labels=st.sampled_from(["document", "stream"]),
    block_bytes=st.integers(1024, 4096),
    window=st.integers(1, 3),
    bos=st.booleans(),
)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_corpora_and_configs(
    tokenizer_dir, sources, weights, lanes, seq_len, packing, labels, block_bytes, window, bos
):
    with tempfile.TemporaryDirectory() as root:
        table = {}
        for s, files in enumerate(sources):
            for f, docs in enumerate(files):
                os.makedirs(os.path.join(root, f"s{s}"), exist_ok=True)
                with open(os.path.join(root, f"s{s}", f"{f}.jsonl"), "w", encoding="utf-8") as out:
                    out.writelines(json.dumps({"text": d}) + "\n" for d in docs)
            table[f"s{s}"] = {
                "paths": [os.path.join(root, f"s{s}", "*.jsonl")],
                "weight": weights[s],
                "block_bytes": block_bytes,
            }
        config = {
            "num_lanes": lanes,
            "seed": 1,
            "tokenizer_path": tokenizer_dir,
            "packing": packing,
            "labels": labels,
            "exhaustion": "redistribute",
            "shuffle_window_blocks": window,
            "add_bos": bos,
            "best_fit_window_docs": 4,
            "sources": table,
        }
        try:
            spec = spec_of(config_from_dict(config), seq_len)
        except (ConfigError, DataError) as e:
            # The only expected refusal: a source whose files are all empty.
            assert "has no data" in str(e), e
            assert any(all(not docs for docs in files) for files in sources)
            return
        assert_each_document_once(spec)


long_texts = st.text(st.sampled_from("abc xyz\n"), min_size=0, max_size=3000)  # lines of up to ~3 blocks


@given(
    files=st.lists(st.lists(long_texts, min_size=0, max_size=4), min_size=1, max_size=3),
    lanes=st.sampled_from([64, 256, 1024]),
    window=st.integers(1, 3),
    packing=st.sampled_from(["wrap", "best_fit"]),
)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_many_lanes_over_few_blocks_all_give_rows(tokenizer_dir, files, lanes, window, packing):
    """Endless mode, more lanes than blocks, blocks without a line start (long lines, blank-only files): every
    lane gives its rows, whatever its shuffle window holds (a window of empty blocks reads on)."""
    files = [*files, ["one document"]]  # the source holds at least one
    with tempfile.TemporaryDirectory() as root:
        for f, docs in enumerate(files):
            with open(os.path.join(root, f"{f}.jsonl"), "w", encoding="utf-8") as out:
                out.writelines(json.dumps({"text": d}) + "\n" for d in docs)
            if not docs:
                with open(os.path.join(root, f"{f}.jsonl"), "w") as out:
                    out.write("\n \n" * 500)  # a file of blank lines: 2 blocks without a document
        config = {
            "num_lanes": lanes,
            "seed": 1,
            "tokenizer_path": tokenizer_dir,
            "packing": packing,
            "shuffle_window_blocks": window,
            "best_fit_window_docs": 4,
            "sources": {"web": {"paths": [os.path.join(root, "*.jsonl")], "block_bytes": 1024}},
        }
        spec = spec_of(config_from_dict(config), 16)
        for lane in range(lanes):
            (row,) = LaneStream(spec, lane).take(1)
            assert row.pieces, lane
