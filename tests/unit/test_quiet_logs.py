"""Quiet, saying logs (issue 31): our lines once per job (rank 0; other ranks only our warnings), a ledger cut
at a resume said in one line. What a command says while a person waits: test_progress.py."""

from __future__ import annotations

import logging

import pytest

from zephon_titan.engine.ledger import LedgerEntry, read_ledger
from zephon_titan.loader.ledger import open_ledger
from zephon_titan.log_ranks import ENV, log_every_rank, quiet_other_ranks


def _entry(step: int) -> LedgerEntry:
    return LedgerEntry(step=step, sha256=f"{step:064x}", rows=16, tokens={"code": 600, "prose": 1400}, padding=0)


def _ledger(path: str, steps: range, resume_step: int = 0) -> None:
    writer = open_ledger(path, resume_step)
    for step in steps:
        writer.write(_entry(step))


@pytest.fixture
def quiet():
    yield
    log_every_rank()


def test_a_rolled_back_ledger_is_cut_in_one_line_on_rank_0_only(tmp_path, caplog, quiet, monkeypatch):
    path = str(tmp_path / "ledger.jsonl")
    _ledger(path, range(1, 7))
    with caplog.at_level(logging.INFO):
        _ledger(path, range(3, 5), resume_step=2)  # --checkpoint.load_step 2 after step 6
    said = [r.getMessage() for r in caplog.records if "cut from the ledger" in r.getMessage()]
    assert said == [f"zephon_titan: {path}: steps 3-6 cut from the ledger (this run resumes after step 2); they are written again as this run makes them"]  # fmt: skip
    assert [e.step for e in read_ledger(path)] == [1, 2, 3, 4]
    caplog.clear()
    with caplog.at_level(logging.INFO):
        _ledger(path, range(5, 7), resume_step=4)  # nothing after step 4 on file: nothing to say
    assert "cut from the ledger" not in caplog.text and [e.step for e in read_ledger(path)] == list(range(1, 7))

    # Rank 1 keeps our warnings and drops our info lines; rank 0 and ZEPHON_TITAN_LOG_RANKS=all keep both.
    monkeypatch.delenv(ENV, raising=False)
    assert not quiet_other_ranks(0)
    assert quiet_other_ranks(1)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        _ledger(path, range(5, 6), resume_step=4)  # step 6 cut: an info line
        with open(path, "a") as f:
            f.write('{"step": 6, "sha')  # a torn last line: a warning
        _ledger(path, range(6, 7), resume_step=5)
        logging.getLogger().info("TorchTitan's own line")  # not ours: untouched
    assert "cut from the ledger" not in caplog.text
    assert "was incomplete" in caplog.text and "TorchTitan's own line" in caplog.text
    log_every_rank()
    monkeypatch.setenv(ENV, "all")
    assert not quiet_other_ranks(1)
