"""The append-only record under full disks and crashes (issue 26, item 3), for validation.jsonl and the
ledger alike (engine/jsonl_log.py): a short write or ENOSPC leaves no half line, a torn last line is
dropped at a resume with a warning, a bad line before the last is refused naming file and line, and the
entries before a resume survive it ([1, 3, 5] stayed [1, 7] before). Each attack beside its control."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import subprocess
import uuid

import pytest
from helpers import read_validation_entries

from zephon_titan.engine import jsonl_log
from zephon_titan.engine.eval_set import VALIDATION_RECORD
from zephon_titan.engine.jsonl_log import AppendOnlyLog, RecordFormat, read_entries
from zephon_titan.engine.ledger import LEDGER, LedgerEntry
from zephon_titan.errors import DataError

SOURCES = [f"source_{i:02d}" for i in range(24)]  # ~1.5 KB lines: a 64 KiB disk fills within ~40 appends


def _validation(step: int) -> dict:
    return {
        "step": step,
        "sha256": f"{step:064x}",
        "steps": 3,
        "rows": 48,
        "tokens": {name: 1000 + step + i for i, name in enumerate(SOURCES)},
        "loss": 7.25 + step / 3,
        "loss_per_source": {name: 7.0 + i / 7 + step / 3 for i, name in enumerate(SOURCES)},
    }


def _ledger(step: int) -> LedgerEntry:
    return LedgerEntry(step, f"{step:064x}", 16, {name: 600 + step + i for i, name in enumerate(SOURCES)}, step % 3)


RECORDS = {"validation.jsonl": (VALIDATION_RECORD, _validation), "ledger.jsonl": (LEDGER, _ledger)}


def _steps(path: str, fmt: RecordFormat = VALIDATION_RECORD) -> list[int]:
    return [fmt.step(e) for e in read_entries(path, fmt)[0]]


def _write(path: str, steps: list[int], resume_step: int = 0) -> None:
    record = AppendOnlyLog(path, VALIDATION_RECORD, resume_step)
    for step in steps:
        record.append(_validation(step))


def _line(step: int) -> bytes:
    return (VALIDATION_RECORD.to_line(_validation(step)) + "\n").encode()


# ---- a full disk: ENOSPC and the short write before it, on a real 64 KiB tmpfs --------------------


@pytest.fixture
def small_disk(tmp_path):
    folder = tmp_path / "disk"
    folder.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)], capture_output=True, text=True
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a 64 KiB tmpfs (needs root): {(result.stderr or result.stdout).strip()[:120]}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


def _sized(make, step: int, size: int):
    """make(step), its sha256 field lengthened so that its line has `size` bytes."""
    entry = make(step)
    fmt = VALIDATION_RECORD if isinstance(entry, dict) else LEDGER
    pad = "0" * (size - len(fmt.to_line(entry)) - 1)
    if isinstance(entry, dict):
        return {**entry, "sha256": entry["sha256"] + pad}
    return dataclasses.replace(entry, sha256=entry.sha256 + pad)


# 1500-byte lines: the line that does not fit is written in part (a short write, as a 64 KiB tmpfs
# does when part of the file's last page is free); 4096-byte lines fill whole pages: ENOSPC, nothing written.
FULL_DISKS = {"short write": (1500, r"only \d+ of the 1500 bytes of step \d+'s"), "ENOSPC": (4096, r"No space left")}


@pytest.mark.parametrize("disk", FULL_DISKS)
@pytest.mark.parametrize("name", RECORDS)
def test_a_full_disk_leaves_whole_lines_and_the_next_append_is_not_glued(small_disk, name, disk):
    fmt, make = RECORDS[name]
    size, message = FULL_DISKS[disk]
    path = str(small_disk / name)
    record = AppendOnlyLog(path, fmt, 0)
    errors, step = [], 0
    while len(errors) < 2:  # a second append fails the same way: each failure leaves the file as it was
        step += 1
        try:
            record.append(_sized(make, step, size))
        except OSError as e:
            errors.append(str(e))
            data = open(path, "rb").read()
            assert len(data) % size == 0 and data.endswith(b"\n")  # whole lines only
    assert step > 10, "the disk filled before the test began"
    for error in errors:
        assert re.search(rf"^(\[Errno 28\] )?{re.escape(path)}: .*{message}", error) and "\n" not in error, error
    assert _steps(path, fmt) == list(range(1, step - 1))  # the two that did not fit are not there
    os.truncate(path, 0)  # room again: the disk was cleaned up and the run restarted from scratch
    record.append(_sized(make, step + 1, size))
    assert _steps(path, fmt) == [step + 1]


def test_a_full_disk_control_the_same_appends_fit_a_larger_disk(tmp_path):
    path = str(tmp_path / "validation.jsonl")
    _write(path, list(range(1, 60)))
    assert _steps(path) == list(range(1, 60))


# ---- an injected short write, through the validator's own report -------------------------------


def _short_writes(monkeypatch, fraction: float = 0.5) -> list[int]:
    """os.write in jsonl_log writes only part of each line (really: those bytes reach the file)."""
    real, sizes = os.write, []

    def short(fd: int, data: bytes) -> int:
        sizes.append(len(data))
        return real(fd, data[: int(len(data) * fraction)])

    monkeypatch.setattr(jsonl_log.os, "write", short)
    return sizes


def _validator(path: str):
    from zephon_titan.titan.validator import ZephonValidator, _EvalSet

    validator = object.__new__(ZephonValidator)  # only its record: no model, no mesh
    validator.ledger_path, validator.resume_step, validator._record = path, 0, None
    return validator, _EvalSet([], "ab" * 32, 3, 48, 64)


def test_a_short_write_of_validation_jsonl_is_cut_and_the_next_entry_starts_a_line(tmp_path, monkeypatch):
    path = str(tmp_path / "checkpoint" / "validation.jsonl")
    validator, eval_set = _validator(path)
    tokens = {"code": 10, "prose": 20}
    validator._report(1, eval_set, 7.5, {"code": 7.0, "prose": 8.0}, tokens)
    before = open(path, "rb").read()
    sizes = _short_writes(monkeypatch)
    with pytest.raises(OSError, match=r"validation\.jsonl: only \d+ of the \d+ bytes of step 3's validation entry"):
        validator._report(3, eval_set, 7.25, {"code": 7.0, "prose": 7.5}, tokens)
    assert sizes and open(path, "rb").read() == before  # the half line was removed
    monkeypatch.undo()
    validator._report(5, eval_set, 7.0, {"code": 6.5, "prose": 7.5}, tokens)
    entries = read_validation_entries(path)
    assert [e["step"] for e in entries] == [1, 5] and entries[1]["loss"] == 7.0


def test_a_short_write_control_every_validation_is_recorded(tmp_path):
    path = str(tmp_path / "checkpoint" / "validation.jsonl")
    validator, eval_set = _validator(path)
    for step in (1, 3, 5):
        validator._report(step, eval_set, 7.5 - step / 10, {"code": 7.0}, {"code": 10})
    assert [e["step"] for e in read_validation_entries(path)] == [1, 3, 5]


def test_a_failed_write_is_named_and_cut(tmp_path, monkeypatch):
    """ENOSPC after part of the line reached the file (what a disk that fills mid-write can do)."""
    path = str(tmp_path / "validation.jsonl")
    _write(path, [1])
    real = os.write

    def part_then_enospc(fd: int, data: bytes) -> int:
        real(fd, data[:40])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(jsonl_log.os, "write", part_then_enospc)
    with pytest.raises(OSError, match=r"validation\.jsonl: step 3's validation entry could not be written \(No space"):
        AppendOnlyLog(path, VALIDATION_RECORD, 1).append(_validation(3))
    assert open(path, "rb").read() == _line(1)


# ---- a resume: torn last line, corrupt middle line, entries before the resume --------------------


def test_validations_before_the_resume_survive_it(tmp_path, caplog):
    """The attack's run: validations at 1, 3, 5, a checkpoint at 6, a crash, a resume: 7 follows 5."""
    path = str(tmp_path / "validation.jsonl")
    _write(path, [1, 3, 5])
    with caplog.at_level(logging.WARNING, logger="zephon_titan"):
        _write(path, [7], resume_step=6)
    assert _steps(path) == [1, 3, 5, 7] and caplog.text == ""


def test_validations_after_the_checkpoint_are_dropped_at_a_resume(tmp_path):
    """The control of the one above: entries the stopped run wrote after the checkpoint are written again."""
    path = str(tmp_path / "validation.jsonl")
    _write(path, [1, 3, 5, 7])
    _write(path, [5, 7], resume_step=4)
    assert _steps(path) == [1, 3, 5, 7]
    _write(path, [1])  # a fresh run starts a new record
    assert _steps(path) == [1]


TEARS = {
    "mid-line": lambda line: line[: len(line) // 2],
    "one byte": lambda line: line[:1],
    "nul bytes": lambda line: b"\0" * len(line),  # an unflushed append after a crash
}


@pytest.mark.parametrize("tear", TEARS)
def test_a_torn_last_line_is_dropped_with_a_warning(tmp_path, caplog, tear):
    path = str(tmp_path / "validation.jsonl")
    reference = str(tmp_path / "reference.jsonl")
    _write(reference, [1, 3, 5, 7])
    _write(path, [1, 3, 5])
    with open(path, "ab") as f:
        f.write(TEARS[tear](_line(7)))  # the crash came while appending step 7's entry
    with pytest.raises(DataError, match=r"validation\.jsonl line 4: not a validation entry .*it is the last line"):
        read_validation_entries(path)
    with caplog.at_level(logging.WARNING, logger="zephon_titan"):
        _write(path, [7], resume_step=6)
    assert "validation.jsonl line 4 was incomplete" in caplog.text
    assert "resumes after step 6" in caplog.text and len(caplog.records) == 1
    assert open(path, "rb").read() == open(reference, "rb").read()


def test_an_intact_record_resumes_without_a_word(tmp_path, caplog):
    """The control: nothing torn, nothing said, the same bytes as a run that never stopped."""
    path, reference = str(tmp_path / "validation.jsonl"), str(tmp_path / "reference.jsonl")
    _write(reference, [1, 3, 5, 7])
    _write(path, [1, 3, 5])
    with caplog.at_level(logging.WARNING, logger="zephon_titan"):
        _write(path, [7], resume_step=6)
    assert caplog.text == "" and open(path, "rb").read() == open(reference, "rb").read()


def test_a_glued_line_before_the_last_is_refused_naming_file_and_line(tmp_path):
    """The attack's file: half of step 3's line (a full disk), step 5's glued to it, then step 7's."""
    path = str(tmp_path / "validation.jsonl")
    open(path, "wb").write(_line(1) + _line(3)[:70] + _line(5) + _line(7))
    before = open(path, "rb").read()
    message = r"validation\.jsonl line 2: not a validation entry \(.*\); the eval record is corrupt there"
    with pytest.raises(DataError, match=message) as e:
        AppendOnlyLog(path, VALIDATION_RECORD, 6)
    assert "\n" not in str(e.value) and "fix or delete that line" in str(e.value)
    assert open(path, "rb").read() == before  # nothing dropped on the way to the error
    with pytest.raises(DataError, match=message):
        read_validation_entries(path)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda line: line.replace(b'"rows"', b'"rowz"'), r"expected an object with the fields step"),
        (lambda line: line.replace(b'"steps": 3', b'"steps": "3"'), r"steps must be int, got '3'"),
        (lambda line: line.replace(b'"steps": 3', b'"steps": true'), r"steps must be int, got True"),
        (lambda line: b"[1, 2]\n", r"expected an object"),
    ],
)
def test_a_wrong_middle_entry_is_refused_naming_file_line_and_field(tmp_path, change, message):
    path = str(tmp_path / "validation.jsonl")
    _write(path, [1, 3, 5])
    lines = open(path, "rb").readlines()
    lines[1] = change(lines[1])
    open(path, "wb").write(b"".join(lines))
    with pytest.raises(DataError, match=rf"validation\.jsonl line 2: not a validation entry \(.*{message}"):
        _write(path, [7], resume_step=6)


def test_the_record_is_replaced_whole(tmp_path, monkeypatch):
    """A resume rewrites the kept entries into a new file and renames it: a crash leaves one or the other."""
    path = str(tmp_path / "validation.jsonl")
    _write(path, [1, 3, 5, 7])
    before = open(path, "rb").read()
    monkeypatch.setattr(jsonl_log.os, "replace", _crash)
    with pytest.raises(RuntimeError, match="crash"):
        _write(path, [], resume_step=4)
    assert open(path, "rb").read() == before


def _crash(*_args: object) -> None:
    raise RuntimeError(f"crash {uuid.uuid4()}")


def test_validation_entries_record_the_eval_seq_len_and_older_ones_still_read(tmp_path):
    path = str(tmp_path / "checkpoint" / "validation.jsonl")
    validator, eval_set = _validator(path)
    validator._report(1, eval_set, 7.5, {"code": 7.0}, {"code": 10})
    with open(path, "a") as f:  # an entry written before seq_len was recorded
        f.write(VALIDATION_RECORD.to_line(_validation(2)) + "\n")
    entries = read_validation_entries(path)
    assert [e.get("seq_len") for e in entries] == [64, None]
    with open(path, "a") as f:  # control: a seq_len that is not an integer is refused, naming the field
        f.write(VALIDATION_RECORD.to_line({**_validation(3), "seq_len": "64"}) + "\n")
    with pytest.raises(DataError, match=r"seq_len must be int"):
        read_validation_entries(path)
