"""When parallel settings cannot pay (issue 47): `plan --procs N` and `num_workers` say so, from the cores this
process may use and the load average; a machine with free cores hears nothing."""

import os

from helpers import write_job

from zephon_titan.cli import main
from zephon_titan.engine import cores


def _machine(monkeypatch, usable: int, load: float) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(usable)))
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))


def test_procs_note(monkeypatch):
    _machine(monkeypatch, usable=16, load=0.5)
    assert cores.procs_note(8) is None  # free cores: no word
    assert "at most 16 run at once" in cores.procs_note(32)
    _machine(monkeypatch, usable=16, load=14.0)
    assert "~2.0 free cores (16 usable, load 14.0)" in cores.procs_note(8)
    assert cores.procs_note(2) is None


def test_workers_note(monkeypatch):
    _machine(monkeypatch, usable=96, load=0.0)
    assert cores.workers_note(2, ranks_on_host=8) is None  # 12 cores per rank
    assert cores.workers_note(0, ranks_on_host=8) is None  # in process
    _machine(monkeypatch, usable=2, load=0.0)
    note = cores.workers_note(2, ranks_on_host=1)
    assert "num_workers = 2 with 2 cores per rank (2 usable, 1 rank on this host)" in note
    assert note.endswith("set num_workers = 1")


def test_plan_says_when_its_processes_share_cores(tmp_path, corpus_dir, tokenizer_dir, capsys):
    """The real machine: more processes than usable cores is always said, and the ledger is the same."""
    job = write_job(tmp_path / "job.toml", corpus_dir, tokenizer_dir)
    procs = cores.usable_cores() + 1
    assert main(["plan", job, "--steps", "2", "--procs", str(procs)]) == 0
    out, err = capsys.readouterr()
    if procs <= 8:  # the job's lanes: more processes than lanes are not started
        assert f"plan: --procs {procs} on {procs - 1} usable core" in err
    assert main(["plan", job, "--steps", "2"]) == 0
    assert capsys.readouterr().out == out
