"""Hostile inputs found by an adversarial sweep: each fails in one line naming the file, the row and the fix (never a
traceback, a hang, or rows silently changed), and a valid neighbour still gives its rows."""

import json
import os
import re
import stat

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import SHARED_TOKENIZERS, make_spec, within_seconds, write_job
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_chat import CHATML, _chat_table, _with_template, _write

from zephon_titan.engine import LaneStream
from zephon_titan.errors import ConfigError, DataError
from zephon_titan.testing import epoch_rows, spec_from_table


def _jsonl_spec(path, corpus_dir, tokenizer_dir, table=None, **source):
    return make_spec(
        corpus_dir,
        tokenizer_dir,
        sources={"web": {"paths": [str(path)], **source}},
        num_lanes=1,
        exhaustion="redistribute",
        **(table or {}),
    )


def _texts(spec) -> list[str]:
    """Each document's text as the rows give it (one pass), decoded: BOS and EOS left out."""
    tokenizer = spec.tokenizer
    out = []
    for row in epoch_rows(spec):
        ids = [i for i in row.inputs.tolist() if i not in (tokenizer.bos_id, tokenizer.eos_id)]
        out.append(tokenizer.decode(ids))
    return out


# ---- JSON that Python's json refuses although it is JSON ---------------------------------------------------------


@pytest.mark.parametrize(
    "value, says",
    [
        ("9" * 5000, r"line cannot be read by Python's json \(Exceeds the limit \(4300 digits\).*\); write the value"),
        ("[" * 100_000 + "]" * 100_000, r"line nests arrays or objects too deeply for Python's json to read"),
    ],
    ids=["a 5000-digit number", "arrays nested 100,000 deep"],
)
@pytest.mark.parametrize("keep", [None, "n != 0"], ids=["plain", "with a keep"])
def test_json_python_cannot_hold_is_one_line_naming_the_line(tmp_path, corpus_dir, tokenizer_dir, value, says, keep):
    """Before: a ValueError or RecursionError traceback from json (in the lanes, in a keep's fields, in init)."""
    path = tmp_path / "web.jsonl"
    path.write_bytes(b'{"text": "fine", "n": 1}\n' + b'{"text": "x", "n": ' + value.encode() + b"}\n")
    spec = _jsonl_spec(path, corpus_dir, tokenizer_dir, **({"keep": keep} if keep else {}))
    with pytest.raises(DataError, match=r"web\.jsonl line 2 \(at byte 25\): " + says) as e:
        epoch_rows(spec)
    assert "\n" not in str(e.value)
    path.write_bytes(b'{"text": "fine", "n": 1}\n{"text": "x", "n": 2}\n')  # the control: the same lines, readable
    assert _texts(_jsonl_spec(path, corpus_dir, tokenizer_dir, **({"keep": keep} if keep else {})))


def test_init_names_a_line_python_cannot_hold(tmp_path, tokenizer_dir, capsys):
    from zephon_titan.cli import main

    (tmp_path / "web.jsonl").write_bytes(b'{"text": "x", "n": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n")
    argv = ["init", f"web={tmp_path / 'web.jsonl'}", "--tokenizer", tokenizer_dir, "-o", str(tmp_path / "job.toml")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "web.jsonl line 1: line nests arrays or objects too deeply" in err and "\n" not in err
    assert not (tmp_path / "job.toml").exists()


# ---- lone surrogates: JSON reads them, no tokenizer encodes them -------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    before=st.text(st.characters(codec="utf-8"), max_size=20),
    after=st.text(st.characters(codec="utf-8"), max_size=20),
    surrogate=st.integers(0xD800, 0xDFFF),
    backend=st.sampled_from(["auto", "tokenizers"]),
    at=st.integers(0, 3),
)
def test_a_lone_surrogate_is_named_with_its_file_and_byte(
    tmp_path, corpus_dir, tokenizer_dir, before, after, surrogate, backend, at
):
    """Before: `TypeError: TextEncodeInput must be Union[...]` from the tokenizer, with no file or row. A JSON escape
    \\udXXX without its pair (or its bytes as UTF-8) anywhere in a document; the other documents are fine."""
    docs = [f"document {i}" for i in range(4)]
    lines = [json.dumps({"text": d}).encode() + b"\n" for d in docs]
    lines[at] = json.dumps({"text": before + chr(surrogate) + after}).encode() + b"\n"  # ensure_ascii: \udXXX
    path = tmp_path / "web.jsonl"
    path.write_bytes(b"".join(lines))
    offset = sum(len(line) for line in lines[:at])
    spec = _jsonl_spec(path, corpus_dir, tokenizer_dir, {"tokenizer_backend": backend})
    with pytest.raises(
        DataError,
        match=rf"web\.jsonl byte offset {offset} \(source 'web'\): the text holds a lone surrogate "
        rf"\(U\+{surrogate:04X} at character {len(before)}\).*fix the text",
    ) as e:
        epoch_rows(spec)
    assert "\n" not in str(e.value)


@pytest.mark.skipif(not os.path.isdir(os.path.join(SHARED_TOKENIZERS, "gpt2")), reason="no shared GPT-2 tokenizer")
def test_a_lone_surrogate_is_named_when_fastokens_encodes(tmp_path, corpus_dir):
    """fastokens raises on the batch before the reference is asked: the document is named all the same (before, it
    logged "the reference encodes such documents", which then raised the TypeError)."""
    path = tmp_path / "web.jsonl"
    path.write_bytes(b'{"text": "fine"}\n{"text": "a\\udfff"}\n')
    spec = _jsonl_spec(path, corpus_dir, os.path.join(SHARED_TOKENIZERS, "gpt2"), {"tokenizer_backend": "fastokens"})
    with pytest.raises(DataError, match=r"web\.jsonl byte offset 17 .* lone surrogate \(U\+DFFF at character 1\)"):
        epoch_rows(spec)
    assert spec.tokenizer.select_backend() == "fastokens"


def test_a_surrogate_pair_is_text_and_raw_surrogate_bytes_are_not(tmp_path, corpus_dir, tokenizer_dir):
    """The control: an escaped pair is one character (U+1F600) and tokenizes; the same surrogate's UTF-8 bytes (which
    Python's json reads as json.loads does, "surrogatepass") are named as the escape is."""
    path = tmp_path / "web.jsonl"
    path.write_bytes(b'{"text": "smile \\ud83d\\ude00"}\n')
    assert _texts(_jsonl_spec(path, corpus_dir, tokenizer_dir)) == ["smile \U0001f600"]
    path.write_bytes(b'{"text": "ok"}\n{"text": "a\xed\xa0\x80"}\n')
    with pytest.raises(DataError, match=r"web\.jsonl byte offset 15 .* lone surrogate \(U\+D800 at character 1\)"):
        epoch_rows(_jsonl_spec(path, corpus_dir, tokenizer_dir))


# ---- chat: a surrogate, a template that renders nothing, a template file that is no file -------------------------

GOOD = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}


def _chat_rows(tmp_path, tokenizer_dir, records, template=CHATML, **source):
    tokenizer = _with_template(tokenizer_dir, str(tmp_path / "tok"), template)
    path = _write(str(tmp_path / "c.jsonl"), records)
    return epoch_rows(spec_from_table(_chat_table(path, tokenizer, **source), seq_len=64))


def test_a_lone_surrogate_in_a_conversation_is_named(tmp_path, tokenizer_dir):
    bad = {"messages": [{"role": "user", "content": "q\ud800"}, {"role": "assistant", "content": "a"}]}
    with pytest.raises(DataError, match=r"c\.jsonl byte offset 88 \(source 'chat'\): the text holds a lone surrogate"):
        _chat_rows(tmp_path, tokenizer_dir, [GOOD, bad])


@pytest.mark.parametrize(
    "template, loss_on, says",
    [
        ("", "assistant", "renders assistant message 1 as no text"),
        ("{% for m in messages %}{% endfor %}", "last_assistant", "renders assistant message 1 as no text"),
        ("{% for m in messages %} \n{% endfor %}", "all", "renders the conversation as no text"),
        (  # the assistant's content is left out: only the EOS after it would be trained
            "{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% endif %}{% endfor %}",
            "assistant",
            "renders assistant message 1 as no text",
        ),
    ],
    ids=["empty", "no output", "white space", "no assistant content"],
)
def test_a_template_that_renders_no_text_of_a_message_is_one_line(tmp_path, tokenizer_dir, template, loss_on, says):
    """Before: every conversation trained as BOS -> EOS (or its user text and an EOS), the assistant's text nowhere."""
    with pytest.raises(DataError, match=r"c\.jsonl byte offset 0 \(source 'chat'\): the chat template .*" + says):
        _chat_rows(tmp_path, tokenizer_dir, [GOOD], template, loss_on=loss_on)


def test_an_assistant_message_of_no_text_is_still_trained_as_the_template_writes_it(tmp_path, tokenizer_dir):
    """The control: an empty assistant message (its span empty because it is) and a template that writes every
    content are no error."""
    empty = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": " "}]}
    assert _chat_rows(tmp_path, tokenizer_dir, [GOOD, empty], "{% for m in messages %}{{ m.content }}{% endfor %}")
    assert _chat_rows(tmp_path, tokenizer_dir, [GOOD, empty])


@pytest.mark.parametrize("kind", ["fifo", "device", "latin-1", "directory"])
def test_a_chat_template_file_that_is_no_utf8_file_is_one_line_not_a_hang(tmp_path, tokenizer_dir, kind):
    """Before: a FIFO hung the loader for good, /dev/zero was read until memory ran out, and a Latin-1 file was a
    UnicodeDecodeError traceback."""
    target = {"fifo": str(tmp_path / "t.jinja"), "device": "/dev/zero", "latin-1": str(tmp_path / "t.jinja")}
    target["directory"] = str(tmp_path)
    if kind == "fifo":
        os.mkfifo(target[kind])
    elif kind == "latin-1":
        (tmp_path / "t.jinja").write_bytes(b"{{ messages }} caf\xe9")
    path = _write(str(tmp_path / "c.jsonl"), [GOOD])
    table = _chat_table(path, _with_template(tokenizer_dir, str(tmp_path / "tok"), CHATML), chat_template=target[kind])
    says = {
        "fifo": "is a FIFO",
        "device": "is a character device",
        "latin-1": r"is not UTF-8 text \(byte 18\); save it as UTF-8",
        "directory": "is a directory",
    }[kind]
    with within_seconds(30), pytest.raises(ConfigError, match=r"\[dataloader\.sources\.chat\] chat template.*" + says):
        spec_from_table(table, seq_len=64)


# ---- Parquet: strings that are not UTF-8, token ids past int32 ---------------------------------------------------


def test_a_parquet_string_that_is_not_utf8_names_its_row(tmp_path, corpus_dir, tokenizer_dir):
    """Before: a UnicodeDecodeError traceback (Arrow keeps a file's string bytes unchecked; Python decodes them)."""
    column = pa.array([b"fine", b"also fine", b"caf\xe9"], pa.binary()).view(pa.string())
    pq.write_table(pa.table({"text": column}), tmp_path / "t.parquet")
    with pytest.raises(DataError, match=r"t\.parquet row 2: column 'text' is not valid UTF-8 \(byte 3 of its text\)"):
        epoch_rows(_jsonl_spec(tmp_path / "t.parquet", corpus_dir, tokenizer_dir))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    dtype=st.sampled_from([pa.int64(), pa.uint64(), pa.uint32()]),
    wide=st.integers(2**31, 2**32 - 1) | st.integers(2**32, 2**63 - 1),
    row=st.integers(0, 2),
)
def test_token_ids_past_int32_are_named_never_wrapped(tmp_path, corpus_dir, tokenizer_dir, dtype, wide, row):
    """Before: int64 id 2**32 became id 0 (and 2**32 + 5 id 5: a valid token, silently), uint32 ids wrapped to
    negatives named as ids they are not."""
    if pa.types.is_uint32(dtype):
        wide %= 2**32
        wide = max(wide, 2**31)
    ids = [[5, 6, 7], [8, 9], [10, 11, 12]]
    ids[row] = [*ids[row], wide]
    pq.write_table(pa.table({"ids": pa.array(ids, pa.list_(dtype))}), tmp_path / "t.parquet")
    spec = _jsonl_spec(tmp_path / "t.parquet", corpus_dir, tokenizer_dir, token_field="ids")
    with pytest.raises(DataError, match=rf"t\.parquet row {row}: column 'ids' holds token id {wide:,}, which no"):
        epoch_rows(spec)


def test_wide_integer_ids_within_the_vocabulary_give_the_int32_rows(tmp_path, corpus_dir, tokenizer_dir):
    """The control: ids stored as int64, uint64 or uint32 give the rows that int32 storage gives."""
    ids = [[5, 6, 7], [8, 9], [1999, 0, 3]]
    rows = {}
    for dtype in (pa.int32(), pa.int64(), pa.uint64(), pa.uint32()):
        pq.write_table(pa.table({"ids": pa.array(ids, pa.list_(dtype))}), tmp_path / f"{dtype}.parquet")
        spec = _jsonl_spec(tmp_path / f"{dtype}.parquet", corpus_dir, tokenizer_dir, token_field="ids")
        rows[str(dtype)] = [row.to_bytes() for row in LaneStream(spec, 0).take(1)]
    assert len({tuple(r) for r in rows.values()}) == 1, rows.keys()
    assert np.isin([1999], LaneStream(spec, 0).take(1)[0].inputs).all()


# ---- the command line: outputs that are no file, ledgers that are no file, counts that are no count ------------


def test_plan_output_that_is_no_file_is_one_line_and_a_fifo_stays_one(tmp_path, corpus_dir, tokenizer_dir, capsys):
    """Before: -o naming a folder or a file in a missing folder was a traceback after the whole simulation, -o /dev/full
    was an exit 0, and -o naming a device or FIFO replaced it with a regular file (os.replace of the .partial file:
    as root, `-o /dev/null` put a file in place of /dev/null)."""
    import threading

    from zephon_titan.cli import main

    job = write_job(tmp_path / "job.toml", corpus_dir, tokenizer_dir)
    fifo = tmp_path / "ledger.fifo"
    os.mkfifo(fifo)
    read: list[bytes] = []
    reader = threading.Thread(target=lambda: read.append(open(fifo, "rb").read()), daemon=True)
    reader.start()
    with within_seconds(60):
        assert main(["plan", job, "--steps", "2", "-o", str(fifo)]) == 0
    reader.join(30)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # still the FIFO, and what came through it is the ledger
    assert main(["plan", job, "--steps", "2", "-o", str(tmp_path / "p.jsonl")]) == 0
    assert read == [(tmp_path / "p.jsonl").read_bytes()]
    capsys.readouterr()
    # Only now /dev/full (a device is written in place, as the FIFO was: never replaced by a file).
    for output, says in [
        (tmp_path, rf"-o {tmp_path} is a folder; name a file in it \(-o {tmp_path}/planned.jsonl\)"),
        (
            tmp_path / "no" / "p.jsonl",
            rf"-o {tmp_path}/no/p.jsonl: the folder {tmp_path}/no does not exist; create it.*",
        ),
        ("/dev/full", r"-o /dev/full: cannot write the ledger \(No space left on device\)"),
    ]:
        assert main(["plan", job, "--steps", "2", "-o", str(output)]) == 2
        assert re.fullmatch(f"zephon-titan: error: {says}", capsys.readouterr().err.strip())
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


@pytest.mark.parametrize("kind", ["folder", "device", "fifo", "deep"])
def test_verify_of_a_ledger_that_is_no_file_is_one_line_not_a_hang(tmp_path, capsys, kind):
    """Before: a folder was an IsADirectoryError traceback, /dev/zero and a FIFO hung verify, a line nested too deep a
    RecursionError traceback."""
    from zephon_titan.cli import main

    path = {"folder": str(tmp_path), "device": "/dev/zero", "fifo": str(tmp_path / "f"), "deep": str(tmp_path / "d")}
    if kind == "fifo":
        os.mkfifo(path[kind])
    (tmp_path / "d").write_text('{"step": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    (tmp_path / "ok.jsonl").write_text("")
    with within_seconds(30):
        assert main(["verify", path[kind], str(tmp_path / "ok.jsonl")]) == 2
    err = capsys.readouterr().err.strip()
    says = {
        "folder": "is a directory, not a regular file: zephon reads only regular files; name the ledger's file",
        "device": "is a character device, not a regular file",
        "fifo": "is a FIFO (named pipe), not a regular file",
        "deep": "line 1: not a ledger entry (maximum recursion depth exceeded",
    }[kind]
    assert err.startswith(f"zephon-titan: error: {path[kind]}") and says in err and "\n" not in err


@pytest.mark.parametrize("argv", [["validate", "JOB", "--world-sizes", "0,2"], ["init", "x", "--tokenizer", "t"]])
def test_a_count_of_ranks_below_one_is_refused_by_the_parser(tmp_path, capsys, argv):
    """Before: validate --world-sizes 0 was a ZeroDivisionError traceback."""
    from zephon_titan.cli import main

    argv = [a.replace("JOB", str(tmp_path / "job.toml")) for a in argv] + (
        ["--gpus", "-1"] if argv[0] == "init" else []
    )
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert "expected numbers >= 1 separated by commas (e.g. 8,16)" in capsys.readouterr().err


def test_init_output_in_no_folder_is_refused_before_the_files_are_read(tmp_path, tokenizer_dir, capsys):
    """Before: a FileNotFoundError traceback once every file had been sampled and counted."""
    from zephon_titan.cli import main

    (tmp_path / "web.jsonl").write_text('{"text": "hello"}\n')
    for output, says in [(tmp_path / "no" / "job.toml", "does not exist"), (tmp_path, "is a folder")]:
        argv = ["init", f"web={tmp_path / 'web.jsonl'}", "--tokenizer", tokenizer_dir, "-o", str(output), "--force"]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"zephon-titan: error: -o {output}") and says in err and "\n" not in err


# ---- keep: a field alone that is no condition ----------------------------------------------------------------


@pytest.mark.parametrize("field, value", [("n", 3), ("lang", "en"), ("score", 0.5), ("tags", ["a"])])
def test_keep_on_a_field_that_is_no_condition_is_one_line(tmp_path, corpus_dir, tokenizer_dir, field, value):
    """Before: `keep = "n"` on a number or string field was an ArrowTypeError traceback (fill_null(ints, False))."""
    path = tmp_path / "web.jsonl"
    path.write_text("".join(json.dumps({"text": f"doc {i}", field: value, "ok": i % 2 == 0}) + "\n" for i in range(6)))
    with pytest.raises(
        DataError, match=rf"web\.jsonl .*keep = '{field}' gives values of type .*, expected a condition"
    ):
        epoch_rows(_jsonl_spec(path, corpus_dir, tokenizer_dir, keep=field))
    # The control: a field of booleans is a condition by itself.
    assert sorted(_texts(_jsonl_spec(path, corpus_dir, tokenizer_dir, keep="ok"))[0].split("doc ")[1:]) == [
        "0",
        "2",
        "4",
    ]


# ---- a file whose name has glob characters, named as it is ----------------------------------------------------


@pytest.mark.parametrize(
    "name, neighbour, says",
    [
        ("data[1].jsonl", "data1.jsonl", r"other files \(.*/data1\.jsonl\)"),
        ("data[1].jsonl", None, "no file"),
        ("star*.jsonl", "starX.jsonl", r"other files \(.*/starX\.jsonl\)"),
        ("q?.jsonl", None, None),  # matches itself alone: read
    ],
)
def test_a_file_named_like_a_glob_is_never_swapped_for_another(
    tmp_path, corpus_dir, tokenizer_dir, name, neighbour, says
):
    """Before: naming `data[1].jsonl` read data1.jsonl instead (silently other data), or said it matched no file."""
    import glob

    (tmp_path / name).write_text(json.dumps({"text": "the named file"}) + "\n")
    if neighbour:
        (tmp_path / neighbour).write_text(json.dumps({"text": "a neighbour"}) + "\n")
    if says is None:
        assert _texts(_jsonl_spec(tmp_path / name, corpus_dir, tokenizer_dir)) == ["the named file"]
        return
    with pytest.raises(ConfigError, match=rf"path '.*{re.escape(name)}' is a file, but as a glob it matches {says}; "):
        _jsonl_spec(tmp_path / name, corpus_dir, tokenizer_dir)
    escaped = glob.escape(str(tmp_path / name))  # what the message says to write: the file alone
    assert _texts(_jsonl_spec(escaped, corpus_dir, tokenizer_dir)) == ["the named file"]


# ---- JSON Lines in UTF-16 or UTF-32 ----------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le"])
def test_a_utf16_or_utf32_file_is_refused_at_its_first_line(tmp_path, corpus_dir, tokenizer_dir, encoding):
    """Before: json.loads took each line for its own encoding, so the lines whose bytes paired up were read (each block
    of a big file trained) and the run stopped only at the file's last line: 'not valid UTF-8 ('utf-16-be' ...)'."""
    lines = "".join(json.dumps({"text": f"document {i} " + "x" * 40}) + "\n" for i in range(200))
    path = tmp_path / "web.jsonl"
    path.write_bytes(lines.encode(encoding))
    spec = _jsonl_spec(path, corpus_dir, tokenizer_dir, block_bytes=1024)
    with pytest.raises(
        DataError, match=r"web\.jsonl line [\d,]+ \(at byte [\d,]+\): line is not UTF-8 text: the file looks"
    ):
        LaneStream(spec, 0).take(1)  # the first block read, whichever it is


@settings(max_examples=200, deadline=None)
@given(
    record=st.dictionaries(st.text(max_size=5), st.text() | st.integers() | st.none(), max_size=4),
    ascii_only=st.booleans(),
    before=st.sampled_from(["", " ", "\t", "\ufeff", "\ufeff "]),
)
def test_utf8_lines_decode_as_json_loads_decodes_them(record, ascii_only, before):
    """The control: on UTF-8 lines (a byte order mark or white space first, any escape) the lanes' decoding gives what
    json.loads gives, so no row of valid data changes."""
    from zephon_titan.engine.sources.jsonl import _decode_json

    line = (before + json.dumps({"text": "t", **record}, ensure_ascii=ascii_only)).encode("utf-8", "surrogatepass")
    assert _decode_json(line) == json.loads(line)


# ---- a damaged Parquet page: Arrow's three-line message ------------------------------------------------------


def _damaged_parquet(path, texts) -> None:
    """`texts` in row groups of 4, with row group 1's first data page overwritten (the footer intact)."""
    pq.write_table(pa.table({"text": texts}), path, row_group_size=4)
    start = pq.ParquetFile(path).metadata.row_group(1).column(0).data_page_offset
    data = bytearray(path.read_bytes())
    data[start : start + 40] = b"\xff" * 40
    path.write_bytes(bytes(data))


def test_a_damaged_parquet_page_is_one_line_in_the_lanes_and_on_the_command_line(
    tmp_path, corpus_dir, tokenizer_dir, capsys
):
    """Before: 'cannot read row group 1 (Couldn't deserialize thrift: ...\\nDeserializing page header failed.\\n)' on
    three lines, with no fix, and the command line printed the three."""
    from zephon_titan.cli import main

    path = tmp_path / "t.parquet"
    _damaged_parquet(path, [f"document {i}" for i in range(12)])
    with pytest.raises(DataError, match=r"t\.parquet: cannot read row group 1 \(.*\); the file is damaged") as e:
        epoch_rows(_jsonl_spec(path, corpus_dir, tokenizer_dir))
    assert "\n" not in str(e.value)
    job = write_job(tmp_path / "job.toml", corpus_dir, tokenizer_dir)
    text = (tmp_path / "job.toml").read_text().replace(f"{corpus_dir}/code/*.parquet", str(path))
    (tmp_path / "job.toml").write_text(text)
    assert main(["plan", job, "--steps", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert "t.parquet: cannot read row group 1" in err and "\n" not in err


@given(weight=st.sampled_from(["0", "-1", "nan", "inf", "-inf", "-0.0"]) | st.floats(max_value=0).map(str))
def test_init_weights_that_are_no_share_name_the_option(weight):
    """Before: `init --weights a=-1` was refused as a key of the job init had not written ('/x/my_job.toml:
    [dataloader.sources.a] weight must be ...'), after every file was sampled."""
    from zephon_titan.init_job import parse_weights

    with pytest.raises(
        ConfigError, match=rf"^--weights a=.*: a's weight must be a finite number > 0, got {re.escape(weight)}"
    ):
        parse_weights(f"a={weight}")
    assert parse_weights("a=0.7,b=3") == {"a": 0.7, "b": 3.0}  # the control


# ---- a Parquet file with two columns of one name -------------------------------------------------------------


@pytest.mark.parametrize("twice", ["text", "ids", "q"])
def test_two_parquet_columns_of_one_name_are_one_line(tmp_path, corpus_dir, tokenizer_dir, capsys, twice):
    """Before: `KeyError: 'Field "text" exists 2 times in schema'` (a traceback) from the lanes and from init."""
    from zephon_titan.cli import main

    columns = {"text": pa.array(["a b", "c d"]), "ids": pa.array([[5, 6], [7]]), "q": pa.array([1, 2])}
    names = [*columns, twice]
    pq.write_table(pa.Table.from_arrays([*columns.values(), columns[twice]], names=names), tmp_path / "t.parquet")
    source = {"token_field": "ids"} if twice == "ids" else {"keep": "q > 1"} if twice == "q" else {}
    with pytest.raises(DataError, match=rf"t\.parquet: the file has 2 columns named '{twice}', so which one to read"):
        epoch_rows(_jsonl_spec(tmp_path / "t.parquet", corpus_dir, tokenizer_dir, **source))
    if twice == "text":  # init: not a column it can choose (the other string columns still are)
        argv = ["init", f"t={tmp_path / 't.parquet'}", "--tokenizer", tokenizer_dir, "-o", str(tmp_path / "j.toml")]
        assert main(argv) == 2
        assert "columns: text (the name of more than one column), ids (list<element: int64>), q (int64))" in (
            capsys.readouterr().err
        )


@given(name=st.text(min_size=1, max_size=8).filter(lambda n: n != "text"))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_field_names_from_the_data_never_break_the_one_line(tmp_path, corpus_dir, tokenizer_dir, name):
    """Before: a record's keys (or a file's column names) were listed as they are, so a key holding a newline split the
    message and one holding a terminal escape (\\x1b[2J) was sent to the terminal. A printable name is shown as it is."""
    path = tmp_path / "web.jsonl"
    path.write_text(json.dumps({name: "x", "ok": 1}) + "\n")
    with pytest.raises(DataError, match=r"no field 'text' \(fields: ") as e:
        epoch_rows(_jsonl_spec(path, corpus_dir, tokenizer_dir))
    message = str(e.value)
    assert message.isprintable(), message
    assert (name if name.isprintable() else repr(name)) in message


def test_validate_names_a_lone_surrogate_as_the_lanes_do(tmp_path, corpus_dir, tokenizer_dir, capsys):
    """Before: validate (which reads every document) stopped with the tokenizer's TypeError, or with the message and
    no file once the tokenizer named the document."""
    from zephon_titan.cli import main

    (tmp_path / "prose").mkdir()
    (tmp_path / "prose" / "p.jsonl").write_bytes(b'{"text": "fine"}\n{"text": "a\\udc00"}\n')
    job = write_job(tmp_path / "job.toml", corpus_dir, tokenizer_dir)
    text = (tmp_path / "job.toml").read_text().replace(f"{corpus_dir}/prose/*.jsonl", f"{tmp_path}/prose/*.jsonl")
    (tmp_path / "job.toml").write_text(text)
    for argv in (["validate", job], ["validate", job, "--check-tokenizer"]):  # --check-tokenizer blamed fastokens
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith(
            f"zephon-titan: error: {tmp_path}/prose/p.jsonl byte offset 17 (source 'prose'): the text"
        )
        assert "lone surrogate (U+DC00 at character 1)" in err


@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_a_checkpoint_index_that_is_no_file_is_one_line_not_a_hang(tmp_path, kind):
    """Before: a `.metadata` that is a FIFO hung `plan --from-checkpoint` (and a resume) for good; a folder was
    'not a readable DCP checkpoint ([Errno 21] ...)', a device read as a pickle."""
    from zephon_titan.errors import ResumeError
    from zephon_titan.loader.checkpoint import read_checkpoint_metadata

    checkpoint = tmp_path / "step-2"
    checkpoint.mkdir()
    {"fifo": lambda p: os.mkfifo(p), "device": lambda p: os.symlink("/dev/zero", p), "folder": os.mkdir}[kind](
        checkpoint / ".metadata"
    )
    says = {"fifo": "a FIFO (named pipe)", "device": "a character device", "folder": "a directory"}[kind]
    with (
        within_seconds(30),
        pytest.raises(ResumeError, match=rf"step-2/\.metadata is {re.escape(says)}, not a regular"),
    ):
        read_checkpoint_metadata(str(checkpoint))


def test_a_checkpoint_data_file_that_is_a_fifo_is_refused_with_the_index(tmp_path):
    """The files the index names (`__0_0.distcp`, ...) are checked when it is read: a FIFO among them hung DCP's
    load. The control: the committed checkpoint as written reads."""
    import shutil

    from zephon_titan.errors import ResumeError
    from zephon_titan.loader.checkpoint import read_checkpoint_metadata

    fixture = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "checkpoint_v2", "checkpoint")
    checkpoint = tmp_path / "step-3"
    shutil.copytree(os.path.join(fixture, "step-3"), checkpoint)
    assert read_checkpoint_metadata(str(checkpoint)).state_dict_metadata
    os.remove(checkpoint / "__1_0.distcp")
    os.mkfifo(checkpoint / "__1_0.distcp")
    with within_seconds(30), pytest.raises(ResumeError, match=r"step-3/__1_0\.distcp is a FIFO \(named pipe\)"):
        read_checkpoint_metadata(str(checkpoint))
