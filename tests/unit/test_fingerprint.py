import pytest
from helpers import make_spec

from zephon_titan.engine import ResumeError, check_fingerprint, fingerprint


def test_same_config_same_fingerprint(corpus_dir, tokenizer_dir):
    a = fingerprint(make_spec(corpus_dir, tokenizer_dir))
    check_fingerprint(a, fingerprint(make_spec(corpus_dir, tokenizer_dir, num_workers=3)))  # workers are free


@pytest.mark.parametrize(
    "change, named",
    [
        ({"seed": 8}, "seed: 7 -> 8"),
        ({"num_lanes": 4}, "num_lanes: 8 -> 4"),
        ({"packing": "best_fit"}, "packing: wrap -> best_fit"),
        ({"add_bos": False}, "tokenizer: "),
        ({"shuffle_window_blocks": 3}, "shuffle_window_blocks: 2 -> 3"),
        ({"labels": "stream"}, "labels: document -> stream"),
        ({"shuffle": False}, "shuffle: on -> off"),
        ({"mix_chunk_tokens": 32}, "mix_chunk_tokens: 64 -> 32"),
    ],
)
def test_changes_are_named(corpus_dir, tokenizer_dir, change, named):
    saved = fingerprint(make_spec(corpus_dir, tokenizer_dir))
    with pytest.raises(ResumeError, match=named):
        check_fingerprint(saved, fingerprint(make_spec(corpus_dir, tokenizer_dir, **change)))


def test_seq_len_and_data_changes_are_named(corpus_dir, tokenizer_dir, tmp_path):
    saved = fingerprint(make_spec(corpus_dir, tokenizer_dir, seq_len=64))
    with pytest.raises(ResumeError, match="seq_len: 64 -> 32"):
        check_fingerprint(saved, fingerprint(make_spec(corpus_dir, tokenizer_dir, seq_len=32)))
    sources = make_spec(corpus_dir, tokenizer_dir).config.sources
    table = {s.name: {"paths": s.paths, "weight": s.weight, "block_bytes": s.block_bytes} for s in sources}
    table["prose"]["block_bytes"] = 8192
    with pytest.raises(ResumeError, match="layout.prose: "):
        check_fingerprint(saved, fingerprint(make_spec(corpus_dir, tokenizer_dir, seq_len=64, sources=table)))
    table["prose"]["block_bytes"], table["prose"]["weight"] = 16384, 0.9
    with pytest.raises(ResumeError, match="weights: "):
        check_fingerprint(saved, fingerprint(make_spec(corpus_dir, tokenizer_dir, seq_len=64, sources=table)))


def test_a_checkpoint_of_the_previous_state_version_is_refused_naming_it(corpus_dir, tokenizer_dir):
    # Version 1 mixed whole documents with the stream label rule: its rows cannot be continued.
    old = fingerprint(make_spec(corpus_dir, tokenizer_dir, labels="stream"))
    old["state_version"] = "1"
    del old["labels"], old["shuffle"], old["mix_chunk_tokens"]
    with pytest.raises(ResumeError, match="state_version: 1 -> 2"):
        check_fingerprint(old, fingerprint(make_spec(corpus_dir, tokenizer_dir, labels="stream")))
