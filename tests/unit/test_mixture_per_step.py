"""The mixture in every step, measured with `plan` (issue: a new user's 3-source debug job saw steps 1-8
from one source). Three sources, 0.5 / 0.2 / 0.3, one of book-length documents; 8 lanes, 16 rows of 128
tokens per step: every source is in step 1, every later step is within 0.2 of the weights, and the
cumulative shares are within 0.02 by step 50. The old granularity (whole documents) fails the same test."""

import json
import os

import pytest

from zephon_titan.cli import main
from zephon_titan.plan import mixture_report, plan_ledger

STEPS = 50


def _job(tmp_path, corpus_dir, tokenizer_dir, prose_docs, seed=11, **data) -> str:
    books = tmp_path / "books"
    books.mkdir(exist_ok=True)
    with open(books / "books.jsonl", "w", encoding="utf-8") as f:  # ~20 documents of 10k+ tokens each
        for i in range(20):
            f.write(json.dumps({"text": "\n\n".join(prose_docs[i * 15 : (i + 1) * 15])}) + "\n")
    extra = "".join(f"{k} = {v}\n" for k, v in data.items())
    path = tmp_path / "job.toml"
    path.write_text(
        f'hf_assets_path = "{tokenizer_dir}"\n[model]\nmodule = "llama3"\nconfig = "llama3_debugmodel"\n'
        "[training]\nseq_len = 128\nglobal_batch_size = 16\nlocal_batch_size = 2\n"
        f"[dataloader]\nnum_lanes = 8\nseed = {seed}\n{extra}"
        f'[dataloader.sources.books]\npaths = ["{books}/*.jsonl"]\nweight = 0.5\n'
        f'[dataloader.sources.code]\npaths = ["{corpus_dir}/code/*.parquet"]\nweight = 0.2\n'
        f'[dataloader.sources.prose]\npaths = ["{corpus_dir}/prose/*.jsonl"]\nweight = 0.3\nblock_bytes = 16384\n'
    )
    return str(path)


def _report(job):
    return mixture_report(list(plan_ledger(job, STEPS)), [0.5, 0.2, 0.3])


@pytest.mark.parametrize("seed", [11, 1, 2])  # the seed reorders every source's documents
def test_every_step_holds_the_mixture(tmp_path, corpus_dir, tokenizer_dir, prose_docs, seed):
    report = _report(_job(tmp_path, corpus_dir, tokenizer_dir, prose_docs, seed))
    errors = report.step_errors()
    print(report.format())
    assert all(share > 0 for share in report.shares[0]), report.shares[0]  # every source in step 1
    assert max(errors[1:]) <= 0.2, errors
    assert report.cumulative_errors()[-1] <= 0.02


def test_whole_document_mixing_fails_the_same_test(tmp_path, corpus_dir, tokenizer_dir, prose_docs):
    # Negative control: pieces as large as any document (the old granularity) break the per-step target.
    report = _report(_job(tmp_path, corpus_dir, tokenizer_dir, prose_docs, mix_chunk_tokens=1 << 30))
    assert max(report.step_errors()[1:]) > 0.2 or report.cumulative_errors()[-1] > 0.02


def test_plan_mixture_prints_the_shares(tmp_path, corpus_dir, tokenizer_dir, prose_docs, capsys):
    job = _job(tmp_path, corpus_dir, tokenizer_dir, prose_docs)
    text = open(job).read().replace("weight = 0.5", "weight = 5").replace("0.2\n", "2\n").replace("0.3\n", "3\n")
    with open(job, "w") as f:
        f.write(text)
    assert main(["plan", job, "--steps", "12", "--mixture", "-o", str(tmp_path / "plan.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "weights books 5, code 2, prose 3 sum to 10; normalized: 0.5000, 0.2000, 0.3000" in out
    assert "mixture over steps 1-12" in out and "cumulative at step 1, 10, 12" in out
    assert os.path.exists(tmp_path / "plan.jsonl")
    with pytest.raises(SystemExit):
        main(["plan", job, "--steps", "x"])
