"""Parity with TorchTitan's own pretraining loader: on one JSONL source read in file order (one lane,
`shuffle = false`), our rows (inputs, labels, positions) equal those of TorchTitan 0.3's
`HuggingFaceTextDataset` (the `c4_test` reader over a local directory) for the same documents and
tokenizer, under the default `labels = "document"`; the `stream` rule differs (negative control)."""

import json
import os

import corpus
import numpy as np
import pytest
from helpers import REAL_TOKENIZERS, real_tokenizer, spec_of

from zephon_titan.config import config_from_dict
from zephon_titan.engine import LaneExhausted, LaneStream
from zephon_titan.titan.tokenizer import load_hf_tokenizer

SEQ_LEN = 64


def _documents() -> list[str]:
    """Real prose of every length: empty, one character, short, and several rows long."""
    prose = corpus.prose_documents()[:40]
    return ["", "x", "Hello world.", prose[0][:5000], *[doc[: 40 + 97 * i] for i, doc in enumerate(prose[1:])]]


def _titan_rows(data_dir: str, tokenizer_dir: str, tmp_path, monkeypatch) -> list[tuple[np.ndarray, ...]]:
    import datasets
    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataset

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))  # no shared cache
    dataset = HuggingFaceTextDataset(
        "c4_test", data_dir, load_hf_tokenizer(tokenizer_dir), seq_len=SEQ_LEN, infinite=False
    )
    return [(x["input"].numpy(), x["positions"].numpy(), y.numpy()) for x, y in dataset]


def _our_rows(data_dir: str, tokenizer_dir: str, labels: str) -> list[tuple[np.ndarray, ...]]:
    config = config_from_dict(
        {
            "num_lanes": 1,
            "shuffle": False,
            "labels": labels,
            "exhaustion": "redistribute",
            "tokenizer_path": tokenizer_dir,
            "add_bos": True,  # TorchTitan encodes every document with add_bos=True, add_eos=True
            "add_eos": True,
            "sources": {"web": {"paths": [os.path.join(data_dir, "*.jsonl")], "block_bytes": 4096}},
        }
    )
    stream = LaneStream(spec_of(config, SEQ_LEN), 0)
    rows = []
    try:
        while True:
            row = stream.next_row()
            rows.append((row.inputs, row.positions, row.labels, row.padding))
    except LaneExhausted:
        pass
    return rows


@pytest.mark.parametrize("tokenizer", ["fixture", *REAL_TOKENIZERS])
def test_rows_equal_torchtitans_text_dataset(tmp_path, monkeypatch, tokenizer_dir, tokenizer):
    tok = tokenizer_dir if tokenizer == "fixture" else real_tokenizer(tokenizer)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    with open(data_dir / "train.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": doc}) + "\n" for doc in _documents())
    theirs = _titan_rows(str(data_dir), tok, tmp_path, monkeypatch)
    ours = _our_rows(str(data_dir), tok, "document")
    assert len(theirs) > 20
    # TorchTitan drops the last partial row of a finite dataset; we pad it (and only it).
    assert len(ours) == len(theirs) + 1 and ours[-1][3] > 0 and all(row[3] == 0 for row in ours[:-1])
    for i, ((inputs, positions, labels), (our_inputs, our_positions, our_labels, _)) in enumerate(zip(theirs, ours)):
        assert np.array_equal(inputs, our_inputs), f"row {i}: inputs differ"
        assert np.array_equal(labels, our_labels), f"row {i}: labels differ"
        assert np.array_equal(positions, our_positions), f"row {i}: positions differ"
    # Negative control: the stream rule (last token of a document predicts the next one's first) differs.
    stream = _our_rows(str(data_dir), tok, "stream")
    assert any(not np.array_equal(t[2], s[2]) for t, s in zip(theirs, stream))
