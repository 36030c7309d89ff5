"""Bounds and field checks of issue 26, item 5 (config and command line), each in the attack's shape beside
its control: a global batch of 2**40 rows (either table) refused by validate, plan and the trainer in one
line; an eval_fraction of 1e-300 refused, and an eval set that ends up empty refused; a bad
[validator.dataloader] packing named as such by validate; `verify ... | head` ends quietly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from helpers import data_table, write_job

from zephon_titan.cli import EXIT_BROKEN_PIPE, main
from zephon_titan.config import MIN_EVAL_FRACTION, config_from_dict
from zephon_titan.engine import validate_batch_layout
from zephon_titan.engine.lanes import MAX_GLOBAL_BATCH_SIZE
from zephon_titan.engine.ledger import LedgerEntry, LedgerWriter
from zephon_titan.errors import ConfigError
from zephon_titan.titan.dataloader import ZephonDataLoader
from zephon_titan.titan.job import load_job, read_job_config
from zephon_titan.titan.validator import ZephonEvalLoader

HUGE = 1 << 40


def _job(tmp_path, corpus_dir, tokenizer_dir, batch=16, dataloader="", validator="", source=""):
    return write_job(
        tmp_path / "job.toml", corpus_dir, tokenizer_dir, batch=batch, dataloader=dataloader, source=source,
        validator=validator,
    )  # fmt: skip


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("zephon-titan: error: ") and len(err.strip().splitlines()) == 1, err
    return err


# ---- global_batch_size: 2**40 ------------------------------------------------------------------------


def test_a_huge_training_batch_is_refused_by_validate_plan_and_the_trainer(tmp_path, corpus_dir, tokenizer_dir, capsys):
    job = _job(tmp_path, corpus_dir, tokenizer_dir, batch=HUGE)
    message = rf"\[training\] global_batch_size = {HUGE} rows per step is above the bound of {MAX_GLOBAL_BATCH_SIZE}"
    start = time.monotonic()
    assert main(["validate", job, "--no-count"]) == 2
    err = _error(capsys)
    assert f"[training] global_batch_size = {HUGE} rows per step is above the bound" in err
    assert main(["plan", job, "--steps", "1"]) == 2
    assert f"[training] global_batch_size = {HUGE} rows per step" in _error(capsys)
    assert time.monotonic() - start < 60  # refused, not computed
    with pytest.raises(ConfigError, match=message):
        load_job(job).preflight(1)  # the launcher's check before TorchTitan starts
    loader = ZephonDataLoader.Config(
        data=config_from_dict(data_table(corpus_dir, tokenizer_dir)), global_batch_size=HUGE
    )
    with pytest.raises(ConfigError, match=message):  # the trainer's loader
        loader.build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=64, local_batch_size=2)


def test_the_largest_batch_within_the_bound_is_a_valid_layout():
    """The control: 2**20 rows per step is accepted (8 lanes of 2**17 rows), one more lane's worth is not."""
    assert validate_batch_layout(8, MAX_GLOBAL_BATCH_SIZE, 8, 2) == MAX_GLOBAL_BATCH_SIZE // 8
    with pytest.raises(ConfigError, match=r"above the bound of 1048576 \(2\*\*20\)"):
        validate_batch_layout(8, MAX_GLOBAL_BATCH_SIZE + 8, 8, 2)


def test_a_huge_eval_batch_is_refused_naming_the_validator_table(tmp_path, corpus_dir, tokenizer_dir, capsys):
    validator = f"[validator]\nenable = true\n[validator.dataloader]\nglobal_batch_size = {HUGE}\n"
    job = _job(tmp_path, corpus_dir, tokenizer_dir, validator=validator, source="eval_fraction = 0.2")
    message = rf"\[validator.dataloader\] global_batch_size must be an integer in \[0, 1048576\] .*got {HUGE}"
    with pytest.raises(ConfigError, match=message):
        read_job_config(job)
    assert main(["validate", job, "--no-count"]) == 2
    assert "[validator.dataloader] global_batch_size must be an integer in [0, 1048576]" in _error(capsys)
    # The layout check names the table too (a config built in code, as the trainer's Validator gets it).
    data = config_from_dict(data_table(corpus_dir, tokenizer_dir))
    with pytest.raises(ConfigError, match=r"^\[validator.dataloader\] global_batch_size = 1099511627776 rows per"):
        ZephonEvalLoader(
            ZephonEvalLoader.Config(data=data, global_batch_size=HUGE),
            dp_world_size=1,
            dp_rank=0,
            tokenizer=None,
            seq_len=64,
            local_batch_size=2,
        )


def test_an_eval_batch_within_the_bound_is_accepted(tmp_path, corpus_dir, tokenizer_dir):
    validator = f"[validator]\nenable = true\n[validator.dataloader]\nglobal_batch_size = {MAX_GLOBAL_BATCH_SIZE}\n"
    job = _job(tmp_path, corpus_dir, tokenizer_dir, validator=validator, source="eval_fraction = 0.2")
    assert read_job_config(job).validator.dataloader.global_batch_size == MAX_GLOBAL_BATCH_SIZE
    load_job(job).check_eval_layout(8)


# ---- eval_fraction: 1e-300, and an eval set that ends up empty ----------------------------------------


@pytest.mark.parametrize("fraction", ["1e-300", "5e-324", "1e-10"])
def test_a_vanishing_eval_fraction_is_refused(tmp_path, corpus_dir, tokenizer_dir, capsys, fraction):
    job = _job(tmp_path, corpus_dir, tokenizer_dir, source=f"eval_fraction = {fraction}")
    assert main(["validate", job, "--no-count"]) == 2
    err = _error(capsys)
    assert "[dataloader.sources.code] eval_fraction must be 0 (no eval part) or >= 1e-09, got" in err


@pytest.mark.parametrize("fraction", [0.0, MIN_EVAL_FRACTION, 0.2])
def test_eval_fractions_within_the_bounds_are_accepted(corpus_dir, tokenizer_dir, fraction):
    sources = data_table(corpus_dir, tokenizer_dir)["sources"]
    sources["code"]["eval_fraction"] = fraction
    config = config_from_dict(data_table(corpus_dir, tokenizer_dir, sources=sources))
    assert config.sources[0].eval_fraction == fraction


_VALIDATION_ON = "[validator]\nenable = true\nsteps = -1\n[validator.dataloader]\nnum_lanes = 4\n"


def test_an_empty_eval_set_is_refused_by_validate_plan_and_the_validator(tmp_path, corpus_dir, tokenizer_dir, capsys):
    """eval_fraction = 1e-9 is allowed, but holds out none of the test corpus's few hundred documents."""
    job = _job(tmp_path, corpus_dir, tokenizer_dir, validator=_VALIDATION_ON, source="eval_fraction = 1e-9")
    assert main(["validate", job]) == 2
    captured = capsys.readouterr()
    assert "0 documents held out for validation, eval_fraction 1e-09); WARNING: none" in captured.out
    message = "[validator] the eval set is empty: the sources code (eval_fraction 1e-09), prose (eval_fraction 1e-09)"
    last = captured.err.strip().splitlines()[-1]  # after the progress bars of the counting
    assert last.startswith(f"zephon-titan: error: {message}") and "Traceback" not in captured.err
    assert main(["plan", job, "--validation"]) == 2
    assert message in _error(capsys)
    with pytest.raises(ConfigError, match=r"^\[validator\] the eval set is empty: .*raise eval_fraction"):
        _eval_loader(job)


def test_a_non_empty_eval_set_is_built_and_validated(tmp_path, corpus_dir, tokenizer_dir, capsys):
    """The control: eval_fraction = 0.2 holds out documents; validate, plan and the validator's loader agree."""
    job = _job(tmp_path, corpus_dir, tokenizer_dir, validator=_VALIDATION_ON, source="eval_fraction = 0.2")
    assert main(["validate", job]) == 0
    out = capsys.readouterr().out
    assert "documents held out for validation, eval_fraction 0.2)" in out and "WARNING" not in out
    assert main(["plan", job, "--validation", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)  # one JSON line, as validation.jsonl records it
    assert main(["plan", job, "--validation"]) == 0  # the same, for a person to read
    out = capsys.readouterr().out
    assert f"SHA-256  {planned['sha256']}" in out and f"rows     {planned['rows']:,} of {planned['seq_len']}" in out
    assert all(f"{name}  " in out and f"{n:,}" in out for name, n in planned["tokens"].items()), out
    assert main(["plan", job, "--json"]) == 2  # the ledger is JSON already: --json is --validation's
    assert sum(1 for _ in _eval_loader(job).steps()) > 0


def _eval_loader(job_path: str) -> ZephonEvalLoader:
    job = load_job(job_path)
    return ZephonEvalLoader(
        job.config.validator.dataloader,
        dp_world_size=1,
        dp_rank=0,
        tokenizer=job.trainer_tokenizer(),
        seq_len=job.seq_len,
        local_batch_size=job.local_batch_size,
    )


# ---- [validator.dataloader] packing -----------------------------------------------------------------


def test_a_bad_eval_packing_is_named_as_the_validator_table(tmp_path, corpus_dir, tokenizer_dir, capsys):
    validator = '[validator]\nenable = true\n[validator.dataloader]\npacking = "greedy"\n'
    job = _job(tmp_path, corpus_dir, tokenizer_dir, validator=validator, source="eval_fraction = 0.2")
    assert main(["validate", job, "--no-count"]) == 2
    err = _error(capsys)
    assert "[validator.dataloader] packing must be one of wrap, best_fit, got 'greedy'" in err
    assert "[dataloader] packing" not in err
    # Set on the loader's config in code (as a Validator gets it), the loader names the table too.
    config = read_job_config(
        _job(tmp_path, corpus_dir, tokenizer_dir, validator=_VALIDATION_ON, source="eval_fraction = 0.2")
    )
    config.validator.dataloader.data.packing = "greedy"
    with pytest.raises(ConfigError, match=r"^\[validator.dataloader\] packing must be one of wrap, best_fit"):
        ZephonEvalLoader(config.validator.dataloader, dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=64,
                         local_batch_size=2)  # fmt: skip


def test_a_valid_eval_packing_passes_and_a_bad_training_packing_names_dataloader(
    tmp_path, corpus_dir, tokenizer_dir, capsys
):
    validator = '[validator]\nenable = true\n[validator.dataloader]\npacking = "best_fit"\n'
    job = _job(tmp_path, corpus_dir, tokenizer_dir, validator=validator, source="eval_fraction = 0.2")
    assert main(["validate", job, "--no-count"]) == 0
    assert read_job_config(job).validator.dataloader.data.packing == "best_fit"
    capsys.readouterr()
    job = _job(tmp_path, corpus_dir, tokenizer_dir, dataloader='packing = "greedy"')
    assert main(["validate", job, "--no-count"]) == 2
    err = _error(capsys)
    assert "[dataloader] packing must be one of wrap, best_fit, got 'greedy'" in err and "validator" not in err


# ---- a closed pipe ------------------------------------------------------------------------------------


def _ledgers(tmp_path, differ: bool = False) -> tuple[str, str]:
    paths = str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")
    for i, path in enumerate(paths):
        writer = LedgerWriter(path, 0)
        for step in range(1, 6):
            digest = f"{step + (i if differ and step == 3 else 0):064x}"
            writer.write(LedgerEntry(step, digest, 16, {"code": 600, "prose": 1400}, 0))
    return paths


CLI = [sys.executable, "-m", "zephon_titan.cli"]


def test_verify_into_a_closed_pipe_ends_quietly(tmp_path):
    """The reader (`head -1`) is gone before verify says anything: no traceback, SIGPIPE's status."""
    a, b = _ledgers(tmp_path, differ=True)
    process = subprocess.Popen([*CLI, "verify", a, b], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()  # before the interpreter has even started: the first write finds no reader
    _, err = process.communicate(timeout=120)
    assert process.returncode == EXIT_BROKEN_PIPE, err.decode()
    assert err == b""


def test_verify_into_head_in_a_shell_pipeline(tmp_path):
    a, b = _ledgers(tmp_path, differ=True)
    command = " ".join([*CLI, "verify", a, b])
    result = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {command} | head -c 0; echo status ${{PIPESTATUS[0]}}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.stdout.strip() == f"status {EXIT_BROKEN_PIPE}" and result.stderr == "", result


def test_verify_into_an_open_pipe_says_everything(tmp_path):
    """The control: a reader that reads gets every line, and verify's own status (1: a difference)."""
    a, b = _ledgers(tmp_path, differ=True)
    result = subprocess.run([*CLI, "verify", a, b], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and result.stderr == ""
    assert result.stdout.startswith("first difference at step 3 (sha256):") and len(result.stdout.splitlines()) == 3


def test_a_broken_pipe_that_is_not_standard_output_is_not_swallowed(monkeypatch):
    """A loader worker's pipe breaking is an error, not a reader going away."""
    import zephon_titan.cli as cli

    def broken(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli, "cmd_verify", broken)
    with pytest.raises(BrokenPipeError):
        main(["verify", os.devnull, os.devnull])
