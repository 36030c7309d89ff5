"""Integration fixtures: the demo corpus in a working directory, and a torchrun launcher."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import demo
import pytest
import runs
from logs import parse_losses

from zephon_titan.engine.ledger import read_ledger

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CPU_CONFIG = os.path.join(REPO, "configs", "debug_cpu.toml")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> str:
    """A job working directory holding demo_out/ (corpus + tokenizer), as configs/debug_cpu.toml expects."""
    root = str(tmp_path_factory.mktemp("job"))
    demo.build_corpus(os.path.join(root, "demo_out"))
    return root


def cpu_job_args(run: str, steps: int, *extra: str) -> list[str]:
    """Arguments of a CPU debug-job run writing to the run folder `run`."""
    return ["--job.config_file", CPU_CONFIG, "--dump_folder", run, "--training.steps", str(steps),
            "--metrics.disable_color_printing", *extra]  # fmt: skip


def torchrun(
    workdir: str, module: str, nproc: int, args: list[str], timeout: int = 600, env: dict | None = None
) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    target = [module] if module.endswith(".py") else ["-m", module]  # a script path, or a module
    cmd = TORCHRUN + ["--nproc_per_node", str(nproc), *target, *args]
    return subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)


def run_scale_script(script: str, work: str, *args: str, timeout: int) -> tuple[str, dict]:
    """Run a scripts/ proof (elastic_scale.py, thousand_ranks.py) in `work`: it must exit 0, print ALL MATCH
    and write summary.json saying ok. Returns its stdout and that summary."""
    out = subprocess.run(
        [sys.executable, script, "--work", work, *args], capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    assert "ALL MATCH" in out.stdout
    with open(os.path.join(work, "summary.json")) as f:
        summary = json.load(f)
    assert summary["ok"]
    return out.stdout, summary


def check(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    if result.returncode != 0:
        tail = (result.stdout + result.stderr)[-6000:]
        raise AssertionError(f"torchrun failed ({result.returncode}):\n{tail}")
    return result


def losses(output: str) -> dict[int, float]:
    return parse_losses(output)


def ledger(path: str) -> dict[int, str]:
    return {e.step: e.sha256 for e in read_ledger(path)}


def planned_eval_set(workdir: str, job: str) -> dict:
    """`zephon-titan plan JOB --validation --json` run in `workdir`: the eval set's sha256, steps, rows, seq_len and
    tokens per source, as every validation of the job records them."""
    planned = subprocess.run(
        [sys.executable, "-m", "zephon_titan.cli", "plan", job, "--validation", "--json"],
        cwd=workdir, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(planned.stdout.strip().splitlines()[-1])


def copy_checkpoint(workdir: str, src_run: str, step: int, dst_run: str) -> None:
    """Start run `dst_run` from `src_run`'s checkpoint at `step` (and its ledger up to there)."""
    runs.copy_checkpoint(os.path.join(workdir, src_run), step, os.path.join(workdir, dst_run))


RUN_EACH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "run_each.py")


def run_each(workdir: str, what: str, arg_lists: list[list[str]], nproc: int = 1) -> list[tuple[int, str]]:
    """Each argument list run as `what` (data_run, train_cpu) would run it, all in one torchrun launch
    (run_each.py): (exit status, stderr) per run."""
    args = [what]
    for arg_list in arg_lists:
        args += ["--", *arg_list]
    result = torchrun(workdir, RUN_EACH, nproc, args)
    output = result.stderr
    found = []
    for i in range(len(arg_lists)):
        begin, end = output.find(f"=== run {i}\n"), output.find(f"=== run {i}: exit ")
        assert 0 <= begin < end, (result.stdout + output)[-4000:]
        found.append((int(output[end:].split()[4]), output[begin:end]))
    return found


def assert_refused(outcome: tuple[int, str], message: str) -> None:
    """Refused before any step: exit status 2, one line naming `message`, no traceback, no step."""
    code, output = outcome
    errors = [line for line in output.splitlines() if line.startswith("zephon_titan: error:")]
    assert code == 2 and len(errors) == 1 and message in errors[0], output[-3000:]
    assert "Traceback" not in output and "data_run: " not in output and not losses(output), output[-3000:]
