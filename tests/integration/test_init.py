"""`zephon-titan init` as a new user meets it: a fresh folder of their files (Parquet whose text is in a
`content` column, JSONL, gzip JSONL) and a tokenizer, the README's commands as written; the demo corpus; a
mistake is one line; (slow) a 2-rank CPU run of the job it wrote, verified against `plan`."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys

import corpus
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_demo import commands, readme_blocks

from zephon_titan.cli import main
from zephon_titan.toml_file import load_toml

pytestmark = pytest.mark.integration


@pytest.fixture
def user_folder(tmp_path, tokenizer_dir, prose_docs, code_docs, monkeypatch) -> str:
    """data/web: JSONL and gzip JSONL; data/code: Parquet with `content`, a shorter `path` and an id column;
    assets/my_tokenizer. The working directory, as the README's commands expect."""
    corpus.write_jsonl(prose_docs[:40], str(tmp_path / "data" / "web"), num_files=2)
    with gzip.open(tmp_path / "data" / "web" / "more.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": t, "url": f"https://example.com/{i}"}) + "\n" for i, t in enumerate(prose_docs[40:80]))  # fmt: skip
    os.makedirs(tmp_path / "data" / "code")
    table = pa.table({"path": [f"lib/m{i}.py" for i in range(len(code_docs))], "content": code_docs,
                      "stars": list(range(len(code_docs)))})  # fmt: skip
    pq.write_table(table, str(tmp_path / "data" / "code" / "part-0.parquet"), row_group_size=8)
    shutil.copytree(tokenizer_dir, tmp_path / "assets" / "my_tokenizer")
    monkeypatch.chdir(tmp_path)
    return str(tmp_path)


def test_the_readme_commands_write_a_job_that_validate_accepts(user_folder, capsys):
    (block,) = [b for b in readme_blocks() if "zephon-titan init" in b]
    ran = [argv for argv in commands(block) if argv[:2] in (["zephon-titan", "init"], ["zephon-titan", "validate"])]
    assert len(ran) == 2, block  # init, then validate on the GPU counts init was given
    assert main(ran[0][1:]) == 0
    said = capsys.readouterr().out
    assert "code: parquet, 1 file," in said and "text_field 'content' (no \"text\" column; 'content' has the longest" in said  # fmt: skip
    assert "web: jsonl, 3 files" in said and "vocab_size 2048: the tokenizer's 2,000 ids rounded up to 64" in said
    assert "global_batch_size 128, local_batch_size 8" in said and "num_lanes 64" in said
    job = load_toml("my_job.toml")
    web, code = job["dataloader"]["sources"]["web"], job["dataloader"]["sources"]["code"]
    assert web["paths"] == ["data/web/**/*.jsonl", "data/web/**/*.jsonl.gz"] and web["text_field"] == "text"
    assert code["paths"] == ["data/code/**/*.parquet"] and code["text_field"] == "content"
    assert job["dump_folder"] == "outputs/my_job" and job["model"]["vocab_size"] == 2048
    assert main(ran[1][1:]) == 0  # every document read, both GPU counts valid
    out = capsys.readouterr().out
    assert "8 ranks: ok" in out and "16 ranks: ok" in out


def test_the_estimates_on_the_demo_corpus_are_its_counts(workdir, tmp_path, monkeypatch, capsys):
    """Every file of the demo corpus fits the sample: init's documents and tokens are validate's exact counts."""
    monkeypatch.chdir(tmp_path)
    demo = os.path.join(workdir, "demo_out")
    argv = ["init", f"{demo}/code", f"{demo}/prose", "--tokenizer", f"{demo}/tokenizer", "--gpus", "1,2,4",
            "--seq-len", "128", "-o", "demo_job.toml"]  # fmt: skip
    assert main(argv) == 0
    said = capsys.readouterr().out
    assert main(["validate", "demo_job.toml", "--world-sizes", "1,2,4"]) == 0
    counted = re.findall(
        r"(\w+) +weight [\d.]+ .*?, ([\d,]+) documents, ([\d,]+) tokens per epoch", capsys.readouterr().out
    )
    assert [name for name, _, _ in counted] == ["code", "prose"]
    for name, documents, tokens in counted:
        line = next(line for line in said.splitlines() if line.startswith(f"  {name}:"))
        assert f" {int(documents.replace(',', ''))} documents" in line and "(every document counted)" in line
        assert f" {int(tokens.replace(',', '')) / 1000:.1f}K tokens" in line
    job = load_toml("demo_job.toml")
    weights = [s["weight"] for s in job["dataloader"]["sources"].values()]
    assert abs(sum(weights) - 1) < 1e-3 and job["training"]["global_batch_size"] == 32  # 8 rows x lcm(1, 2, 4)


@pytest.mark.slow  # Lance: the same path as Parquet past the sample (~1 s)
def test_a_lance_dataset(user_folder, code_docs, capsys):
    lance = pytest.importorskip("lance")
    lance.write_dataset(pa.table({"title": ["t"] * len(code_docs), "body": code_docs}), "data/books.lance")
    assert main(["init", "data/books.lance", "--tokenizer", "assets/my_tokenizer", "--gpus", "1,2"]) == 0
    assert "books: lance, 1 dataset, " in capsys.readouterr().out
    assert load_toml("my_job.toml")["dataloader"]["sources"]["books"]["text_field"] == "body"
    assert main(["validate", "my_job.toml", "--world-sizes", "1,2"]) == 0


def _error(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert not os.path.exists("my_job.toml")  # nothing written
    return err


def test_mistakes_are_one_line(user_folder, capsys):
    init = ["init", "--tokenizer", "assets/my_tokenizer"]
    err = _error([*init, "web=data/nothing/*.jsonl"], capsys)
    assert "data/nothing/*.jsonl: matches no file" in err
    pq.write_table(pa.table({"id": [1, 2], "score": [0.5, 0.7]}), "data/numbers.parquet")
    err = _error([*init, "data/numbers.parquet"], capsys)
    assert "data/numbers.parquet: no string column" in err and "id (int64), score (double)" in err
    err = _error(["init", "data/web", "--tokenizer", "assets/missing"], capsys)
    assert "--tokenizer assets/missing does not exist" in err
    err = _error([*init, "data/web", "--gpus", "8,16", "--global-batch-size", "100"], capsys)
    assert "--global-batch-size 100: must be a multiple of 128" in err
    err = _error([*init, "data/web", "--recipe", "llama3:no_such_config"], capsys)
    assert "no_such_config" in err
    with open("my_job.toml", "w") as f:
        f.write("# mine\n")
    assert main([*init, "data/web"]) == 2
    assert "my_job.toml exists; pass --force to replace it" in capsys.readouterr().err
    with open("my_job.toml") as f:
        assert f.read() == "# mine\n"  # untouched


def test_an_empty_or_all_nul_file_beside_good_ones(user_folder, capsys):
    """A 0-byte .jsonl in a folder of good files has no say in the estimates (init stopped on KeyError: 'text'
    before); an all-NUL one is named in one line."""
    init = ["init", "--tokenizer", "assets/my_tokenizer", "web=data/web"]
    open("data/web/empty.jsonl", "wb").close()
    assert main(init) == 0
    assert "web: jsonl, 4 files" in capsys.readouterr().out and os.path.exists("my_job.toml")
    os.remove("my_job.toml")
    with open("data/web/nul.jsonl", "wb") as f:
        f.write(b"\0" * 4096)
    assert "data/web/nul.jsonl line 1: not valid JSON" in _error(init, capsys)


@pytest.mark.slow  # a 2-rank CPU run of the trainer (~1 min)
def test_the_job_init_wrote_trains_on_two_cpu_ranks_as_planned(user_folder, capsys):
    argv = ["init", "web=data/web", "code=data/code", "--tokenizer", "assets/my_tokenizer", "--gpus", "1,2",
            "--seq-len", "128", "--steps", "4", "-o", "my_job.toml"]  # fmt: skip
    assert main(argv) == 0  # the README's CPU variant
    assert main(["validate", "my_job.toml", "--world-sizes", "1,2"]) == 0
    # The README's launch: `zephon-titan run --cpu --nproc 2 my_job.toml` (the real CLI, real torchrun ranks).
    done = subprocess.run([sys.executable, "-m", "zephon_titan.cli", "run", "--cpu", "--nproc", "2", "my_job.toml"],
                          cwd=user_folder, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    console = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout)
    assert re.search(r"step:\s+4\s", console) and os.listdir("outputs/my_job/logs")  # rank 0 shown; all in logs
    # The console as a user reads it: what run does first, then rank 0; no GPU figures on a CPU (TorchTitan
    # prints them: memory -0.00GiB, an A100's peak FLOPS, MFU, CUDA graphs); our losses at TorchTitan's precision.
    assert console.startswith("zephon-titan run: checked my_job.toml for 2 ranks in "), console[:300]
    assert "starting them on CPU (gloo) from a fresh start" in console
    assert re.search(r"step:\s+1\s+loss:\s+\d+\.\d{5}\s+grad_norm:\s+\S+\s+tps:", console), console[-3000:]
    # Nor TorchTitan notes that do not apply: a safetensors index for HF saves this job does not make.
    for gpu_only in ("mfu:", "tflops:", "memory: -0.00GiB", "Peak FLOPS used", "CUDA graph capture", "safetensors"):
        assert gpu_only not in console, gpu_only
    for losses in re.findall(r"zephon loss per source: (.*?) \(targets", console):
        assert all(re.fullmatch(r"\d+\.\d{5}", part.split()[-1]) for part in losses.split(", ")), losses
    assert main(["plan", "my_job.toml", "--steps", "4", "-o", "outputs/my_job/planned.jsonl"]) == 0
    capsys.readouterr()
    assert main(["verify", "outputs/my_job/planned.jsonl", "outputs/my_job/checkpoint/ledger.jsonl"]) == 0
    assert "identical: all 4 steps" in capsys.readouterr().out
    # Resumed from the checkpoint of step 4 (keep_latest_k and the interval init wrote): steps 5 and 6 as planned.
    done = subprocess.run([sys.executable, "-m", "zephon_titan.cli", "run", "--cpu", "--nproc", "2", "my_job.toml",
                           "--training.steps", "6"], cwd=user_folder, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "from outputs/my_job/checkpoint/step-4 (step 4, saved on 2 ranks)" in done.stdout, done.stdout[:600]
    assert "get_last_lr" not in done.stdout + done.stderr  # torch's note on TorchTitan's scheduler reload
    assert sorted(os.listdir("outputs/my_job/checkpoint")) == ["ledger.jsonl", "step-4", "step-6"]
    assert main(["plan", "my_job.toml", "--steps", "6", "-o", "outputs/my_job/planned6.jsonl"]) == 0
    capsys.readouterr()
    assert main(["verify", "outputs/my_job/planned6.jsonl", "outputs/my_job/checkpoint/ledger.jsonl"]) == 0
    assert "identical: all 6 steps" in capsys.readouterr().out


def test_the_job_keeps_a_few_checkpoints_and_says_their_size(user_folder, capsys):
    """A CPU trial of 8 steps saves its last step only, keeps 3 checkpoints, says what one weighs (from the
    model's parameters); the job loads as the trainer reads it and resumes from its latest checkpoint."""
    from zephon_titan.titan.job import load_job

    argv = ["init", "web=data/web", "--tokenizer", "assets/my_tokenizer", "--gpus", "1,2", "--seq-len", "128",
            "--steps", "8", "-o", "my_job.toml"]  # fmt: skip
    assert main(argv) == 0
    said = capsys.readouterr().out
    assert "checkpoint interval 8, keep_latest_k 3: a checkpoint is ~" in said
    text = open("my_job.toml", encoding="utf-8").read()
    parameters = re.search(r"# a checkpoint is ~([\d.]+) MB \(([\d.]+)M parameters x 12 bytes", text)
    assert parameters and float(parameters[1]) == pytest.approx(float(parameters[2]) * 12, rel=0.01), text
    job = load_job("my_job.toml")
    assert (job.config.checkpoint.interval, job.config.checkpoint.keep_latest_k) == (8, 3)
    assert not job.config.checkpoint.last_save_model_only  # the last checkpoint keeps the loader: it resumes
    for step in (8, 16):
        os.makedirs(f"outputs/my_job/checkpoint/step-{step}")
        open(f"outputs/my_job/checkpoint/step-{step}/.metadata", "w").close()
    assert job.checkpoint_to_resume() == os.path.join("outputs", "my_job", "checkpoint", "step-16")


def test_the_readme_maps_every_setting_of_torchtitans_hf_loader(tmp_path):
    import dataclasses

    from torchtitan.hf_datasets.text_datasets import HFDataSource, InterleavedHuggingFaceTextDataLoader

    from zephon_titan.errors import ConfigError
    from zephon_titan.titan.job import load_job

    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "README.md")) as f:
        readme = f.read()
    table = readme[readme.index("**Coming from TorchTitan's Hugging Face loader**") : readme.index("## At scale")]
    settings = {f.name for c in (HFDataSource, InterleavedHuggingFaceTextDataLoader.Config) for f in dataclasses.fields(c)}  # fmt: skip
    assert sorted(s for s in settings if f"`{s}`" not in table) == []
    # Those a job may not keep are refused with the line to write instead.
    for key, value in (("pin_memory", "true"), ("persistent_workers", "true"), ("infinite", "false"),
                       ("stopping_strategy", '"all_exhausted"')):  # fmt: skip
        job = tmp_path / "job.toml"
        job.write_text(f'[model]\nmodule = "llama3"\nconfig = "llama3_debugmodel"\n[dataloader]\n{key} = {value}\n')
        with pytest.raises(ConfigError, match=rf"\[dataloader\] {key} is not a loader setting; (set|remove)"):
            load_job(str(job))


@pytest.mark.slow  # init and two validates: ~19 s on the shared machine; the formats are covered in the gate
def test_token_files_megatron_and_olmo(user_folder, prose_docs, capsys):
    """init reads Megatron datasets and OLMo token files (counts from the indexes and sizes, no text column;
    OLMo's eos_token_id and token_dtype from the tokenizer), validate accepts the job and counts the same
    Megatron documents; a token id beyond the vocabulary is a one-line error from validate naming the file."""
    import numpy as np
    from token_files import write_megatron, write_olmo

    from zephon_titan.titan.tokenizer import load_tokenizer

    tokenizer = load_tokenizer("assets/my_tokenizer")
    ids = [e.ids for e in tokenizer.tokenizer.encode_batch(prose_docs[:60], add_special_tokens=False)]
    os.makedirs("data/meg")
    os.makedirs("data/olmo")
    write_megatron("data/meg/part-0", ids[:25])
    write_megatron("data/meg/part-1", ids[25:40])
    write_olmo("data/olmo/part-0.npy", ids[40:], tokenizer.eos_id)
    argv = ["init", "data/meg", "data/olmo", "--tokenizer", "assets/my_tokenizer", "--gpus", "1,2"]
    assert main(argv) == 0
    said = capsys.readouterr().out
    assert "meg: megatron, 2 files," in said and "~40 documents" in said and "token ids: no tokenization" in said
    assert "olmo: olmo, 1 file," in said and "~20 documents" in said, said
    sources = load_toml("my_job.toml")["dataloader"]["sources"]
    assert sources["meg"]["paths"] == ["data/meg/**/*.bin"] and "text_field" not in sources["meg"]
    assert sources["olmo"]["eos_token_id"] == tokenizer.eos_id and sources["olmo"]["token_dtype"] == "uint16"
    assert main(["validate", "my_job.toml", "--world-sizes", "1,2"]) == 0
    counted = re.findall(r"(\w+) +weight [\d.]+ .*?, ([\d,]+) documents", capsys.readouterr().out)
    assert counted == [("meg", "40"), ("olmo", "20")]
    bad = np.fromfile("data/olmo/part-0.npy", dtype=np.uint16)
    bad[3] = tokenizer.vocab_size + 1
    bad.tofile("data/olmo/part-0.npy")
    assert main(["validate", "my_job.toml", "--world-sizes", "1,2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"data/olmo/part-0.npy token offset 0: token id {tokenizer.vocab_size + 1}" in err
