"""What a command says while a person waits (issue 46, progress.py): on standard error only, nothing of a wait under
two seconds, then the stage it is in; to a pipe plain lines (a stage as it starts, then at most one every few
seconds), on a terminal one line redrawn in place and erased. Standard output keeps exactly what it had."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
from helpers import write_job

from zephon_titan.plan import plan_ledger
from zephon_titan.progress import Waiting

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def _progress_as_users_get_it(monkeypatch):
    """These tests check progress itself: its defaults, not the quiet the other tests get (conftest.py)."""
    monkeypatch.delenv("ZEPHON_TITAN_PROGRESS_SECONDS", raising=False)


def test_a_pipe_gets_a_line_per_stage_and_one_every_few_seconds():
    log = io.StringIO()
    w = Waiting("plan", stream=log)  # the defaults: nothing before 2 s, then a line at most every 5 s
    w.doing("reading job.toml")
    w.tick(w.started + 1.9)
    assert log.getvalue() == ""  # a short wait: nothing said
    w.tick(w.started + 2.1)
    assert log.getvalue() == "plan: reading job.toml ... (2.1 s)\n"
    w.doing("simulating 8 lanes", total=1000)
    w.stage_started = w.started + 2.5
    w.tick(w.started + 2.6)  # a new stage, but a line was said a moment ago
    w.advance(400, tokens=400 * 32768)
    w.tick(w.started + 6.5)
    assert log.getvalue().splitlines()[-1] == (
        "plan: step 400 of 1,000, 3.28 M tokens/s, ~6.0 s left (simulating 8 lanes)"
    )
    w.tick(w.started + 9)  # the same stage: not again within 5 s
    assert len(log.getvalue().splitlines()) == 2
    w.tick(w.started + 11.6)
    assert len(log.getvalue().splitlines()) == 3


def test_a_short_command_says_nothing_and_a_long_one_says_when_it_is_done():
    quiet, said = io.StringIO(), io.StringIO()
    with Waiting("plan", stream=quiet):
        pass
    assert quiet.getvalue() == ""
    with Waiting("plan", stream=said, after=0, every=0) as w:
        w.tick(w.started + 0.5)
    assert said.getvalue().splitlines()[0] == "plan: starting ... (0.5 s)"
    assert said.getvalue().splitlines()[-1].startswith("plan: done in ")


def test_a_terminal_gets_one_line_redrawn_and_erased():
    leader, follower = os.openpty()
    try:
        with os.fdopen(follower, "w") as terminal:
            w = Waiting("inspect", stream=terminal, after=0)
            assert w.terminal
            w.doing("simulating 8 lanes to step 3", total=3)
            w.tick(w.started + 1)
            w.clear()
            terminal.flush()
            drawn = os.read(leader, 4096).decode()
        assert drawn.startswith("\rinspect: step 0 of 3 (simulating 8 lanes to step 3)\x1b[K")
        assert drawn.endswith("\r\x1b[K") and "\n" not in drawn.replace("\r\n", "")
    finally:
        os.close(leader)


def _run(args: list[str], cwd, seconds: str | None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": REPO}
    env.pop("ZEPHON_TITAN_PROGRESS_SECONDS", None)
    if seconds is not None:
        env["ZEPHON_TITAN_PROGRESS_SECONDS"] = seconds
    command = [sys.executable, "-m", "zephon_titan.cli", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=True)


def test_plan_to_a_pipe_says_its_progress_on_stderr_and_keeps_stdout(tmp_path, corpus_dir, tokenizer_dir):
    job = write_job(tmp_path / "job.toml", corpus_dir, tokenizer_dir)
    # As if every wait were long; steps enough that the simulation outlasts the thread's look (0.25 s) on a quiet
    # machine too (~1.5 s there; 60 steps passed between two looks, and their stage went unsaid).
    run = _run(["plan", job, "--steps", "2000"], tmp_path, "0.2")
    said = run.stderr.splitlines()
    assert len(said) >= 2 and all(line.startswith("plan: ") for line in said), run.stderr
    assert any("simulating 8 lanes of 2 sources" in line for line in said) and said[-1].startswith("plan: done in")
    assert run.stdout == "".join(e.to_json() + "\n" for e in plan_ledger(job, 2000))  # byte for byte the ledger
    short = _run(["plan", job, "--steps", "2"], tmp_path, "8")  # a run shorter than the wait worth a word
    assert short.stderr == "" and len(short.stdout.splitlines()) == 2


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["validate", "JOB", "--no-count"], marks=pytest.mark.slow),  # TorchTitan's import: ~8 s
        pytest.param(["inspect", "JOB", "--step", "3", "--json"], marks=pytest.mark.slow),
        pytest.param(
            ["where", "JOB", "--source", "prose", "--match", "the", "--steps", "1-3", "--json"], marks=pytest.mark.slow
        ),
    ],
)
def test_every_long_command_says_on_stderr_only(tmp_path, corpus_dir, tokenizer_dir, args):
    job = write_job(tmp_path / "job.toml", corpus_dir, tokenizer_dir)
    args = [job if a == "JOB" else a for a in args]
    quiet, said = _run(args, tmp_path, "1000"), _run(args, tmp_path, "0.1")
    assert said.stdout == quiet.stdout and quiet.stderr == ""
    assert said.stderr and all(line.startswith(f"{args[0]}: ") for line in said.stderr.splitlines()), said.stderr
    if "--json" in args:
        json.loads(said.stdout)
