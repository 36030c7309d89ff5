"""The train/eval split (engine/split.py) and the eval set (engine/eval_set.py), without the trainer.

Training never reads a held-out document, the two parts together are every document exactly
once, the split and the eval rows are the same for every W, and another split_seed is another
split (the negative control).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import make_spec, rows_digest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_titan.engine import fingerprint, lanes_of_rank
from zephon_titan.engine.eval_set import eval_steps, label_counts
from zephon_titan.engine.split import held_out, kept
from zephon_titan.errors import ConfigError
from zephon_titan.plan import plan_eval_set
from zephon_titan.testing import assert_each_document_once, epoch_rows
from zephon_titan.titan.job import load_job
from zephon_titan.titan.validator import decode_labels, encode_labels

ROWS = list(range(20_000))


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**63 - 1),
    low=st.floats(0.0, 0.5),
    extra=st.floats(0.0, 0.49),
    name=st.text(min_size=1, max_size=12).filter(lambda s: "/" not in s),
)
def test_held_out_is_a_keyed_monotone_share(seed, low, extra, name):
    smaller = held_out(seed, f"a/{name}", ROWS, low)
    larger = held_out(seed, f"a/{name}", ROWS, low + extra)
    assert not (smaller & ~larger).any()  # raising the fraction only adds eval documents
    share = larger.mean()
    assert abs(share - (low + extra)) < 6 * np.sqrt(0.25 / len(ROWS)) + 1e-9
    assert (held_out(seed, f"elsewhere/{name}", ROWS, low) == smaller).all()  # the directory does not count
    assert (kept("train", seed, name, ROWS, low) == ~held_out(seed, name, ROWS, low)).all()


def test_held_out_depends_on_the_seed_and_the_file():
    a = held_out(0, "part-0.jsonl", ROWS, 0.1)
    assert (a != held_out(1, "part-0.jsonl", ROWS, 0.1)).any()
    assert (a != held_out(0, "part-1.jsonl", ROWS, 0.1)).any()
    assert not held_out(0, "part-0.jsonl", ROWS, 0.0).any()


def _split_specs(corpus_dir, tokenizer_dir, split_seed=0, **overrides):
    sources = {
        "code": {"paths": [f"{corpus_dir}/code/*.parquet"], "weight": 0.4, "eval_fraction": 0.2},
        "prose": {"paths": [f"{corpus_dir}/prose/*.jsonl"], "weight": 0.6, "block_bytes": 16384, "eval_fraction": 0.1},
    }
    common = dict(sources=sources, exhaustion="redistribute", split_seed=split_seed, **overrides)
    train = make_spec(corpus_dir, tokenizer_dir, **common)
    evaluation = make_spec(corpus_dir, tokenizer_dir, split="eval", **common)
    return train, evaluation


def _documents(rows) -> set[tuple[str, int]]:
    return {(piece.file, piece.row) for row in rows for piece in row.pieces}


@pytest.mark.parametrize("labels", ["document", "stream"])
def test_training_never_reads_an_eval_document(corpus_dir, tokenizer_dir, labels):
    train, evaluation = _split_specs(corpus_dir, tokenizer_dir, labels=labels)
    train_rows, eval_rows = epoch_rows(train), epoch_rows(evaluation)
    train_docs, eval_docs = _documents(train_rows), _documents(eval_rows)
    assert eval_docs and not train_docs & eval_docs
    # Together the two parts are every document of the corpus, each exactly once.
    assert_each_document_once(train, train_rows + eval_rows)
    # The eval part is what the hash says, whatever lane read it.
    for piece in (p for row in eval_rows for p in row.pieces):
        fraction = 0.2 if piece.file.endswith(".parquet") else 0.1
        assert held_out(0, piece.file, [piece.row], fraction)[0]


def test_another_split_seed_is_another_split(corpus_dir, tokenizer_dir):
    """The negative control: the check above can fail (seed 1's eval documents are trained on by seed 0)."""
    train0, eval0 = _split_specs(corpus_dir, tokenizer_dir, split_seed=0)
    _, eval1 = _split_specs(corpus_dir, tokenizer_dir, split_seed=1)
    eval0_docs, eval1_docs = _documents(epoch_rows(eval0)), _documents(epoch_rows(eval1))
    assert eval0_docs != eval1_docs
    assert eval1_docs & _documents(epoch_rows(train0))
    assert (
        fingerprint(train0)["split"] != fingerprint(_split_specs(corpus_dir, tokenizer_dir, split_seed=1)[0])["split"]
    )


def test_a_run_without_a_split_keeps_its_fingerprint(corpus_dir, tokenizer_dir):
    assert "split" not in fingerprint(make_spec(corpus_dir, tokenizer_dir))


@settings(max_examples=6, deadline=None)
@given(
    world=st.sampled_from([1, 2, 4, 8]), rows_per_lane=st.integers(1, 3), labels=st.sampled_from(["document", "stream"])
)
def test_eval_rows_are_the_same_for_every_world_size(corpus_dir, tokenizer_dir, world, rows_per_lane, labels):
    _, evaluation = _split_specs(corpus_dir, tokenizer_dir, labels=labels)
    every_lane = list(eval_steps(evaluation, range(8), rows_per_lane))
    assert every_lane and len(every_lane) < 1000
    # Each rank steps its own lanes; "does any lane of the run have rows" is answered for all ranks.
    per_rank = [
        list(eval_steps(evaluation, lanes_of_rank(8, world, rank), rows_per_lane, len(every_lane), lambda live: True))
        for rank in range(world)
    ]
    for t, step in enumerate(every_lane):
        assert rows_digest(step.rows) == rows_digest(row for rank in per_rank for row in rank[t].rows)
    if world > 1:  # negative control: the comparison sees the lane order (ranks concatenated backwards)
        backwards = [row for rank in reversed(per_rank) for row in rank[0].rows]
        assert rows_digest(every_lane[0].rows) != rows_digest(backwards)
    # The last step still has a row; after it every lane only pads.
    assert any(row.pieces for row in every_lane[-1].rows)
    assert sum(label_counts(step.rows, 2)[s] for step in every_lane for s in range(2)) == sum(
        int((row.labels != -100).sum()) for step in every_lane for row in step.rows
    )


def test_a_fixed_number_of_eval_steps(corpus_dir, tokenizer_dir):
    _, evaluation = _split_specs(corpus_dir, tokenizer_dir)
    everything = list(eval_steps(evaluation, range(8), 1))
    first_two = list(eval_steps(evaluation, range(8), 1, 2))
    assert [rows_digest(s.rows) for s in first_two] == [rows_digest(s.rows) for s in everything[:2]]


def test_labels_and_sources_survive_the_shared_encoding():
    labels = torch.tensor([[5, -100, 1 << 31, 0], [7, 8, -100, 3]])
    sources = torch.tensor([[0, -1, 199, 2], [1, 1, -1, 0]])
    got_labels, got_sources = decode_labels(encode_labels(labels, sources))
    assert torch.equal(got_labels, labels)
    assert torch.equal(got_sources, sources)


def test_split_settings_are_checked(corpus_dir, tokenizer_dir):
    with pytest.raises(ConfigError, match=r"eval_fraction must be <= 0.99, got 1.0"):
        make_spec(corpus_dir, tokenizer_dir, sources={"a": {"paths": [f"{corpus_dir}/code/*"], "eval_fraction": 1.0}})
    with pytest.raises(ConfigError, match="hold out no documents"):
        make_spec(corpus_dir, tokenizer_dir, split="eval")
    with pytest.raises(ConfigError, match="split must be one of train, eval, got"):
        make_spec(corpus_dir, tokenizer_dir, split="test")


def test_separate_eval_files_are_read_whole_and_planned(tmp_path, corpus_dir, tokenizer_dir):
    """[validator.dataloader.sources.*]: eval files of their own, every document once (steps = -1)."""
    job = tmp_path / "job.toml"
    job.write_text(
        f'hf_assets_path = "{tokenizer_dir}"\n[model]\nmodule = "llama3"\nconfig = "llama3_debugmodel"\n'
        "[training]\nseq_len = 64\nlocal_batch_size = 2\nglobal_batch_size = 8\n[dataloader]\nnum_lanes = 4\n"
        f'[dataloader.sources.code]\npaths = ["{corpus_dir}/code/*.parquet"]\n[validator]\nenable = true\n'
        f'[validator.dataloader.sources.prose]\npaths = ["{corpus_dir}/prose/*.jsonl"]\nblock_bytes = 16384\n'
    )
    planned = plan_eval_set(str(job))
    prose = make_spec(corpus_dir, tokenizer_dir, sources={"prose": {"paths": [f"{corpus_dir}/prose/*.jsonl"]}})
    targets = sum(
        max(len(tokens) - 1, 0)  # labels = "document": a document of n tokens has n - 1 targets
        for b in range(prose.sources[0].num_blocks)
        for tokens in prose.tokenizer.encode(prose.sources[0].read_block(b).texts)
    )
    assert planned["tokens"] == {"prose": targets}
    assert planned["rows"] == 8 * planned["steps"] and planned == plan_eval_set(str(job))
    with pytest.raises(
        ConfigError, match=r"size is 3, which does not divide \[validator.dataloader\] global_batch_size = 8"
    ):
        load_job(str(job)).check_eval_layout(3)


def test_the_eval_set_is_defined_per_seq_len(tmp_path, corpus_dir, tokenizer_dir):
    """An eval at another seq_len is another set: its SHA-256 differs and the record names the length; the same
    job twice is the same set (the control: the digest is not just new every time)."""
    planned = {}
    for seq_len in (64, 128):
        job = tmp_path / f"job{seq_len}.toml"
        job.write_text(
            f'hf_assets_path = "{tokenizer_dir}"\n[model]\nmodule = "llama3"\nconfig = "llama3_debugmodel"\n'
            f"[training]\nseq_len = {seq_len}\nlocal_batch_size = 2\nglobal_batch_size = 8\n[dataloader]\n"
            f'num_lanes = 4\n[dataloader.sources.code]\npaths = ["{corpus_dir}/code/*.parquet"]\n'
            f'[validator]\nenable = true\nsteps = 2\n[validator.dataloader.sources.prose]\npaths = ["{corpus_dir}/prose/*.jsonl"]\n'
        )
        planned[seq_len] = plan_eval_set(str(job))
        assert planned[seq_len]["seq_len"] == seq_len
    assert planned[64] == plan_eval_set(str(tmp_path / "job64.toml"))
    assert planned[64]["sha256"] != planned[128]["sha256"]
    assert planned[64]["steps"] == planned[128]["steps"] == 2
    assert planned[128]["tokens"]["prose"] > planned[64]["tokens"]["prose"]  # 2 steps of longer rows: more targets
