"""Sources from untrusted places: FIFOs and devices, doctored indexes, symlink loops, pseudo-files,
credentials in URLs and endless JSONL lines are refused in one line, and never hang or eat memory.

Real FIFOs (os.mkfifo), devices, symlinks and files. A read that could block on a FIFO runs in a
thread joined with a timeout (and the FIFO is opened for writing afterwards to free it).
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import shutil
import tracemalloc

import pytest
from bounded import run_bounded

from zephon_titan.config import SourceConfig, config_from_dict
from zephon_titan.engine.sources import guards, open_source
from zephon_titan.errors import ConfigError, DataError


@pytest.fixture
def corpus(tmp_path, corpus_dir) -> str:
    """A private copy of the test corpus (these tests change files)."""
    root = str(tmp_path / "corpus")
    shutil.copytree(corpus_dir, root)
    return root


def _bounded(fn, fifos=(), timeout: float = 20):
    """fn() bounded in time; a thread blocked opening one of `fifos` is freed afterwards."""

    def release():
        for fifo in fifos:  # a reader blocked in open() returns once a writer opens the FIFO
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass

    return run_bounded(fn, timeout, release)


def _prose(corpus: str, **extra) -> SourceConfig:
    return SourceConfig(name="prose", paths=[f"{corpus}/prose/*.jsonl"], block_bytes=16384, **extra)


def _read_all(source) -> int:
    return sum(len(source.read_block(b).texts) for b in range(source.num_blocks))


# --- FIFOs and devices (items 3, 7) -------------------------------------------------------------


def test_a_fifo_matched_by_a_glob_is_refused_not_opened(corpus):
    assert _read_all(open_source(_prose(corpus))) > 0  # negative control: the directory as it is
    fifo = f"{corpus}/prose/part-00005.jsonl"
    os.mkfifo(fifo)
    _, error = _bounded(lambda: _read_all(open_source(_prose(corpus))), [fifo])
    assert isinstance(error, ConfigError), error
    assert str(error) == (
        f"{fifo} is a FIFO (named pipe), not a regular file: zephon reads only regular files; "
        "point the source at regular files (or narrow its glob)"
    )


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null", "/dev/urandom"])
def test_a_device_named_as_a_path_is_refused(device):
    source = SourceConfig(name="d", paths=[device], format="jsonl")
    _, error = _bounded(lambda: open_source(source))
    assert isinstance(error, ConfigError) and str(error).startswith(f"{device} is a character device, not a regular")


def test_a_file_replaced_by_a_fifo_during_the_run_is_refused(corpus):
    source = open_source(_prose(corpus))
    first, second = source.files[0].path, source.files[1].path
    source.read_block(0)  # the first file is open now; the second is not yet
    for path in (first, second):
        os.remove(path)
        os.mkfifo(path)
    blocks = {first: 0, second: source.files[0].num_blocks}
    for path, block in blocks.items():
        _, error = _bounded(lambda b=block: source.read_block(b), [path])
        assert isinstance(error, DataError) and str(error).startswith(f"{path} is a FIFO (named pipe), not a regular")


def test_an_index_record_naming_a_fifo_inside_the_glob_is_refused_when_read(corpus):
    index = f"{corpus}/prose.index.json"
    honest = open_source(_prose(corpus, index=index))
    fifo = f"{corpus}/prose/part-00009.jsonl"
    os.mkfifo(fifo)
    document = json.load(open(index))
    document["files"].append([fifo, 100, 0, 1, []])  # sorts last, inside the glob, consistent counts
    json.dump(document, open(index, "w"))
    doctored = open_source(_prose(corpus, index=index))
    assert doctored.num_blocks == honest.num_blocks + 1
    _, error = _bounded(lambda: doctored.read_block(doctored.num_blocks - 1), [fifo])
    assert isinstance(error, DataError) and str(error).startswith(f"{fifo} is a FIFO (named pipe), not a regular")


def _a_sys_file() -> str:
    for path in sorted(glob.glob("/sys/kernel/*")) + sorted(glob.glob("/sys/kernel/mm/*/*")):
        if os.path.isfile(path) and os.access(path, os.R_OK):
            return path
    pytest.skip("no readable /sys file here")


def test_a_sys_file_is_not_a_regular_file_rather_than_a_changed_one():
    path = _a_sys_file()
    with pytest.raises(ConfigError, match=r"is not a regular file: it is /sys/.*kernel pseudo-filesystem"):
        open_source(SourceConfig(name="s", paths=[path], format="jsonl"))
    # Reached through a symlink in a data directory, or an index: refused when opened, same cause.
    from zephon_titan.engine.sources import JsonlSource
    from zephon_titan.engine.sources.base import FileBlocks

    st = os.stat(path)
    source = JsonlSource("s", [FileBlocks(path, st.st_size, st.st_mtime_ns, 1)], "text", 16384, 1000)
    with pytest.raises(DataError, match=r"is not a regular file: it is /sys/"):
        source.read_block(0)


# --- symlinks (item 6) ----------------------------------------------------------------------------


def test_symlink_loops_under_a_double_star_glob_cost_one_listing_and_are_named(corpus, caplog):
    """`loop -> .` and `loop2 -> loop` made glob branch at every level (minutes, gigabytes); each directory is
    now listed once, the files are the three of the tree, each by its first path, and a warning names the
    links skipped."""
    source = SourceConfig(name="prose", paths=[f"{corpus}/prose/**/*.jsonl"], block_bytes=16384)
    want = [f.path for f in open_source(source).files]
    assert len(want) == 3  # the control: `**` without a loop
    os.symlink(".", f"{corpus}/prose/loop")
    os.symlink("loop", f"{corpus}/prose/loop2")
    os.makedirs(f"{corpus}/prose/sub")
    os.symlink("..", f"{corpus}/prose/sub/up")  # a loop one level down
    with caplog.at_level("WARNING", logger="zephon_titan"):
        files, error = _bounded(lambda: open_source(source).files)
    assert error is None and [f.path for f in files] == want
    warning = [r.getMessage() for r in caplog.records if "symlinked directories" in r.getMessage()]
    assert len(warning) == 1 and "3 symlinked directories reach a directory already listed" in warning[0]
    assert f"{corpus}/prose/loop" in warning[0] and f"{corpus}/prose/sub/up" in warning[0]


def test_the_once_per_directory_walk_matches_glob_on_a_tree_without_links(tmp_path, monkeypatch):
    from zephon_titan.engine.sources.globs import glob_each_directory_once

    files = ["a.jsonl", "b.txt", ".h.jsonl", "d/a.jsonl", "d/.h/x.jsonl", "d/e/f/g.jsonl", ".hd/y.jsonl", "d/e/z.txt"]
    for name in files:
        os.makedirs(os.path.dirname(tmp_path / name), exist_ok=True)
        (tmp_path / name).write_text("{}\n")
    monkeypatch.chdir(tmp_path)
    patterns = ["**/*.jsonl", "**", "d/**/*.jsonl", "d/**", "**/.h/*.jsonl", "**/e/**/*.jsonl", "*/**/g.jsonl"]
    for pattern in patterns + [f"{tmp_path}/{p}" for p in patterns]:
        want = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
        assert sorted(glob_each_directory_once(pattern)) == want, pattern
    assert sorted(glob_each_directory_once("**/*.jsonl")) != sorted(glob.glob("*.jsonl"))  # the check can fail


def test_two_paths_to_one_file_are_refused(corpus):
    os.symlink(f"{corpus}/prose/part-00001.jsonl", f"{corpus}/prose/alias.jsonl")
    with pytest.raises(ConfigError, match=r"source 'prose': 2 matched paths are one file, .*part-00001\.jsonl"):
        open_source(_prose(corpus))


# --- doctored indexes (item 5) --------------------------------------------------------------------


def _doctor(corpus: str, source: SourceConfig, change) -> SourceConfig:
    open_source(source)  # writes the honest index on first use
    document = json.load(open(source.index))
    change(document)
    json.dump(document, open(source.index, "w"))
    return source


DOCTORED = {
    "foreign file": (
        lambda d: d["files"].insert(0, ["/etc/passwd", 100, 0, 1, []]),
        r"record 0 \(/etc/passwd\): is outside the source's configured paths",
    ),
    "doubled record": (lambda d: d["files"].insert(1, d["files"][0]), r"record 1 \(.*\) repeats the file"),
    "out of order": (lambda d: d["files"].reverse(), r"record 1 \(.*\) is out of sorted order"),
    "no blocks": (lambda d: d["files"][0].__setitem__(3, 0), r"record 0 \(.*\): num_blocks is 0, but [0-9,]+ bytes"),
    "one block": (lambda d: d["files"][0].__setitem__(3, 1), r"record 0 \(.*\): num_blocks is 1, but"),
    "negative blocks": (
        lambda d: d["files"][0].__setitem__(3, -10),
        r"record 0: num_blocks must be an integer >= 0, got -10",
    ),
    "size as text": (lambda d: d["files"][0].__setitem__(1, "123"), r"record 0: size must be an integer >= 0"),
    "bool blocks": (lambda d: d["files"][0].__setitem__(3, True), r"num_blocks must be an integer >= 0, got True"),
    "short record": (
        lambda d: d["files"][0].pop(),
        r"record 0: a record must be \[path, size, mtime_ns, num_blocks, block_rows\], got \[",
    ),
    "files a dict": (lambda d: d.__setitem__("files", {}), r"is not a zephon index \('files' is dict, not a list\)"),
    "path a number": (lambda d: d["files"][0].__setitem__(0, 5), r"record 0: path must be a non-empty string"),
    "unknown format": (lambda d: d.__setitem__("format", "evil"), r"has format 'evil', not one of"),
}


@pytest.mark.parametrize("doctoring", DOCTORED)
def test_a_doctored_index_is_refused_naming_file_and_record(corpus, doctoring):
    change, message = DOCTORED[doctoring]
    source = _doctor(corpus, _prose(corpus, index=f"{corpus}/prose.index.json"), change)
    with pytest.raises(
        ConfigError,
        match=rf"^\[dataloader\.sources\.prose\] index {corpus}/prose\.index\.json .*"
        rf"{message}",
    ) as caught:
        open_source(source)
    assert "\n" not in str(caught.value)


def test_too_many_row_groups_in_a_parquet_index_record_are_refused(corpus):
    def change(document):
        document["files"][0][3] += 5  # more blocks than row groups: would read past the file in pyarrow

    source = SourceConfig(name="code", paths=[f"{corpus}/code/*.parquet"], index=f"{corpus}/code.index.json")
    with pytest.raises(ConfigError, match=r"record 0 \(.*\): num_blocks is \d+, but block_rows lists \d+ row groups"):
        open_source(_doctor(corpus, source, change))


def test_an_index_of_another_format_is_refused(corpus):
    source = SourceConfig(
        name="prose", paths=[f"{corpus}/prose/*.jsonl"], block_bytes=16384, index=f"{corpus}/prose.index.json"
    )

    def change(document):  # a Parquet-shaped index for JSONL files
        document["format"] = "parquet"
        for record in document["files"]:
            record[4] = [1] * record[3]

    with pytest.raises(ConfigError, match=r"describes parquet files, but the source's are jsonl"):
        open_source(_doctor(corpus, source, change))


def test_the_honest_index_is_accepted_and_gives_the_listing(corpus):
    """The negative control of the doctored cases: the same blocks and documents as a listing."""
    listed = open_source(_prose(corpus))
    indexed = open_source(_doctor(corpus, _prose(corpus, index=f"{corpus}/prose.index.json"), lambda d: None))
    assert indexed.files == listed.files
    assert [indexed.read_block(b).texts for b in range(indexed.num_blocks)] == [
        listed.read_block(b).texts for b in range(listed.num_blocks)
    ]


# --- credentials in URLs (item 10) ----------------------------------------------------------------

SECRET = "wJalrXUtnFEMI-K7MDENG"


def test_a_uri_with_credentials_is_refused_without_printing_the_secret():
    source = SourceConfig(name="web", paths=[f"s3://AKIAEXAMPLE:{SECRET}@bucket/web/*.jsonl"])
    with pytest.raises(ConfigError) as caught:
        open_source(source)
    message = str(caught.value)
    assert message.startswith(
        "[dataloader.sources.web] path 's3://***@bucket/web/*.jsonl' has credentials in it; "
        "credentials belong in the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY"
    )
    assert SECRET not in message and "AKIAEXAMPLE" not in message
    indexed = SourceConfig(name="web", paths=["s3://bucket/web/*.jsonl"], index=f"s3://K:{SECRET}@bucket/web.idx")
    with pytest.raises(
        ConfigError,
        match=r"^\[dataloader\.sources\.web\] index 's3://\*\*\*@bucket/web\.idx' has "
        r"credentials in it; credentials belong in the environment",
    ) as caught:
        open_source(indexed)
    assert SECRET not in str(caught.value)


def test_an_endpoint_url_with_credentials_is_refused_by_the_config(tokenizer_dir):
    table = {
        "tokenizer_path": tokenizer_dir,
        "s3_endpoint_url": f"http://minio:{SECRET}@localhost:9000",
        "sources": {"a": {"paths": ["a.jsonl"]}},
    }
    with pytest.raises(ConfigError) as caught:
        config_from_dict(table)
    assert str(caught.value).startswith("[dataloader] s3_endpoint_url 'http://***@localhost:9000' has credentials")
    assert SECRET not in str(caught.value)
    table["s3_endpoint_url"] = "http://localhost:9000"  # negative control
    assert config_from_dict(table).s3_endpoint_url == "http://localhost:9000"


def test_an_at_sign_outside_the_authority_is_no_credential():
    assert guards.userinfo("s3://bucket/user@example.com/a.jsonl") is None
    assert guards.userinfo("http://localhost:9000/a@b") is None
    assert guards.userinfo(f"s3://KEY:{SECRET}@bucket/a") == f"KEY:{SECRET}"
    guards.refuse_credentials_in_path("data/user@host/a.jsonl", "path")  # a local name: fine


# --- endless JSONL lines (item 13) ----------------------------------------------------------------

LONG = 5_000_000  # bytes of the long line's text


def _long_line_file(path: str, opener=open) -> None:
    with opener(path, "wt") as f:
        f.write(json.dumps({"text": "short one"}) + "\n" + json.dumps({"text": "short two"}) + "\n")
        f.write(json.dumps({"text": "x" * LONG}) + "\n" + json.dumps({"text": "after"}) + "\n")


@pytest.mark.parametrize("name,opener", [("big.jsonl", open), ("big.jsonl.gz", gzip.open)], ids=["plain", "gzip"])
def test_a_line_over_the_document_limit_is_refused_without_reading_it_whole(tmp_path, name, opener):
    path = str(tmp_path / name)
    _long_line_file(path, opener)
    source = open_source(SourceConfig(name="s", paths=[path], block_bytes=16384), max_document_chars=1000)
    tracemalloc.start()
    try:
        with pytest.raises(DataError) as caught:
            _read_all(source)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    where = " of its decompressed text" if name.endswith(".gz") else ""
    assert str(caught.value).startswith(
        f"{path} line 3 (at byte 44{where}): the line is longer than 77,536 bytes, more than a document of "
        "[dataloader] max_document_chars = 1,000 can take (reading stopped there)"
    )
    assert peak < 3_000_000, f"peak {peak:,} bytes for a {LONG:,}-byte line"


def test_a_long_line_within_the_limit_is_read(tmp_path):
    """The negative control: the same file with a limit above the line reads every document."""
    path = str(tmp_path / "big.jsonl")
    _long_line_file(path)
    source = open_source(SourceConfig(name="s", paths=[path], block_bytes=16384), max_document_chars=LONG)
    texts = [t for b in range(source.num_blocks) for t in source.read_block(b).texts]
    assert texts == ["short one", "short two", "x" * LONG, "after"]
