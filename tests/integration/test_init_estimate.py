"""`zephon-titan init` estimates a source from documents spread over each file (issue 46): an ordered file
(short documents first, long ones last) whose first 64 documents are far from its mean is counted whole when
small, and sampled across its length when big; the weights follow the true token counts. The negative control:
the first-64 estimate init made before is outside the tolerance."""

from __future__ import annotations

import json
import os
import re

import pytest

from zephon_titan.cli import main
from zephon_titan.engine.sources import formats, storage
from zephon_titan.init_job import estimate
from zephon_titan.init_job.sampling import inspect_sources
from zephon_titan.titan.tokenizer import load_tokenizer
from zephon_titan.toml_file import load_toml

pytestmark = pytest.mark.integration

TOLERANCE = 0.10  # a sampled file's token estimate is within 10 % of validate's count (here: ~2 %)


@pytest.fixture(scope="module")
def folder(tmp_path_factory, prose_docs, tokenizer_dir) -> dict:
    """data/ordered: 600 documents of 3, 3, 4, 4, ... words (~0.5 MB); data/flat: 400 of 40 words; validate's
    counts of both (every document tokenized), from a job init wrote."""
    root = tmp_path_factory.mktemp("ordered")
    words = " ".join(prose_docs).split()
    ordered = [" ".join(words[i : i + 3 + i // 2]) for i in range(600)]
    flat = [" ".join(words[40 * i : 40 * i + 40]) for i in range(400)]
    for name, docs in (("ordered", ordered), ("flat", flat)):
        os.makedirs(root / "data" / name)
        with open(root / "data" / name / "part-0.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in docs)
    return {"root": str(root), "tokenizer": tokenizer_dir}


def _init(folder: dict, capsys) -> tuple[str, dict]:
    root = folder["root"]
    job = os.path.join(root, "job.toml")
    argv = ["init", f"{root}/data/ordered", f"{root}/data/flat", "--tokenizer", folder["tokenizer"], "--gpus", "1",
            "--seq-len", "128", "-o", job, "--force"]  # fmt: skip
    assert main(argv) == 0
    return capsys.readouterr().out, load_toml(job)


def _validate_counts(folder: dict, capsys) -> dict[str, int]:
    assert main(["validate", os.path.join(folder["root"], "job.toml"), "--world-sizes", "1"]) == 0
    found = re.findall(
        r"(\w+) +weight [\d.]+ .*?, [\d,]+ documents, ([\d,]+) tokens per epoch", capsys.readouterr().out
    )
    return {name: int(tokens.replace(",", "")) for name, tokens in found}


def _plans(folder: dict) -> dict:
    tokenizer = load_tokenizer(folder["tokenizer"], key="--tokenizer", backend="tokenizers")
    root = folder["root"]
    return {p.name: p for p in inspect_sources([f"{root}/data/ordered", f"{root}/data/flat"], tokenizer)}


def _first_64_estimate(folder: dict) -> float:
    """The estimate init made before issue 46: the file's documents times its first 64 documents' mean."""
    tokenizer = load_tokenizer(folder["tokenizer"], key="--tokenizer", backend="tokenizers")
    (f,) = storage.expand(os.path.join(folder["root"], "data", "ordered", "part-0.jsonl"))
    sample_file = formats.get_format("jsonl", "").init.sample_file
    sample = sample_file(f)
    ids = tokenizer.encode(sample.texts["text"])
    return sample.file_documents * sum(len(i) for i in ids) / len(ids)


def test_a_small_ordered_file_is_counted_whole_and_the_weights_follow_its_tokens(folder, capsys):
    said, job = _init(folder, capsys)
    counted = _validate_counts(folder, capsys)
    plans = _plans(folder)
    assert plans["ordered"].exact and plans["ordered"].tokens == counted["ordered"]  # exact: validate's count
    assert plans["flat"].exact and plans["flat"].tokens == counted["flat"]
    assert "ordered: jsonl, 1 file," in said and "(every document counted)" in said
    total = sum(counted.values())
    for name, source in job["dataloader"]["sources"].items():
        assert source["weight"] == pytest.approx(counted[name] / total, abs=1e-4)  # the true shares, rounded
    first_64 = _first_64_estimate(folder)  # negative control: the old estimate is far off on this file
    assert abs(first_64 / counted["ordered"] - 1) > 3 * TOLERANCE, (first_64, counted)


def test_a_big_ordered_file_is_sampled_across_its_length(folder, capsys, monkeypatch):
    """The budgets made small: the file is read in 32 KiB of 4 KiB blocks spread over it, not counted whole."""
    _init(folder, capsys)
    counted = _validate_counts(folder, capsys)
    monkeypatch.setattr(estimate, "FILE_BUDGET_BYTES", 32 << 10)
    monkeypatch.setattr(estimate, "SOURCE_BUDGET_BYTES", 32 << 10)
    monkeypatch.setattr(estimate, "SAMPLE_BLOCK_BYTES", 4 << 10)
    said, job = _init(folder, capsys)
    plans = _plans(folder)
    ordered = plans["ordered"]
    assert not ordered.exact and 0 < ordered.tokenized < 600
    assert abs(ordered.tokens / counted["ordered"] - 1) < TOLERANCE, (ordered.tokens, counted)
    assert f"(estimated from {ordered.tokenized:,} of them, spread over its files)" in said
    comment = open(os.path.join(folder["root"], "job.toml"), encoding="utf-8").read()
    assert f"estimated from {ordered.tokenized:,} of them" in comment
    total = sum(counted.values())
    weight = job["dataloader"]["sources"]["ordered"]["weight"]
    assert weight == pytest.approx(counted["ordered"] / total, rel=TOLERANCE)
    assert abs(_first_64_estimate(folder) / counted["ordered"] - 1) > TOLERANCE  # the old estimate is not
