"""The real trainer with its data only in an S3 bucket (moto's server on loopback): save on 2 ranks,
resume on 4 (with worker processes), every global batch equal to the offline plan of the same
documents stored on local disk, and no request for more than about one block."""

import os
import shutil

import pytest
from conftest import CPU_CONFIG, check, copy_checkpoint, ledger, losses, torchrun

from zephon_titan.engine.sources.jsonl import TAIL_READ_BYTES

# Slow tier (a resume with the data in S3 (object storage reads: unit/test_object_storage.py)).
pytestmark = [pytest.mark.integration, pytest.mark.slow]
STEPS = 6
BLOCK_BYTES = 32768  # prose block_bytes in configs/debug_cpu.toml


@pytest.fixture(scope="module")
def bucket_job(s3, workdir, tmp_path_factory):
    """A job directory holding only the tokenizer and a config whose sources are s3:// URIs."""
    for name in ("code", "prose"):
        s3.upload(os.path.join(workdir, "demo_out", name), f"demo/{name}")
    job = str(tmp_path_factory.mktemp("bucket_job"))
    shutil.copytree(os.path.join(workdir, "demo_out", "tokenizer"), os.path.join(job, "demo_out", "tokenizer"))
    text = open(CPU_CONFIG).read()
    for name, ext in (("code", "parquet"), ("prose", "jsonl")):
        local = f'paths = ["demo_out/{name}/*.{ext}"]'
        assert local in text
        text = text.replace(
            local,
            f'paths = ["s3://zephon-test/demo/{name}/*.{ext}"]\nindex = "s3://zephon-test/demo/{name}.index.json"',
        )
    with open(os.path.join(job, "job.toml"), "w") as f:
        f.write(text)
    with open(os.path.join(job, "job_workers.toml"), "w") as f:
        f.write(text.replace("seed = 2026", "seed = 2026\nnum_workers = 2"))
    return job


def train(job, config, run, nproc):
    args = [
        "--job.config_file",
        config,
        "--dump_folder",
        run,
        "--training.steps",
        str(STEPS),
        "--metrics.disable_color_printing",
    ]
    output = check(torchrun(job, "zephon_titan.train_cpu", nproc, args))
    return ledger(os.path.join(job, run, "checkpoint", "ledger.jsonl")), losses(output.stdout + output.stderr)


def test_save_on_2_resume_on_4_with_the_data_only_in_the_bucket(s3, bucket_job, workdir, monkeypatch):
    data_files = [f for _, _, files in os.walk(bucket_job) for f in files if f.endswith((".jsonl", ".parquet"))]
    assert data_files == []
    s3.clear_requests()
    saved_ledger, saved_losses = train(bucket_job, "job.toml", "runs/s3_w2", 2)  # lists, writes the indexes
    first_run = s3.requests()
    copy_checkpoint(bucket_job, "runs/s3_w2", 2, "runs/s3_w2_to_w4")
    s3.clear_requests()
    resumed_ledger, resumed_losses = train(bucket_job, "job_workers.toml", "runs/s3_w2_to_w4", 4)
    resumed_run = s3.requests()

    monkeypatch.chdir(workdir)  # the same documents on local disk, planned offline
    from zephon_titan.plan import plan_ledger

    planned = {e.step: e.sha256 for e in plan_ledger(CPU_CONFIG, STEPS)}
    other_seed = os.path.join(workdir, "other_seed_s3.toml")
    with open(other_seed, "w") as f:
        f.write(open(CPU_CONFIG).read().replace("seed = 2026", "seed = 2027"))
    assert {e.step: e.sha256 for e in plan_ledger(other_seed, 1)}[1] != planned[1]  # the comparison can fail

    assert saved_ledger == planned
    assert resumed_ledger == planned  # steps 1-2 from the 2-rank run, 3-6 read again from the bucket on 4
    assert min(resumed_losses) == 3
    for step, loss in resumed_losses.items():
        assert loss == pytest.approx(saved_losses[step], rel=2e-4, abs=2e-4)

    assert any(r["method"] == "PUT" and r["key"].endswith(".index.json") for r in first_run)
    assert not any("list-type" in r["query"] for r in resumed_run)  # the resumed ranks read the indexes instead
    assert any(r["key"].endswith(".index.json") for r in resumed_run)
    data_gets = [
        r for r in first_run + resumed_run if r["method"] == "GET" and r["key"].endswith((".jsonl", ".parquet"))
    ]
    assert data_gets and all(r["range"] for r in data_gets)  # ranged reads only
    assert max(r["bytes"] for r in data_gets) <= BLOCK_BYTES + 1 + TAIL_READ_BYTES
