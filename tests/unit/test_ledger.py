"""The batch ledger under crashes and full disks: a torn last line survives a restart, corruption
elsewhere is named by file and line, and an append never leaves half a line behind."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from zephon_titan.cli import main
from zephon_titan.engine.ledger import LedgerEntry, LedgerWriter, read_ledger
from zephon_titan.errors import DataError


def _entry(step: int) -> LedgerEntry:
    return LedgerEntry(
        step=step, sha256=f"{step:064x}", rows=16, tokens={"code": 600 + step, "prose": 1400}, padding=step % 3
    )


def _run(path: str, steps: range, resume_step: int = 0) -> None:
    writer = LedgerWriter(path, resume_step)
    for step in steps:
        writer.write(_entry(step))


@pytest.fixture
def uninterrupted(tmp_path) -> bytes:
    path = str(tmp_path / "reference.jsonl")
    _run(path, range(1, 9))
    return open(path, "rb").read()


TEARS = {
    "mid-line": lambda data: data[:-25],
    "newline-only": lambda data: data[:-1],
    "one-byte": lambda data: data[: data.rindex(b"\n", 0, -1) + 2],
    "nul-bytes": lambda data: data[: data.rindex(b"\n", 0, -1) + 1] + b"\0" * 90,  # unflushed append after a crash
}


@pytest.mark.parametrize("tear", TEARS)
def test_a_torn_last_line_survives_a_restart(tmp_path, uninterrupted, caplog, tear):
    path = str(tmp_path / "ledger.jsonl")
    _run(path, range(1, 7))  # crashed while appending step 6; the last checkpoint is step 5
    with open(path, "rb") as f:
        torn = TEARS[tear](f.read())
    with open(path, "wb") as f:
        f.write(torn)
    with caplog.at_level(logging.WARNING, logger="zephon_titan"):
        _run(path, range(6, 9), resume_step=5)
    assert open(path, "rb").read() == uninterrupted
    if tear != "newline-only":  # that line is whole JSON: step 6, past the resume step, dropped silently
        assert "ledger.jsonl line 6 was incomplete" in caplog.text


def test_an_intact_ledger_resumes_without_a_word(tmp_path, uninterrupted, caplog):
    """The negative control: nothing torn, nothing said, the same file."""
    path = str(tmp_path / "ledger.jsonl")
    _run(path, range(1, 7))
    with caplog.at_level(logging.WARNING, logger="zephon_titan"):
        _run(path, range(6, 9), resume_step=5)
    assert open(path, "rb").read() == uninterrupted and caplog.text == ""
    assert [e.step for e in read_ledger(path)] == list(range(1, 9))


CORRUPT = {
    "bit flip": (lambda line: line.replace(b'"rows"', b'"rowz"'), r"expected an object with the fields step"),
    "not JSON": (lambda line: line[:30] + b"\n", r"line 1 column"),
    "wrong type": (lambda line: line.replace(b'"rows": 16', b'"rows": "16"'), r"rows must be int, got '16'"),
    "a list": (lambda line: b"[1, 2]\n", r"expected an object"),
    "not UTF-8": (lambda line: b'{"step": "\xff"}\n', r"utf-8"),
}


@pytest.mark.parametrize("kind", CORRUPT)
def test_a_corrupt_line_before_the_last_is_an_error_naming_file_and_line(tmp_path, kind):
    path = str(tmp_path / "ledger.jsonl")
    _run(path, range(1, 7))
    lines = open(path, "rb").readlines()
    change, message = CORRUPT[kind]
    lines[2] = change(lines[2])
    open(path, "wb").write(b"".join(lines))
    before = open(path, "rb").read()
    with pytest.raises(DataError, match=rf"ledger\.jsonl line 3: not a ledger entry \(.*({message})"):
        LedgerWriter(path, resume_step=5)
    assert open(path, "rb").read() == before  # nothing dropped on the way to the error
    with pytest.raises(DataError, match=r"ledger\.jsonl line 3: .*the ledger is corrupt there"):
        read_ledger(path)


def test_a_fresh_run_replaces_any_old_ledger(tmp_path):
    path = str(tmp_path / "ledger.jsonl")
    open(path, "wb").write(b"garbage\nmore garbage\n")
    _run(path, range(1, 3))
    assert [e.step for e in read_ledger(path)] == [1, 2]


def test_verify_names_the_file_and_line_of_a_torn_ledger(tmp_path, capsys):
    planned, run = str(tmp_path / "planned.jsonl"), str(tmp_path / "run.jsonl")
    _run(planned, range(1, 5))
    _run(run, range(1, 5))
    assert main(["verify", planned, run]) == 0
    open(run, "ab").write(b'{"step": 5, "sha')
    assert main(["verify", planned, run]) == 2
    err = capsys.readouterr().err
    assert "run.jsonl line 5: not a ledger entry" in err and "interrupted while appending" in err
    assert len(err.strip().splitlines()) == 1


_FULL_DISK = """
import resource, signal
from zephon_titan.engine.ledger import LedgerEntry, LedgerWriter
def _entry(step):
    return LedgerEntry(step, f"{{step:064x}}", 16, {{"code": 600 + step, "prose": 1400}}, step % 3)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead of killing us
writer = LedgerWriter({path!r}, 0)
writer.write(_entry(1))
limit = len(open({path!r}, "rb").read()) + 40  # room for 40 bytes of the next line: a short write
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
try:
    writer.write(_entry(2))
except OSError as e:
    print("refused:", e)
"""


def test_a_short_write_leaves_no_half_line(tmp_path):
    """A real short write (a file-size limit standing in for a full disk), in a child process."""
    path = str(tmp_path / "ledger.jsonl")
    code = _FULL_DISK.format(path=path)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "refused:" in out.stdout and "only 40 of the" in out.stdout, out.stdout + out.stderr
    assert open(path, "rb").read() == (_entry(1).to_json() + "\n").encode()
    assert json.loads(open(path).read())["step"] == 1


def test_a_best_fit_run_resumed_from_a_per_window_checkpoint_says_its_mixing_rule(corpus_dir, tokenizer_dir, tmp_path):
    """A checkpoint saved before per_step mixing existed resumes mixing per window (engine/resume.read_state); its
    ledger entries say "best_fit_mixing": "per_window", and read back. Control: a per_step run, and wrap, say nothing."""
    from helpers import engine_checkpoint, make_spec

    from zephon_titan.engine import fingerprint
    from zephon_titan.engine.ledger import step_mixing
    from zephon_titan.engine.resume import read_state
    from zephon_titan.loader.state import Decoded

    small = {"packing": "best_fit", "best_fit_window_docs": 8, "num_lanes": 2}
    old = make_spec(corpus_dir, tokenizer_dir, best_fit_mixing="per_window", **small)
    new = make_spec(corpus_dir, tokenizer_dir, **small)
    resumed = read_state(Decoded(engine_checkpoint(old, 2)), range(2), fingerprint(new)).spec(new)
    assert step_mixing(resumed) == "per_window"
    assert step_mixing(new) is None and step_mixing(make_spec(corpus_dir, tokenizer_dir, num_lanes=2)) is None
    path = str(tmp_path / "ledger.jsonl")
    writer = LedgerWriter(path, 0)
    entry = LedgerEntry.of(3, "0" * 64, 4, ["code", "prose"], [10, 20, 0], None, None, None, step_mixing(resumed))
    writer.write(entry)
    writer.write(LedgerEntry.of(4, "1" * 64, 4, ["code", "prose"], [10, 20, 0]))  # as a run without it writes
    assert '"best_fit_mixing": "per_window"' in open(path).readline()
    assert read_ledger(path) == [entry, LedgerEntry.of(4, "1" * 64, 4, ["code", "prose"], [10, 20, 0])]
