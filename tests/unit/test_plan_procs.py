"""`zephon-titan plan --procs N`: the lanes split over N processes give exactly what one process computes,
step by step (wrap and best_fit packing, a mixture schedule, a finite run that stops, from saved lane states,
a checkpoint), and a failure inside a lane is the same one-line error.

The property tests compare the per-step lane digests and tallies (every ledger field is a function of them)
on engine specs; the command-line tests compare whole ledgers of jobs (loading a job costs seconds)."""

import json
import os
import shutil
import signal

import pytest
from helpers import make_spec, write_job

from zephon_titan.cli import main
from zephon_titan.engine.lane_digests import PlanProcesses, step_digests
from zephon_titan.engine.lanes import LaneGroup
from zephon_titan.engine.ledger import read_ledger
from zephon_titan.errors import DataError

R = 2  # rows per lane per step
PHASES = [
    {"start_step": 1, "weights": {"code": 0.2, "prose": 0.8}},
    {"start_step": 4, "ramp_steps": 3, "weights": {"code": 0.8, "prose": 0.2}},
]
CONFIGS = {
    "wrap": {},
    "best_fit": {"packing": "best_fit", "best_fit_window_docs": 8, "seq_len": 48},
    "schedule": {"phases": PHASES},
    "finite": {"exhaustion": "redistribute"},
}
CHECKPOINT_V2 = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "checkpoint_v2")


def _spec(corpus_dir, tokenizer_dir, config: str, **overrides):
    options = {**CONFIGS[config], **overrides}
    if "phases" in options:  # a schedule gives the weights: none beside it
        options["sources"] = {
            "code": {"paths": [f"{corpus_dir}/code/*.parquet"]},
            "prose": {"paths": [f"{corpus_dir}/prose/*.jsonl"], "block_bytes": 16384},
        }
    return make_spec(corpus_dir, tokenizer_dir, **options)


def _one_process(spec, steps: int, states=None, start: int = 0) -> list:
    return list(step_digests(LaneGroup(spec, range(spec.num_lanes), R, states, start), len(spec.sources), start, steps))


def _processes(spec, steps: int, procs: int, states=None, start: int = 0) -> list:
    with PlanProcesses(spec, R, states or {}, start, steps, procs) as parts:
        return list(parts.steps())


# wrap in the gate; best_fit, a schedule and a finite run in the slow tier (the same code path).
_SLOW_CONFIGS = {"best_fit", "schedule", "finite"}


@pytest.mark.parametrize(
    "config", [pytest.param(c, marks=pytest.mark.slow) if c in _SLOW_CONFIGS else c for c in sorted(CONFIGS)]
)
def test_processes_give_the_steps_of_one_process(corpus_dir, tokenizer_dir, config):
    spec = _spec(corpus_dir, tokenizer_dir, config)
    steps = 10_000 if config == "finite" else 12
    one = _one_process(spec, steps)
    if config == "finite":  # a finite run stops before the first step a lane cannot fill
        assert 2 < len(one) < steps
    assert [s for s, _, _ in one] == list(range(1, len(one) + 1))
    for procs in (2, 3, 4):
        assert _processes(spec, steps, procs) == one, f"{procs} processes"
    # Negative control: another seed, split the same way, differs at every step.
    other = _processes(_spec(corpus_dir, tokenizer_dir, config, seed=8), min(steps, len(one)), 3)
    assert all(a[1] != b[1] for a, b in zip(other, one))


@pytest.mark.parametrize("config", ["wrap", pytest.param("schedule", marks=pytest.mark.slow)])
def test_processes_continue_from_saved_lane_states(corpus_dir, tokenizer_dir, config):
    spec = _spec(corpus_dir, tokenizer_dir, config)
    group = LaneGroup(spec, range(spec.num_lanes), R, None, 0)
    for _ in range(3):
        group.next_step()
    continued = _one_process(spec, 9, group.state(), 3)
    assert continued == _one_process(spec, 9)[3:]
    for procs in (2, 5):  # 5: ranges of one and two lanes
        assert _processes(spec, 9, procs, group.state(), 3) == continued, f"{procs} processes"


def test_a_lanes_error_is_the_one_line_error_of_one_process(tmp_path, corpus_dir, tokenizer_dir):
    # The bad line is first reached by lane 6 at step 5: in the last process, whose steps 1-4 come first.
    good = [json.dumps({"text": f"document {i} " + "word " * (i % 13)}) for i in range(200)]
    web = tmp_path / "web.jsonl"
    web.write_text("\n".join(good[:70] + ["{not json"] + good[70:]) + "\n", encoding="utf-8")
    sources = {
        "code": {"paths": [f"{corpus_dir}/code/*.parquet"], "weight": 0.5},
        "web": {"paths": [str(web)], "weight": 0.5, "block_bytes": 1024},
    }
    spec = make_spec(corpus_dir, tokenizer_dir, sources=sources)
    with pytest.raises(DataError) as expected:
        _one_process(spec, 200)
    assert "web.jsonl line 71 " in str(expected.value) and "\n" not in str(expected.value)
    for procs in (2, 3, 4):
        with pytest.raises(DataError) as got:
            _processes(spec, 200, procs)
        assert type(got.value) is type(expected.value) and str(got.value) == str(expected.value)


def test_a_killed_process_is_a_one_line_error(corpus_dir, tokenizer_dir):
    spec = _spec(corpus_dir, tokenizer_dir, "wrap")
    with PlanProcesses(spec, R, {}, 0, 1_000_000, 2) as parts:
        os.kill(parts._procs[1].pid, signal.SIGKILL)
        with pytest.raises(DataError, match=r"^plan process 1 \(lanes 4-7\) died with exit code -9 .*--procs 1$"):
            list(parts.steps())


def _plan(folder, job: str, steps: int, procs: int, *extra: str) -> list:
    out = os.path.join(folder, f"{os.path.basename(job)}.{procs}.jsonl")
    assert main(["plan", job, "--steps", str(steps), "--procs", str(procs), "-o", out, *extra]) == 0
    return read_ledger(out)


def test_plan_procs_writes_the_ledger_of_one_process(tmp_path, corpus_dir, tokenizer_dir):
    job = write_job(tmp_path / "job.toml", corpus_dir, tokenizer_dir)
    one = _plan(tmp_path, job, 6, 1)
    assert [e.step for e in one] == list(range(1, 7))
    assert _plan(tmp_path, job, 6, 3) == one
    other = tmp_path / "seed.toml"
    other.write_text((tmp_path / "job.toml").read_text().replace("seed = 7", "seed = 8"))
    assert all(a.sha256 != b.sha256 for a, b in zip(_plan(tmp_path, str(other), 6, 3), one))


def test_plan_procs_from_a_checkpoint_with_the_mixture_report(tmp_path, monkeypatch, capsys):
    target = tmp_path / "checkpoint_v2"
    shutil.copytree(CHECKPOINT_V2, target, copy_function=shutil.copy, ignore=shutil.ignore_patterns("*.py", "*.md"))
    monkeypatch.chdir(target)
    checkpoint = ["--from-checkpoint", "checkpoint/step-3", "--mixture"]
    one = _plan(".", "job.toml", 9, 1, *checkpoint)
    report = capsys.readouterr().out.replace(".1.jsonl", "")
    assert [e.step for e in one] == list(range(4, 10))
    assert _plan(".", "job.toml", 9, 2, *checkpoint) == one  # 4 lanes: 2 each
    assert capsys.readouterr().out.replace(".2.jsonl", "") == report


def test_procs_below_one_is_refused(tmp_path, corpus_dir, tokenizer_dir, capsys):
    job = write_job(tmp_path / "job.toml", corpus_dir, tokenizer_dir)
    assert main(["plan", job, "--steps", "2", "--procs", "0"]) != 0
    assert "--procs must be at least 1" in capsys.readouterr().err
