"""A new source format is one class plus one `register_format` call (helpers.LinesSource, LINES): nothing else in
the package changes; with an `init` hook on its Format, `zephon-titan init` samples its files too."""

import dataclasses
import os

import pytest
from helpers import LINES, data_table, registered_format, spec_of

from zephon_titan.cli import main
from zephon_titan.config import config_from_dict
from zephon_titan.engine.sources import open_source
from zephon_titan.engine.sources.init_sample import SAMPLE_ROWS, InitSampling, Sample
from zephon_titan.errors import ConfigError
from zephon_titan.testing import assert_each_document_once, assert_restores_exactly, epoch_rows


@pytest.fixture
def lines_format():
    with registered_format(LINES) as fmt:
        yield fmt


def _write(tmp_path, prose_docs) -> str:
    folder = tmp_path / "lines"
    folder.mkdir()
    lines = [line for doc in prose_docs[:40] for line in doc.splitlines() if line.strip()][:600]
    for i in range(3):
        (folder / f"part-{i}.txt").write_text("\n".join(lines[i::3]) + "\n")
    return str(folder)


def test_a_registered_format_is_read_like_any_other(lines_format, tmp_path, corpus_dir, tokenizer_dir, prose_docs):
    folder = _write(tmp_path, prose_docs)
    sources = {
        "lines": {"paths": [os.path.join(folder, "*.txt")]},
        "prose": {"paths": [os.path.join(corpus_dir, "prose", "*.jsonl")], "block_bytes": 16384},
    }
    spec = spec_of(
        config_from_dict(data_table(corpus_dir, tokenizer_dir, sources=sources, exhaustion="redistribute")), 64
    )
    assert spec.sources[0].format_name == "lines" and spec.sources[0].num_blocks == 3
    rows = epoch_rows(spec)
    files = {p.file for row in rows for p in row.pieces if p.source == 0}
    assert files == {os.path.join(folder, f"part-{i}.txt") for i in range(3)}
    assert assert_each_document_once(spec, rows) > 0  # every line of every file exactly once, beside JSONL
    # The checks a format author runs (zephon_titan.testing): exact restore at any row, here in a finite lane too.
    assert_restores_exactly(spec, 2, [0, 1, 4, 9], rows=3)


def test_an_unregistered_format_is_unknown(tmp_path, prose_docs):
    # Negative control: without the registry line, the same files are refused by name.
    folder = _write(tmp_path, prose_docs)
    from zephon_titan.config import SourceConfig

    with pytest.raises(ConfigError, match=r"cannot tell the format of .*part-0.txt"):
        open_source(SourceConfig(name="lines", paths=[os.path.join(folder, "*.txt")]))
    with pytest.raises(
        ConfigError,
        match=r"format must be one of auto, jsonl, lance, litdata, mds, megatron, olmo, parquet, got 'lines'",
    ):
        open_source(SourceConfig(name="lines", paths=[os.path.join(folder, "*.txt")], format="lines"))


def test_init_samples_a_registered_formats_files_through_its_hook(
    tmp_path, prose_docs, tokenizer_dir, monkeypatch, capsys
):
    """The format's module declares how init reads it (Format.init); init's modules are not edited (and name no
    format: test_architecture.py), yet `zephon-titan init` samples the files through the hook, picks the text
    column, counts the documents and writes a job that resolves."""
    folder = _write(tmp_path, prose_docs)
    sampled = []

    def sample_file(file) -> Sample:  # what a format's module writes: each non-empty line is a document
        sampled.append(os.path.basename(file.path))
        with open(file.path, encoding="utf-8") as f:
            lines = [line.rstrip("\n") for line in f if line.strip()]
        return Sample({"text": lines[:SAMPLE_ROWS]}, {}, min(len(lines), SAMPLE_ROWS), len(lines))

    documents = sum(1 for i in range(3) for line in open(os.path.join(folder, f"part-{i}.txt")) if line.strip())
    monkeypatch.chdir(tmp_path)
    init = ["init", "lines", "--tokenizer", tokenizer_dir, "--gpus", "1,2", "-o", "job.toml"]
    with registered_format(dataclasses.replace(LINES, init=InitSampling("Lines", (".txt",), sample_file=sample_file))):
        assert main(init) == 0
        said = capsys.readouterr().out
        (tmp_path / "notes.md").write_text("x")
        assert main(["init", "notes.md", "--tokenizer", tokenizer_dir, "-o", "other.toml"]) == 2
        assert "or Lines (.txt) file" in capsys.readouterr().err  # init's messages list the registry's formats
    assert sampled == ["part-0.txt", "part-1.txt", "part-2.txt"]
    assert "lines: lines, 3 files, " in said and f" {documents} documents" in said and "text_field 'text'" in said
    job = (tmp_path / "job.toml").read_text()
    assert 'paths = ["lines/**/*.txt"]' in job and 'text_field = "text"' in job and "weight = 1.0" in job
    # Negative control: the same format without the hook is refused by init (the open path alone is not enough).
    with registered_format(LINES):
        assert main([*init, "--force"]) == 2
    err = capsys.readouterr().err
    assert "lines: no data file (.jsonl, " in err and ".txt" not in err
