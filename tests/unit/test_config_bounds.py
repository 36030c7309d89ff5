"""Hostile configs (issue 13, items 2, 9, 13): each is a one-line ConfigError naming the key or file and
the fix, never a traceback, a hang or a huge read; each case has a valid neighbour that still loads."""

import dataclasses
import os
import re

import pytest
from bounded import run_bounded
from helpers import data_table, spec_of

from zephon_titan.config import DataConfig, SourceConfig, config_from_dict, settings
from zephon_titan.errors import ConfigError
from zephon_titan.titan.job import read_job_config
from zephon_titan.toml_file import MAX_EXTENDS, MAX_TOML_BYTES, load_data_config, load_toml

BOUNDS = {key: s.bounds for key, s in settings(DataConfig).items() if s.bounds}
SOURCE_BOUNDS = {key: s.bounds for key, s in settings(SourceConfig).items() if s.bounds}
_DATA = '[dataloader.sources.a]\npaths = ["x.jsonl"]\n'
_JOB = '[model]\nmodule = "llama3"\nconfig = "llama3_debugmodel"\n' + _DATA


def _one_line_error(fn, match: str) -> str:
    with pytest.raises(ConfigError, match=match) as e:
        fn()
    assert "\n" not in str(e.value) and len(str(e.value)) < 600
    return str(e.value)


def _release_fifo(path: str) -> None:
    """Free a reader blocked opening the FIFO (there is none when the loader behaves)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


def _hostile(tmp_path, kind: str) -> str:
    """A path that is no readable TOML file, made for real."""
    path = str(tmp_path / f"bad-{kind}")
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        os.mkdir(path)
    elif kind == "binary":
        with open(path, "wb") as f:
            f.write(b"[job]\n\xff\xfe\x00\x81 binary")
    elif kind == "huge":
        with open(path, "wb") as f:
            f.write(b"# padding\n" * (MAX_TOML_BYTES // 10 + 1))
    elif kind == "symlink_loop":
        os.symlink(path + "-other", path)
        os.symlink(path, path + "-other")
    else:
        return kind  # a device
    return path


_HOSTILE = [
    ("/dev/zero", r"/dev/zero is not a regular file \(a character device\); point it at a TOML file"),
    ("/dev/urandom", r"/dev/urandom is not a regular file \(a character device\)"),
    ("fifo", r"bad-fifo is not a regular file \(a FIFO\)"),
    ("directory", r"bad-directory is not a regular file \(a directory\)"),
    ("binary", r"bad-binary is not UTF-8 text \(byte 6\)"),
    ("huge", rf"bad-huge is over {MAX_TOML_BYTES} bytes, too big for a job file"),
    ("symlink_loop", r"cannot read .*bad-symlink_loop: Too many levels of symbolic links"),
]


@pytest.mark.parametrize("kind, message", _HOSTILE)
def test_extends_reads_only_bounded_regular_files(tmp_path, kind, message):
    target = _hostile(tmp_path, kind)
    job = tmp_path / "job.toml"
    job.write_text(f'[job]\nextends = "{target}"\n' + _DATA)
    _, error = run_bounded(lambda: load_data_config(str(job)), 10, lambda: _release_fifo(target))
    assert isinstance(error, ConfigError), error
    assert str(error).startswith(f"{job}: [job] extends = ") and "\n" not in str(error)
    assert re.search(message, str(error)), str(error)
    if kind not in ("fifo", "symlink_loop"):
        assert os.path.abspath(target) in str(error)  # the resolved path


@pytest.mark.parametrize("kind, message", _HOSTILE)
def test_the_job_file_itself_is_read_the_same_way(tmp_path, kind, message):
    target = _hostile(tmp_path, kind)
    _, error = run_bounded(lambda: load_toml(target), 10, lambda: _release_fifo(target))
    assert isinstance(error, ConfigError) and str(error).startswith("config file "), error
    assert re.search(message, str(error)), str(error)


def test_a_regular_file_through_a_symlink_still_loads(tmp_path):
    (tmp_path / "base.toml").write_text(_DATA + "[dataloader]\nseed = 5\n")
    os.symlink(tmp_path / "base.toml", tmp_path / "link.toml")
    (tmp_path / "job.toml").write_text('[job]\nextends = "link.toml"\n[dataloader]\nnum_lanes = 4\n')
    config = load_data_config(str(tmp_path / "job.toml"))
    assert (config.seed, config.num_lanes) == (5, 4)


def _chain(tmp_path, n: int) -> str:
    for i in range(n - 1):
        (tmp_path / f"{i}.toml").write_text(f'[job]\nextends = "{i + 1}.toml"\n[dataloader]\nseed = {i}\n')
    (tmp_path / f"{n - 1}.toml").write_text(_DATA + f"[dataloader]\nseed = {n - 1}\nnum_lanes = 2\n")
    return str(tmp_path / "0.toml")


def test_an_extends_chain_is_bounded(tmp_path):
    message = _one_line_error(
        lambda: load_toml(_chain(tmp_path, 3000)),
        rf"\[job\] extends: the chain from .*0.toml is over {MAX_EXTENDS} files long",
    )
    assert "RecursionError" not in message and "merge some of the files" in message
    other = tmp_path / "ok"
    other.mkdir()
    config = load_data_config(_chain(other, MAX_EXTENDS))  # the longest allowed chain loads, first file wins
    assert (config.seed, config.num_lanes) == (0, 2)


def test_a_cycle_shows_the_real_chain(tmp_path):
    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    a.write_text('[job]\nextends = "b.toml"\n' + _DATA)
    b.write_text('[job]\nextends = "./a.toml"\n')
    message = _one_line_error(lambda: load_toml(str(a)), "forms a cycle")
    assert message.endswith(f"forms a cycle: {a} -> {b} -> {a}; remove one of the extends")
    b.write_text('[job]\nextends = "b.toml"\n')  # a file extending itself
    assert _one_line_error(lambda: load_toml(str(b)), "cycle").endswith(f"cycle: {b} -> {b}; remove one of the extends")
    b.write_text("[dataloader]\nseed = 3\n")
    assert load_data_config(str(a)).seed == 3


@pytest.mark.parametrize(
    "text, message",
    [
        ('job = "x"\n' + _DATA, r"job.toml: job must be a table \(\[job\], .*\), got 'x'"),
        ("[job]\nextends = 5\n" + _DATA, r"\[job\] extends must be a path string, got 5"),
        ('[job]\nextends = "a\\u0000b"\n' + _DATA, r"\[job\] extends must be a path string, got 'a\\x00b'"),
        (
            '[dataloader]\nresume_allow = [["mtimes"]]\n' + _DATA,
            r"\[dataloader\] resume_allow must be a list of strings \(e.g. \[\"mtimes\"\]\), got \[\['mtimes'\]\]",
        ),
        (
            "[dataloader.sources.a]\npaths = [1]\n",
            r"\[dataloader.sources.a\] paths must be a non-empty list of strings",
        ),
        (
            _DATA + 'weight = 1.7e308\n[dataloader.sources.b]\npaths = ["y"]\nweight = 1e308\n',
            r"\[dataloader.sources.a\] weight must be <= 1000000.0, got 1.7e\+308 \(weights are relative shares",
        ),
        ('[dataloader]\nresume_allow = ["mtimes"]\n' + _DATA, None),  # control
    ],
)
def test_wrong_shapes_are_one_line_errors(tmp_path, text, message):
    path = tmp_path / "job.toml"
    path.write_text(text)
    if message is None:
        assert load_data_config(str(path)).resume_allow == ["mtimes"]
    else:
        _one_line_error(lambda: load_data_config(str(path)), message)


@pytest.mark.parametrize(
    "extra, message",
    [
        ("training = 5\n", r"job.toml: training must be a table \(\[training\] with its settings\), got 5$"),
        ("[training]\nsteps = {a = 1}\n", r"\[training\] steps is a setting, not a table; write steps = <value>"),
        ('[training]\nsteps = "' + "9" * 5000 + '"\n', r"\[training\] steps must be int \(like 10\), got '9+\.\.\.$"),
        ("[training]\nsteps = 3\n", ""),  # control
    ],
)
def test_job_tables_of_the_wrong_type(tmp_path, extra, message):
    path = tmp_path / "job.toml"
    path.write_text(extra + _JOB if extra.startswith("training") else _JOB + extra)
    if message == "":
        assert read_job_config(str(path)).training.steps == 3
    else:
        _one_line_error(lambda: read_job_config(str(path)), message)


def test_model_must_be_a_table(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text('model = "llama3"\n' + _DATA)
    _one_line_error(lambda: read_job_config(str(path)), r"model must be a table \(\[model\] with module, config")


@pytest.mark.parametrize("key", sorted(BOUNDS))
def test_every_numeric_setting_has_an_upper_bound(corpus_dir, tokenizer_dir, key):
    low, high, why = BOUNDS[key]
    _one_line_error(
        lambda: config_from_dict(data_table(corpus_dir, tokenizer_dir, **{key: high + 1})),
        rf"^\[dataloader\] {key} must be <= {high}, got {high + 1} \({re.escape(why)}\)$",
    )
    _one_line_error(
        lambda: config_from_dict(data_table(corpus_dir, tokenizer_dir, **{key: low - 1})),
        rf"^\[dataloader\] {key} must be >= {low}, got {low - 1}$",
    )
    for value in (low, high):  # the bounds themselves are valid
        table = data_table(corpus_dir, tokenizer_dir, **{key: value}, **_PARTNERS.get((key, value > 0), {}))
        assert getattr(config_from_dict(table), key) == value


# A setting valid only beside another: exclude_from_step >= 1 needs its list (and 0 needs none).
_PARTNERS = {("exclude_from_step", True): {"exclude": "excluded.txt"}}


@pytest.mark.parametrize("key", sorted(SOURCE_BOUNDS))
def test_every_numeric_source_setting_has_an_upper_bound(corpus_dir, tokenizer_dir, key):
    low, high, why = SOURCE_BOUNDS[key]

    def table(value):
        return data_table(corpus_dir, tokenizer_dir, sources={"a": {"paths": ["x"], key: value}})

    too_big = high * 2 if isinstance(high, float) else high + 1
    _one_line_error(
        lambda: config_from_dict(table(too_big)),
        rf"^\[dataloader.sources.a\] {key} must be <= {high}, got {too_big} \({re.escape(why)}\)$",
    )
    assert getattr(config_from_dict(table(high)).sources[0], key) == high


def test_the_bounds_cover_every_numeric_setting():
    def numeric(cls):
        return {f.name for f in dataclasses.fields(cls) if f.type in ("int", "float") and f.name != "global_batch_size"}

    assert numeric(DataConfig) == set(BOUNDS) and numeric(SourceConfig) == set(SOURCE_BOUNDS)


def test_seq_len_has_an_upper_bound(corpus_dir, tokenizer_dir):
    config = config_from_dict(data_table(corpus_dir, tokenizer_dir))
    _one_line_error(lambda: spec_of(config, (1 << 20) + 1), r"seq_len must be <= 1048576, got 1048577 \(\[training\]")
    assert spec_of(config, 1 << 20).seq_len == 1 << 20
