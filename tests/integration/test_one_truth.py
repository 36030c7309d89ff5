"""One truth through the real TorchTitan trainer: with no [dataloader] tokenizer_path the run uses the
trainer's own tokenizer, and `plan` (offline, one process) predicts its ledger exactly, from the start
and from the trainer's checkpoint, for real tokenizers and a corpus full of their special-token strings.
A user mistake under torchrun is one line, printed once, with no traceback from our processes."""

import os

import corpus
import pytest
from conftest import check, copy_checkpoint, ledger, torchrun
from helpers import REAL_TOKENIZERS, real_tokenizer, special_token_strings, with_special_tokens

pytestmark = pytest.mark.integration
STEPS = 3


def _write_job(root: str, tokenizer_dir: str, vocab: int, **training) -> str:
    settings = {"seq_len": 64, "local_batch_size": 2, "global_batch_size": 8, "steps": STEPS, **training}
    path = os.path.join(root, "job.toml")
    with open(path, "w") as f:
        f.write(
            f'hf_assets_path = "{tokenizer_dir}"\n'
            '[model]\nmodule = "llama3"\nconfig = "llama3_debugmodel"\n'
            f"vocab_size = {-(-vocab // 64) * 64}\n"
            "[training]\n" + "".join(f"{k} = {v}\n" for k, v in settings.items()) + "[lr_scheduler]\nwarmup_steps = 1\n"
            "[checkpoint]\nenable = true\ninterval = 2\nlast_save_model_only = false\n"
            "[debug]\nseed = 42\n"
            "[dataloader]\nnum_lanes = 4\nseed = 5\n"
            '[dataloader.sources.code]\npaths = ["data/code/*.parquet"]\nweight = 0.5\n'
            '[dataloader.sources.prose]\npaths = ["data/prose/*.jsonl"]\nweight = 0.5\nblock_bytes = 8192\n'
        )
    return path


def _workdir(root: str, tokenizer_dir: str) -> str:
    """Documents that each hold the tokenizer's special-token strings, as a job directory."""
    specials = special_token_strings(tokenizer_dir)
    prose = [
        f"{doc[:400]} {specials[i % len(specials)]} {doc[400:800]}{specials[(i + 1) % len(specials)]}"
        for i, doc in enumerate(corpus.prose_documents()[:48])
    ]
    code = [f"{specials[i % len(specials)]}{doc[:600]}" for i, doc in enumerate(corpus.code_documents(max_files=24))]
    corpus.write_jsonl(prose, os.path.join(root, "data", "prose"), num_files=2)
    corpus.write_parquet(code, os.path.join(root, "data", "code"), num_files=2, row_group_size=4)
    return root


@pytest.fixture(scope="module")
def fixture_special_tokenizer(tokenizer_dir, tmp_path_factory) -> str:
    return with_special_tokens(
        tokenizer_dir, str(tmp_path_factory.mktemp("special")), ["<|im_start|>", "<|image|>", "<|begin_of_text|>"]
    )


def _vocab(tokenizer_dir: str) -> int:
    from zephon_titan.titan.tokenizer import load_tokenizer

    return load_tokenizer(tokenizer_dir).vocab_size


# All in the slow tier (`-m slow`, which .ci/run runs too): the gate checks the real trainer's ledger against
# `plan` from the start and across resumes in test_trainer_resume.py (test_plan_predicts_every_run), and every
# tokenizer's rows in-process (test_tokenizer_backends, test_torchtitan_parity).
@pytest.mark.slow
@pytest.mark.parametrize("name", ["fixture", *REAL_TOKENIZERS])
def test_trainer_ledger_equals_plan_from_start_and_from_its_checkpoint(
    name, fixture_special_tokenizer, tmp_path, monkeypatch
):
    tokenizer_dir = fixture_special_tokenizer if name == "fixture" else real_tokenizer(name)
    root = _workdir(str(tmp_path), tokenizer_dir)
    job = _write_job(root, tokenizer_dir, _vocab(tokenizer_dir))
    args = ["--job.config_file", job, "--dump_folder"]
    check(torchrun(root, "zephon_titan.train_cpu", 2, args + ["run"]))
    runs = ["run"]
    if name == "fixture":  # resumed on another rank count (the real tokenizers: the same checkpoint path, planned)
        copy_checkpoint(root, "run", 2, "resumed")
        check(torchrun(root, "zephon_titan.train_cpu", 1, args + ["resumed"]))
        runs.append("resumed")

    monkeypatch.chdir(root)
    from zephon_titan.cli import main

    assert main(["plan", job, "--steps", str(STEPS), "-o", "plan.jsonl"]) == 0
    assert (
        main(
            ["plan", job, "--steps", str(STEPS), "--from-checkpoint", "run/checkpoint/step-2", "-o", "from_step2.jsonl"]
        )
        == 0
    )
    run = ledger("run/checkpoint/ledger.jsonl")
    assert sorted(run) == list(range(1, STEPS + 1)) and len(set(run.values())) == STEPS
    assert sorted(ledger("from_step2.jsonl")) == [3]
    for folder in runs:
        assert ledger(f"{folder}/checkpoint/ledger.jsonl") == ledger("plan.jsonl") == run
        assert main(["verify", "from_step2.jsonl", f"{folder}/checkpoint/ledger.jsonl", "--steps", "3-3"]) == 0
        assert main(["verify", "plan.jsonl", f"{folder}/checkpoint/ledger.jsonl"]) == 0


def test_a_tokenizer_missing_one_special_token_plans_differently(
    fixture_special_tokenizer, tokenizer_dir, tmp_path, monkeypatch
):
    # Negative control for the test above: the ledger sees the special tokens.
    root = _workdir(str(tmp_path), fixture_special_tokenizer)
    fewer = with_special_tokens(tokenizer_dir, str(tmp_path / "fewer"), ["<|image|>", "<|begin_of_text|>"])
    monkeypatch.chdir(root)
    from zephon_titan.plan import plan_ledger

    full = [e.sha256 for e in plan_ledger(_write_job(root, fixture_special_tokenizer, 2048), STEPS)]
    other = [e.sha256 for e in plan_ledger(_write_job(root, fewer, 2048), STEPS)]
    assert full != other


@pytest.mark.slow  # the gate checks the launcher's one line (test_launch.py) and a resume refused before the model
def test_a_config_mistake_under_torchrun_is_one_line_once(tmp_path, tokenizer_dir):
    root = _workdir(str(tmp_path), tokenizer_dir)
    job = _write_job(root, tokenizer_dir, 2048, global_batch_size=12, local_batch_size=4)  # 6 rows per rank
    result = torchrun(root, "zephon_titan.train_cpu", 2, ["--job.config_file", job], timeout=300)
    output = result.stdout + result.stderr
    line = "zephon_titan: error: "
    assert result.returncode != 0
    printed = [text for text in output.splitlines() if text.startswith(line)]
    assert len(printed) == 1, output[-3000:]  # once, not once per rank
    ours = printed[0]
    assert "use a local_batch_size in [1, 2, 3, 6]" in ours
    # The only traceback is torchrun's own summary, whose root cause is our line (its error file).
    assert output.count("Traceback (most recent call last)") <= 1
    assert "zephon_titan/" not in output.split("Traceback (most recent call last)")[-1].split("Root Cause")[0]
    assert f"traceback : {ours}" in output
