"""`zephon-titan run` (launch.py) and plain torchrun: a failing job's first (or only) line is ours (issue 31).

The real CLI in a subprocess, real torchrun ranks on CPU with gloo, the real TorchTitan trainer."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from helpers import write_job

OUR_LINE = ("zephon-titan: error: ", "zephon_titan: error: ")


def _cli(*args: str, cwd: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    return subprocess.run(
        [sys.executable, "-m", "zephon_titan.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _job_with_dump_folder(tmp_path, corpus_dir, tokenizer_dir, **kwargs) -> str:
    path = write_job(tmp_path / "job.toml", corpus_dir, tokenizer_dir, **kwargs)
    text = open(path, encoding="utf-8").read()
    with open(path, "w", encoding="utf-8") as f:
        f.write(
            f'dump_folder = "{tmp_path / "out"}"\n'
            + text.replace("local_batch_size = 2", "local_batch_size = 2\nsteps = 2")
        )
    return path


def test_a_job_error_is_one_line_and_nothing_starts(tmp_path, corpus_dir, tokenizer_dir):
    job = _job_with_dump_folder(tmp_path, corpus_dir, tokenizer_dir, dataloader="sede = 3")
    done = _cli("run", "--cpu", "--nproc", "2", job, cwd=str(tmp_path))
    assert done.returncode == 2, done.stderr[-2000:]
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(OUR_LINE) and "did you mean 'seed'" in lines[0], lines
    assert not (tmp_path / "out").exists()  # no rank was started


@pytest.mark.slow
def test_a_rank_that_stops_on_a_data_error_ends_the_job_in_our_one_line(tmp_path, corpus_dir, tokenizer_dir):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "broken.jsonl").write_text("".join(f"{{'text': 'not json {i}'}}\n" for i in range(50)))
    job = _job_with_dump_folder(tmp_path, corpus_dir, tokenizer_dir)
    with open(job, "a", encoding="utf-8") as f:
        f.write(f'[dataloader.sources.broken]\npaths = ["{bad}/broken.jsonl"]\nweight = 0.5\n')
    done = _cli("run", "--cpu", "--nproc", "2", job, cwd=str(tmp_path))
    output = done.stdout + done.stderr
    ours = [line for line in output.splitlines() if line.startswith(OUR_LINE)]
    assert done.returncode == 2, output[-3000:]
    assert len(ours) == 1 and "broken.jsonl line" in ours[0] and "not valid JSON" in ours[0], ours
    assert output.strip().splitlines()[-1] == ours[0]  # the last thing the user reads
    assert "Traceback" not in output and "ChildFailedError" not in output


@pytest.mark.slow
def test_a_run_shows_rank_0_and_keeps_every_ranks_output(tmp_path, corpus_dir, tokenizer_dir):
    job = _job_with_dump_folder(tmp_path, corpus_dir, tokenizer_dir)
    done = _cli("run", "--cpu", "--nproc", "2", job, cwd=str(tmp_path))
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "[default0]" in output and "[default1]" not in output  # rank 0 on the console
    logs = list((tmp_path / "out" / "logs").glob("*/attempt_0/*/stdout.log"))
    assert sorted(p.parent.name for p in logs) == ["0", "1"]  # every rank's output kept
    ledger = [json.loads(line) for line in open(tmp_path / "out" / "checkpoint" / "ledger.jsonl")]
    assert [e["step"] for e in ledger] == [1, 2]


@pytest.mark.slow
def test_a_quiet_run_shows_what_a_person_reads_and_keeps_every_line(tmp_path, corpus_dir, tokenizer_dir):
    job = _job_with_dump_folder(tmp_path, corpus_dir, tokenizer_dir)
    done = _cli("run", "--cpu", "--nproc", "2", "--quiet", job, cwd=str(tmp_path))
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    lines = output.splitlines()
    assert lines[0].startswith("zephon-titan run: checked ") and "starting them on CPU (gloo)" in lines[0]
    steps = [line for line in lines if re.search(r"step:\s+\d+\s+loss:", line)]
    assert len(steps) == 2 and any("zephon tokens consumed" in line for line in lines), output[-3000:]
    assert "Training completed" in output and "[default0]" not in output
    # TorchTitan's other INFO lines stay in rank 0's log (control: the same line is there, so it was dropped here).
    log = "".join(p.read_text() for p in (tmp_path / "out" / "logs").glob("*/attempt_0/0/std*.log"))
    assert "Building llama3" in log and "Building llama3" not in output
    assert all(line.split(" - ", 2)[-1] in log for line in steps)


@pytest.mark.slow
def test_under_plain_torchrun_a_mistyped_key_is_the_first_line(tmp_path, corpus_dir, tokenizer_dir):
    job = _job_with_dump_folder(tmp_path, corpus_dir, tokenizer_dir, dataloader="sede = 3")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # torchrun's own banner asks for it; a cluster sets it
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        + ["-m", "zephon_titan.train_cpu", "--job.config_file", job],
        cwd=str(tmp_path),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode != 0
    assert lines[0].startswith(OUR_LINE) and "did you mean 'seed'" in lines[0], lines[:5]
    assert sum(line.startswith(OUR_LINE) for line in lines) == 1  # once, not once per rank
