"""Documents excluded from a step on ([dataloader] exclude, engine/exclusion.py): steps before k unchanged byte for
byte, no listed document in a row from k on, every other document in its order; the list's syntax and errors."""

from __future__ import annotations

import itertools
import json
import os

import pytest
from helpers import data_table, make_spec, within_seconds
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from zephon_titan.config import config_from_dict
from zephon_titan.engine import LaneState, LaneStream
from zephon_titan.engine.exclusion import list_digest, parse_list, text_sha256
from zephon_titan.engine.lanes import LaneGroup
from zephon_titan.engine.stream import StepClock
from zephon_titan.errors import ConfigError, DataError
from zephon_titan.testing import assert_restores_exactly

LANES, ROWS, STEPS = 4, 2, 5


def _steps(spec) -> list[list]:
    """Each step's rows, in canonical order (lane by lane)."""
    group = LaneGroup(spec, range(LANES), ROWS)
    return [[row for lane in group.next_step() for row in lane] for _ in range(STEPS)]


def _key(piece) -> tuple[int, str, int]:
    return piece.source, piece.file, piece.row


def _document_order(steps: list[list], first: int, lane: int, source: int, dropped: set) -> list[tuple[str, int]]:
    """A lane's documents of a source in the order their pieces are trained from step `first` on, `dropped` left
    out (each lane reads its own documents: steps' rows are lane by lane, ROWS each)."""
    rows = [row for step in steps[first - 1 :] for row in step[lane * ROWS : (lane + 1) * ROWS]]
    keys = [_key(p) for row in rows for p in row.pieces if p.source == source]
    return [k[1:] for k, _ in itertools.groupby(k for k in keys if k not in dropped)]


_BASE: dict[str, tuple] = {}


def _base(corpus_dir, tokenizer_dir, packing):
    """The spec and steps of the run without a list (built once per packing)."""
    if packing not in _BASE:
        spec = make_spec(corpus_dir, tokenizer_dir, num_lanes=LANES, packing=packing)
        _BASE[packing] = spec, _steps(spec)
    return _BASE[packing]


def _write_list(path: str, spec, keys, by_text: set) -> None:
    """One line per document: by place, or (those in `by_text`) by the SHA-256 of its text."""
    texts = {}
    for source in spec.sources:
        for b in range(source.num_blocks):
            block = source.read_block(b)
            texts.update({(block.file, row): text for row, text in zip(block.rows, block.texts)})
    with open(path, "w") as f:
        f.write("# documents to leave out\n\n")
        for s, file, row in keys:
            if (s, file, row) in by_text:
                f.write(f"sha256:{text_sha256(texts[(file, row)]).upper()}\n")
            else:  # a unique ending of the path, spaces or a tab between fields
                f.write(f"{spec.source_names[s]}\t{os.path.basename(file)}\t{row}\n" if row % 2 else
                        f"{spec.source_names[s]}  {os.path.basename(file)} {row}\n")  # fmt: skip


@settings(
    max_examples=4,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    packing=st.sampled_from(["wrap", "best_fit"]),
    k=st.integers(1, STEPS),
    picks=st.lists(st.integers(0, 10**6), min_size=1, max_size=6),
    by_text=st.lists(st.booleans(), min_size=6, max_size=6),
)
def test_excluded_documents_leave_from_step_k_and_nothing_else_moves(
    tmp_path_factory, corpus_dir, tokenizer_dir, packing, k, picks, by_text
):
    spec, before = _base(corpus_dir, tokenizer_dir, packing)
    # Documents the run trains at step k or later (so that leaving them out is visible).
    later = sorted({_key(p) for rows in before[k - 1 :] for row in rows for p in row.pieces})
    listed = sorted({later[i % len(later)] for i in picks})
    path = str(tmp_path_factory.mktemp("exclude") / "list.txt")
    _write_list(path, spec, listed, {key for key, text in zip(listed, by_text) if text})
    after = _steps(make_spec(corpus_dir, tokenizer_dir, num_lanes=LANES, packing=packing, exclude=path,
                             exclude_from_step=k))  # fmt: skip
    dropped = set(listed)

    def holds(run) -> bool:
        unchanged = [r.to_bytes() for rows in run[: k - 1] for r in rows] == [
            r.to_bytes() for rows in before[: k - 1] for r in rows
        ]
        gone = not any(_key(p) in dropped for rows in run[k - 1 :] for row in rows for p in row.pieces)
        return unchanged and gone

    assert holds(after)
    assert not holds(before)  # negative control: the listed documents are trained from step k without the list
    for lane, source in itertools.product(range(LANES), range(len(spec.sources))):
        # Every other document in its order: the shorter of the two orders is the other's beginning (the run
        # without the listed documents goes further into each source in the same steps).
        old, new = (_document_order(run, k, lane, source, dropped) for run in (before, after))
        n = min(len(old), len(new))
        assert old[:n] == new[:n], (packing, k, lane, source)


@pytest.mark.parametrize("packing", ["wrap", "best_fit"])
def test_a_lane_restores_exactly_around_the_exclusion_step(tmp_path, corpus_dir, tokenizer_dir, packing):
    """A state taken before, at and after step k (an open unit drawn before k, or under the exclusion) restores to
    the same rows; the state of a unit drawn under it says so (`excluding`), and without the list it is refused."""
    small = {"num_lanes": LANES, "packing": packing, "best_fit_window_docs": 4}  # best_fit: windows drawn after k
    base = make_spec(corpus_dir, tokenizer_dir, **small)
    rows = [r for rows in _steps(base) for r in rows]
    path = str(tmp_path / "list.txt")
    _write_list(path, base, sorted({_key(p) for r in rows[len(rows) // 2 :] for p in r.pieces})[::2], set())
    k = 3

    excluding = make_spec(corpus_dir, tokenizer_dir, **small, exclude=path, exclude_from_step=k)

    def spec():
        return excluding  # a spec is immutable: every stream of it starts alike

    clock = StepClock(ROWS)
    assert_restores_exactly(spec, 1, range((k - 2) * ROWS, (k + 1) * ROWS), rows=3, rows_per_step=ROWS)  # around k
    with pytest.raises(Exception, match="needs the step of its rows"):
        LaneStream(spec(), 0)
    assert_restores_exactly(base, 0, [3], rows=2)  # unchanged without a list
    states = []
    stream = LaneStream(spec(), 1, clock=clock)
    for _ in range(STEPS * ROWS):
        stream.next_row()
        states.append(stream.state())
    assert any(s.feed.excluding for s in states)
    assert not any(s.feed.excluding for s in states[: (k - 1) * ROWS])  # nothing is drawn under it before step k
    marked = next((s for s in states if s.feed.excluding), None)
    if marked is not None:
        with pytest.raises(Exception, match="keep the exclude settings"):
            LaneStream(base, 1, LaneState.from_dict(marked.to_dict()), clock=clock)


def test_the_list_syntax_and_its_digest(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    digest = "ab" * 32
    a.write_text(f"# takedowns\nweb\tdata/part 1.parquet\t12\ncode a.parquet 3\n\nsha256:{digest.upper()}\n")
    b.write_text(f"sha256:{digest}\ncode   a.parquet   3\nweb data/part 1.parquet 12\ncode a.parquet 3\n")
    entries = parse_list(str(a))
    assert [(e.line, e.source, e.file, e.row, e.text_sha256) for e in entries] == [
        (2, "web", "data/part 1.parquet", 12, ""),
        (3, "code", "a.parquet", 3, ""),
        (5, "", "", -1, digest),
    ]
    assert list_digest(entries) == list_digest(parse_list(str(b)))  # order, spacing, comments, repeats aside
    b.write_text("code a.parquet 4\n")
    assert list_digest(entries) != list_digest(parse_list(str(b)))  # negative control


@pytest.mark.parametrize(
    "line, message",
    [
        ("web data.parquet", r"line 2: not '<source> <file> <row>' .*: 2 fields"),
        ("web data.parquet row7", r"line 2: not '<source> <file> <row>' .*: its row \(4 characters\) is not a whole"),
        ("web data.parquet ²", r"line 2: not .*: its row \(1 characters\) is not a whole number"),  # isdigit()
        ("web data.parquet " + "9" * 5000, r"line 2: not .*: its row \(5000 characters\) is not .* at most 19 digits"),
        ("sha256:abc", r"line 2: 'sha256:' is followed by 3 characters, not 64 hex digits"),
    ],
)
def test_a_malformed_line_is_one_line_naming_the_file_and_line(tmp_path, line, message):
    path = tmp_path / "list.txt"
    path.write_text(f"web a.parquet 1\n{line}\n")
    with pytest.raises(ConfigError, match=rf"{path} {message}") as e:
        parse_list(str(path))
    assert "\n" not in str(e.value) and line.split()[-1] not in str(e.value)  # the line's content is not quoted


def test_a_list_that_is_not_a_regular_text_file_is_refused_before_it_is_read(tmp_path):
    """A FIFO (open() waits for a writer forever), a device (/dev/zero is endless), a kernel file (its content
    would be quoted into the log) and a sparse file of gigabytes: refused by kind or size, never read."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    sparse = tmp_path / "sparse.txt"
    with open(sparse, "wb") as f:
        f.truncate(2 << 30)
    secret = "SECRET_VALUE_42"
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"web a.parquet 1\n\xff\xfe" + secret.encode() + b"\n")
    cases = [
        (fifo, "is a FIFO"),
        ("/dev/zero", "is a character device"),
        ("/proc/self/environ", "kernel pseudo-filesystem"),
        (sparse, "has 2,147,483,648 bytes, more than the 1,073,741,824"),
        (binary, "line 2 is not UTF-8 text"),
    ]
    for path, message in cases:
        with pytest.raises(ConfigError, match=message) as e:
            parse_list(str(path))
        assert "\n" not in str(e.value) and secret not in str(e.value)
    ok = tmp_path / "ok.txt"  # the control: a regular UTF-8 list is read
    ok.write_text("web a.parquet 1\n")
    assert [e.row for e in parse_list(str(ok))] == [1]


def test_exclude_and_its_step_go_together(corpus_dir, tokenizer_dir):
    for settings_ in ({"exclude": "list.txt"}, {"exclude_from_step": 3}):
        with pytest.raises(ConfigError, match="exclude and exclude_from_step go together"):
            config_from_dict(data_table(corpus_dir, tokenizer_dir, **settings_))


def test_at_a_resume_an_exclusion_may_change_only_the_steps_after_the_checkpoint():
    from zephon_titan.engine.fingerprint import EXCLUDE_KEY, check_exclusion
    from zephon_titan.errors import ResumeError

    def fp(k: int | None, digest: str = "aa") -> dict:
        return {} if k is None else {EXCLUDE_KEY: f"from step {k}, list sha256 {digest}"}

    assert check_exclusion(fp(None), fp(None), 5) == "" and check_exclusion(fp(3), fp(3), 5) == ""
    assert check_exclusion(fp(None), fp(6), 5) == "documents are excluded from step 6, list sha256 aa"
    assert "dropped" in check_exclusion(fp(7), fp(None), 5)  # planned, not begun
    assert check_exclusion(fp(7, "aa"), fp(6, "bb"), 5)  # not begun: the future may change
    with pytest.raises(ResumeError, match=r"exclude_from_step = 5 is at or before the checkpoint's step 5 .*to 6 or"):
        check_exclusion(fp(None), fp(5), 5)
    for changed in (fp(None), fp(3, "bb"), fp(4)):  # an exclusion in force since step 3 stays as it is
        with pytest.raises(ResumeError, match="the checkpoint's exclusion is in force since step 3, at or before"):
            check_exclusion(fp(3), changed, 5)


@pytest.mark.slow  # starts worker processes (~5 s)
def test_worker_processes_give_the_same_rows_under_an_exclusion_and_across_a_restore(
    tmp_path, corpus_dir, tokenizer_dir
):
    """Worker processes rebuild the spec (the list read again) and carry the lane states (`excluding` included)."""
    from zephon_titan.engine.lanes import open_lane_group

    small = {"num_lanes": LANES, "packing": "best_fit", "best_fit_window_docs": 4}
    base = make_spec(corpus_dir, tokenizer_dir, **small)
    rows = [r for rows in _steps(base) for r in rows]
    path = str(tmp_path / "list.txt")
    _write_list(path, base, sorted({_key(p) for r in rows[len(rows) // 2 :] for p in r.pieces})[::3], set())
    spec = make_spec(corpus_dir, tokenizer_dir, **small, exclude=path, exclude_from_step=3)
    in_process = LaneGroup(spec, range(LANES), ROWS)
    expected = [in_process.next_step() for _ in range(3)]
    states = in_process.state()
    expected += [in_process.next_step() for _ in range(2)]
    assert any(s.feed.excluding for s in states.values())

    def digest(steps) -> list[bytes]:
        return [row.to_bytes() for step in steps for lane in step for row in lane]

    with open_lane_group(spec, range(LANES), ROWS, num_workers=2) as workers:
        assert digest([workers.next_step() for _ in range(5)]) == digest(expected)
    with open_lane_group(spec, range(LANES), ROWS, num_workers=2, states=states, first_step=3) as workers:
        assert digest([workers.next_step() for _ in range(2)]) == digest(expected[3:])
    unlisted = [row.to_bytes() for step in _steps(base)[3:] for row in step]
    assert digest(expected[3:]) != unlisted  # control: the list changes those steps


def test_entries_naming_no_source_or_file_of_the_job_are_said_at_start(tmp_path, corpus_dir, tokenizer_dir):
    spec = make_spec(corpus_dir, tokenizer_dir, num_lanes=LANES)
    block = spec.sources[0].read_block(0)
    good = f"{spec.source_names[0]} {os.path.basename(block.file)} {block.rows[0]}\n"
    listed = tmp_path / "list.txt"
    listed.write_text(good + "nosuch part-0.parquet 3\n" + f"{spec.source_names[0]} missing.parquet 1\n")
    with_list = {"num_lanes": LANES, "exclude": str(listed), "exclude_from_step": 2}
    exclusion = make_spec(corpus_dir, tokenizer_dir, **with_list).exclusion
    assert exclusion.excludes(0, block.file, block.rows[0])  # the entry that names a document still counts
    assert exclusion.unplaced_note == (
        f"[dataloader] exclude: 2 of 3 entries of {listed} name no source or single file of this job and exclude "
        "nothing (first: line 2, nosuch part-0.parquet 3); `zephon-titan validate JOB` names every entry it cannot "
        "find"
    )
    listed.write_text(good)  # control: every entry placed, nothing to say
    assert make_spec(corpus_dir, tokenizer_dir, **with_list).exclusion.unplaced_note == ""


def test_a_source_excluded_whole_is_an_error_at_k_not_a_hang(tmp_path, corpus_dir, tokenizer_dir):
    """Every document of a weighted source on the list: from step k an endless lane would look for one forever.
    It stops with one line naming the source; the steps before k are produced as always."""
    docs = tmp_path / "small"
    docs.mkdir()
    (docs / "a.jsonl").write_text("".join(json.dumps({"text": f"document {i} " * 30}) + "\n" for i in range(12)))
    sources = {
        "prose": {"paths": [os.path.join(corpus_dir, "prose", "*.jsonl")], "block_bytes": 16384},
        "small": {"paths": [str(docs / "*.jsonl")], "block_bytes": 1024},
    }
    base = make_spec(corpus_dir, tokenizer_dir, sources=sources, num_lanes=1)
    path = str(tmp_path / "list.txt")
    small = base.sources[1]
    keys = [(1, b.file, row) for b in map(small.read_block, range(small.num_blocks)) for row in b.rows]
    _write_list(path, base, keys, set())
    spec = make_spec(corpus_dir, tokenizer_dir, sources=sources, num_lanes=1, exclude=path, exclude_from_step=3)
    stream = LaneStream(spec, 0, clock=StepClock(ROWS))
    stream.take(2 * ROWS)  # steps 1 and 2
    with (
        within_seconds(60),
        pytest.raises(
            DataError, match=r"source 'small': lane 0 met all \d+ of its blocks .* excluded, left out by its keep"
        ),
    ):
        stream.take(4 * ROWS)


def test_validate_foresees_a_source_excluded_whole(tmp_path, corpus_dir, tokenizer_dir, capsys):
    """The run would stop at step k (the test above); `validate` says so, and exits 1, before any GPU is spent."""
    from helpers import write_job

    from zephon_titan.cli import main

    spec = make_spec(corpus_dir, tokenizer_dir)
    code = spec.sources[spec.source_names.index("code")]
    blocks = [code.read_block(b) for b in range(code.num_blocks)]
    lines = [f"code {os.path.basename(b.file)} {row}" for b in blocks for row in b.rows]
    listed = tmp_path / "exclude.txt"
    settings_ = f'exclude = "{listed}"\nexclude_from_step = 3'
    job = write_job(tmp_path / "job.toml", corpus_dir, tokenizer_dir, dataloader=settings_)
    listed.write_text(lines[0] + "\n")  # the control: one document excluded
    assert main(["validate", job]) == 0
    assert "(1 excluded from step 3)" in capsys.readouterr().out
    listed.write_text("\n".join(lines) + "\n")
    assert main(["validate", job]) == 1
    out = capsys.readouterr().out
    assert f"({len(lines):,} excluded from step 3)" in out
    assert "ERROR: [dataloader] exclude removes every document of code from step 3" in out
