"""A source's keep and repeat (engine/pipeline.py, config/expressions.py), against an independent reference.

The reference here reads the fixture's records itself, decides each document's fate with plain Python (the
condition by hand, the repeat's hash by splitmix64 over Python integers), and the loader's rows must train
exactly those documents that many times, for several rank and worker counts and across restores. Negative
controls: another threshold and another seed give other rows.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import reference_copies, scored_records, scored_table
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zephon_titan.config.expressions import ExpressionError, check_keep, check_repeat, parse, upper_bound
from zephon_titan.engine.feed import Document
from zephon_titan.engine.rows import RowShape
from zephon_titan.errors import ConfigError, DataError
from zephon_titan.testing import (
    assert_restores_exactly,
    assert_same_rows_for_any_layout,
    epoch_rows,
    spec_from_table,
)

_copies = reference_copies


def _trained(spec) -> Counter:
    """Per (file, row), how many whole copies of the document the rows of one pass hold (tokens / its length)."""
    tokens: Counter = Counter()
    for row in epoch_rows(spec):
        for piece in row.pieces:
            tokens[(piece.file, piece.row)] += piece.length
    shape, lengths = RowShape.of(spec), {}
    for source in spec.sources:
        for b in range(source.num_blocks):
            block = source.read_block(b)
            for row_id, ids in zip(block.rows, spec.tokenizer.encode(list(block.texts))):
                lengths[(block.file, row_id)] = shape.piece_slots(Document(0, ids, block.file, row_id, 0, len(ids)))
    out = Counter()
    for key, n in tokens.items():
        assert n % lengths[key] == 0, f"{key}: {n} tokens of a document of {lengths[key]}: a copy is cut"
        out[key] = n // lengths[key]
    return out


# Conditions drawn for the property, each with the same rule in Python (None: a missing value).
CONDITIONS = {
    "quality >= {t}": lambda r, t: r["quality"] is not None and r["quality"] >= t,
    "quality < {t} or quality is null": lambda r, t: r["quality"] is None or r["quality"] < t,
    "lang in ['en', 'fr'] and quality > {t}": lambda r, t: (
        r["lang"] in ("en", "fr") and (r["quality"] or 0) > t and r["quality"] is not None
    ),
    "not (lang == 'de') and meta.score >= {k}": lambda r, t: (
        r["lang"] is not None and r["lang"] != "de" and r["meta"]["score"] >= round(t * 4)
    ),
    "chars > {c} and meta.site != 's1'": lambda r, t: len(r["text"]) > round(t * 2000) and r["meta"]["site"] != "s1",
}
REPEATS = {
    "": lambda r: 1.0,
    "{t}": lambda r, t=None: None,  # filled in below: a constant share
    "min(meta.score * {t} + 0.5, 3)": lambda r, t=None: None,
}


def _repeat_value(text: str, record: dict, t: float) -> float:
    if not text:
        return 1.0
    if text == "{t}":
        return t
    return min(record["meta"]["score"] * t + 0.5, 3.0)


def _fill(text: str, t: float) -> str:
    return text.format(t=t, k=round(t * 4), c=round(t * 2000))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    condition=st.sampled_from(sorted(CONDITIONS)),
    repeat=st.sampled_from(sorted(REPEATS)),
    t=st.floats(0.05, 0.95),
    seed=st.integers(0, 2**32),
    packing=st.sampled_from(["wrap", "best_fit"]),
    transform=st.sampled_from(["", "drop_short", "tag_language"]),
)
def test_the_rows_train_what_the_reference_decides(
    scored, tokenizer_dir, condition, repeat, t, seed, packing, transform
):
    import pipeline_transforms

    keep, rep = _fill(condition, t), _fill(repeat, t)
    table = scored_table(scored, tokenizer_dir, keep=(keep, keep), repeat=(rep, rep), seed=seed, packing=packing)
    for source in table["sources"].values():
        source["transform"] = [f"pipeline_transforms:{transform}"] if transform else []
    spec = spec_from_table({**table, "exhaustion": "redistribute"})
    expected = Counter()
    for (file, row), record in scored_records(scored).items():
        source = "code" if "/code/" in file else "prose"
        if transform and getattr(pipeline_transforms, transform)(record) is None:
            continue  # the transform drops it (after keep and repeat decided on the columns)
        if CONDITIONS[condition](record, t):
            n = _copies(_repeat_value(repeat, record, t), seed, source, file, row)
            if n:
                expected[(file, row)] = n
    assert _trained(spec) == expected


def test_any_layout_and_exact_restores(scored, tokenizer_dir):
    table = scored_table(
        scored, tokenizer_dir, keep=("quality >= 0.3", "lang != 'de'"), repeat=("0.7", "min(meta.score, 2.5)")
    )
    spec = spec_from_table(table)
    assert_same_rows_for_any_layout(spec)
    for lane in (0, 3):
        assert_restores_exactly(spec, lane, [0, 1, 3, 7, 12], rows=4)


def test_worker_processes_give_the_same_rows_and_resume_them(scored, tokenizer_dir):
    """Workers rebuild the pipeline from the config (the expressions are text): the same rows, and a restore in
    workers continues the in-process lanes."""
    from zephon_titan.engine import LaneGroup, open_lane_group

    table = scored_table(
        scored, tokenizer_dir, keep=("quality >= 0.3", "lang != 'de'"), repeat=("1.5", "min(meta.score, 2.5)")
    )
    spec = spec_from_table(table)
    group = LaneGroup(spec, range(4), 2)
    expected = [group.next_step() for _ in range(3)]
    states = group.state()
    expected += [group.next_step() for _ in range(3)]

    def digest(steps) -> list[bytes]:
        return [row.to_bytes() for step in steps for lane in step for row in lane]

    with open_lane_group(spec, range(4), 2, num_workers=2) as workers:
        assert digest([workers.next_step() for _ in range(6)]) == digest(expected)
    with open_lane_group(spec, range(4), 2, num_workers=2, states=states, first_step=3) as workers:
        assert digest([workers.next_step() for _ in range(3)]) == digest(expected[3:])


def test_negative_controls_another_threshold_and_another_seed(scored, tokenizer_dir):
    def rows(**kw):
        return [
            r.to_bytes()
            for r in epoch_rows(
                spec_from_table({**scored_table(scored, tokenizer_dir, **kw), "exhaustion": "redistribute"})
            )
        ]

    base = rows(keep=("quality >= 0.5", ""), repeat=("", "0.5"))
    assert base == rows(keep=("quality >= 0.5", ""), repeat=("", "0.5"))
    assert base != rows(keep=("quality >= 0.6", ""), repeat=("", "0.5"))
    assert base != rows(keep=("quality >= 0.5", ""), repeat=("", "0.5"), seed=8)


def test_a_filter_leaves_the_kept_documents_in_their_order(scored, tokenizer_dir):
    """A stricter condition only removes documents: each source's others come in the same order (mixing, which
    counts tokens, may interleave the sources differently)."""

    def order(keep):
        spec = spec_from_table({**scored_table(scored, tokenizer_dir, keep=(keep, keep)), "exhaustion": "redistribute"})
        seen = []
        for row in epoch_rows(spec):
            for p in row.pieces:
                if p.doc_offset == 0:
                    seen.append((p.file, p.row))
        return seen

    for source in ("code", "prose"):
        loose = [d for d in order("quality >= 0.2") if f"/{source}/" in d[0]]
        strict = [d for d in order("quality >= 0.6") if f"/{source}/" in d[0]]
        assert set(strict) < set(loose)
        assert [d for d in loose if d in set(strict)] == strict


def test_a_pipeline_that_keeps_everything_once_is_the_loader_without_one(scored, tokenizer_dir):
    """`keep = "true"` and `repeat = "1"` take the pipeline's path (slots, counts, skips) and must give the rows
    of the path without a pipeline, which is the loader as it was; only the fingerprint tells them apart."""
    from zephon_titan.engine import fingerprint

    def rows(**kw):
        spec = spec_from_table({**scored_table(scored, tokenizer_dir, **kw), "exhaustion": "redistribute"})
        return [r.to_bytes() for r in epoch_rows(spec)], fingerprint(spec)

    plain, fp = rows()
    assert not any(k.startswith("pipeline.") for k in fp)
    assert rows(keep=("true", "quality is null or quality >= 0"))[0] == plain
    assert rows(repeat=("1", "if(quality is null, 1, 1)"))[0] == plain
    assert rows(keep=("quality is not null", ""))[0] != plain  # the control: a filter that drops some


def test_the_pipeline_is_in_the_fingerprint(scored, tokenizer_dir):
    from zephon_titan.engine import fingerprint

    fp = fingerprint(
        spec_from_table(
            scored_table(scored, tokenizer_dir, keep=("quality > 0.5", ""), repeat=("", "min(quality * 4, 2.5)"))
        )
    )
    assert fp["pipeline.code"] == "keep quality > 0.5 (1 slot per document)"
    assert fp["pipeline.prose"] == "repeat min(quality * 4, 2.5) (3 slots per document)"


def test_repeat_counts_follow_the_fraction_per_pass():
    """floor(x) copies always, one more with probability frac(x), drawn anew each pass."""
    from zephon_titan.engine.pipeline import SourcePipeline

    pipeline = SourcePipeline("web", None, parse("2.3", "repeat", "number"), 3)
    rows = np.arange(20_000)
    keep, repeat = np.ones(len(rows), dtype=bool), np.full(len(rows), 2.3)
    a = pipeline.counts(keep, repeat, 1, "x/part-0.jsonl", rows, epoch=0)
    b = pipeline.counts(keep, repeat, 1, "y/part-0.jsonl", rows, epoch=1)
    assert set(a) == {2, 3} and abs((a == 3).mean() - 0.3) < 0.02
    assert (a != b).any() and abs((b == 3).mean() - 0.3) < 0.02
    assert (a == pipeline.counts(keep, repeat, 1, "z/part-0.jsonl", rows, epoch=0)).all()  # the name, not the place
    assert [_copies(2.3, 1, "web", "part-0.jsonl", int(r)) for r in rows[:300]] == list(a[:300])


# ---- the command line ---------------------------------------------------------------------------------------


PIPELINE_TOML = 'keep = "quality >= 0.4"\nrepeat = "min(meta.score * 0.75, 2.5)"'


def test_validate_plan_and_where_see_the_pipeline(scored, tokenizer_dir, tmp_path, capsys):
    from helpers import write_job

    from zephon_titan.cli import main

    job = write_job(tmp_path / "job.toml", scored, tokenizer_dir, source=PIPELINE_TOML)
    assert main(["validate", job, "--world-sizes", "2"]) == 0
    out = capsys.readouterr().out
    records = scored_records(scored)
    for source in ("code", "prose"):
        mine = [r for (f, _), r in records.items() if f"/{source}/" in f]
        kept = sum(r["quality"] is not None and r["quality"] >= 0.4 for r in mine)
        assert f"keeps {kept:,} of {len(mine):,} documents ({kept / len(mine):.1%})" in out
    assert "pipeline: keep quality >= 0.4; repeat min(meta.score * 0.75, 2.5) (3 slots per document)" in out
    assert "pipeline.prose" in out
    assert main(["plan", job, "--steps", "3", "-o", str(tmp_path / "a.jsonl")]) == 0
    capsys.readouterr()
    # A document the filter drops, and one trained twice or three times a pass, as `where` says them.
    (dropped,) = [k for k, r in records.items() if "/code/" in k[0] and r["quality"] is None][:1]
    assert (
        main(["where", job, "--source", "code", "--file", dropped[0], "--row", str(dropped[1]), "--steps", "1-2"]) == 1
    )
    assert "left out by its keep (quality >= 0.4): never trained" in capsys.readouterr().out
    (twice,) = [
        k for k, r in records.items() if "/code/" in k[0] and (r["quality"] or 0) >= 0.4 and r["meta"]["score"] == 3
    ][:1]
    main(["where", job, "--source", "code", "--file", twice[0], "--row", str(twice[1]), "--steps", "1-2"])
    assert "kept, repeat 2.25: 2 or 3 copies per pass" in capsys.readouterr().out


def test_a_typo_in_the_job_is_one_line_at_validate(scored, tokenizer_dir, tmp_path, capsys):
    from helpers import write_job

    from zephon_titan.cli import main

    job = write_job(tmp_path / "job.toml", scored, tokenizer_dir, source="keep = \"quality >= 0.4 adn lang == 'en'\"")
    assert main(["validate", job]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith(
        "[dataloader.sources.code] keep = \"quality >= 0.4 adn lang == 'en'\": unexpected 'adn' at character 16"
    )


# ---- the language -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, problem",
    [
        ("quality >", "expected a value, found 'the end' at character 10"),
        ("quality >= 0.7 and", "expected a value"),
        ("foo(quality)", "unknown function 'foo'"),
        ("lang == 1 + 'a'", "'+' needs a number, got a string"),
        ("quality and lang", None),  # columns: their kinds are the data's
        ("1 + 2", "gives a number, expected a condition"),
        ("quality @ 2", "cannot read '@ 2' at character 9"),
        ("lang in ['en', 3]", "'in' needs a non-empty list"),
        ("(quality > 1", "expected ')'"),
        ("min(quality)", "min() takes 2 to 8 arguments, got 1"),
        ("__import__('os').system('x')", 'cannot read ".system(\'x"'),
        ("__import__('os')", "unknown function '__import__'"),
    ],
)
def test_a_bad_keep_is_one_line_naming_the_key(text, problem):
    if problem is None:
        check_keep(text, "[dataloader.sources.web] keep")
        return
    with pytest.raises(ExpressionError) as e:
        check_keep(text, "[dataloader.sources.web] keep")
    assert problem in str(e.value) and "[dataloader.sources.web] keep = " in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "text, bound",
    [
        ("0.3", 0.3),
        ("min(score * 2, 3)", 3),
        ("if(quality > 0.5, 2, 0.5)", 2),
        ("abs(min(x, 1))", math.inf),
        ("max(min(x, 2), 0.5) * 1.5", 3),
        ("min(chars / 1000, 4)", 4),
        ("-min(x, -2)", math.inf),
    ],
)
def test_a_repeat_is_bounded_by_interval_arithmetic(text, bound):
    assert upper_bound(parse(text, "repeat", "number")) == bound
    if math.isinf(bound):
        with pytest.raises(ExpressionError, match=r"bound it, e\.g\. min\("):
            check_repeat(text, "[dataloader.sources.web] repeat")


def test_the_config_refuses_a_bad_expression_when_it_is_made(scored, tokenizer_dir):
    with pytest.raises(ConfigError, match=r"\[dataloader.sources.code\] keep = 'quality >>= 1'"):
        spec_from_table(scored_table(scored, tokenizer_dir, keep=("quality >>= 1", "")))
    with pytest.raises(ConfigError, match=r"repeat = 'score \* 2' can be any number"):
        spec_from_table(scored_table(scored, tokenizer_dir, repeat=("score * 2", "")))


@pytest.mark.parametrize(
    "keep, repeat, message",
    [
        ("qualty > 0.5", "", r"code/part-\d.parquet: no column 'qualty', which source 'code'"),
        ("lang > 0.5", "", r"code/part-\d.parquet row \d+\.\. \(source 'code'\): 'lang > 0.5' does not fit"),
        ("", "min(lang, 2)", r"does not fit the data's types"),
    ],
)
def test_data_that_does_not_fit_is_one_line_naming_file_and_column(scored, tokenizer_dir, keep, repeat, message):
    table = scored_table(scored, tokenizer_dir, keep=(keep, ""), repeat=(repeat, ""), exhaustion="redistribute")
    with pytest.raises(DataError, match=message) as e:
        epoch_rows(spec_from_table(table))
    assert "\n" not in str(e.value)


def test_a_jsonl_field_no_record_has_is_named(scored, tokenizer_dir):
    spec = spec_from_table(scored_table(scored, tokenizer_dir, keep=("", "qualty > 0.5"), exhaustion="redistribute"))
    with pytest.raises(
        DataError, match=r"prose/part-\d.jsonl \(from byte [\d,]+\): no record of this block has the field 'qualty'"
    ):
        epoch_rows(spec)


def test_a_source_whose_pipeline_keeps_nothing_is_one_line_not_a_hang(scored, tokenizer_dir):
    spec = spec_from_table(scored_table(scored, tokenizer_dir, keep=("quality > 2", "")))
    from zephon_titan.engine import LaneStream

    with pytest.raises(DataError, match="left out by its keep or repeat"):
        stream = LaneStream(spec, 0)
        for _ in range(10_000):
            stream.next_row()


# ---- a change from a step on --------------------------------------------------------------------------------

CHANGE_AT = 3  # the checkpoint's step; the new keep and repeat from the next


def _steps(spec, steps, states=None, first=0, lanes=4, rows=2) -> list[list]:
    from zephon_titan.engine import LaneGroup

    group = LaneGroup(spec, range(lanes), rows, states, first)
    return [[row for lane in group.next_step() for row in lane] for _ in range(steps)]


@pytest.mark.parametrize("packing", ["wrap", "best_fit"])
def test_a_stricter_keep_and_another_repeat_from_the_step_after_the_checkpoint(scored, tokenizer_dir, packing):
    """Saved after step 3 with keep quality >= 0.3, resumed with quality >= 0.6 and another repeat from step 4:
    steps 1-3 are the first run's; steps 4.. equal an uninterrupted run of both eras and hold no document the
    new keep drops (its open documents' rests are left out too); the first run's steps 4.. hold some (control)."""
    from helpers import engine_checkpoint

    from zephon_titan.engine import fingerprint
    from zephon_titan.engine.pipeline import PipelineEra
    from zephon_titan.engine.resume import read_state
    from zephon_titan.loader.state import Decoded

    before = {"quality >= 0.3": "min(meta.score, 2)"}
    old = spec_from_table(
        scored_table(
            scored, tokenizer_dir, keep=("quality >= 0.3",) * 2, repeat=("min(meta.score, 2)",) * 2, packing=packing
        )
    )
    table = scored_table(scored, tokenizer_dir, keep=("quality >= 0.6",) * 2, repeat=("0.5",) * 2, packing=packing)
    new = spec_from_table({**table, "pipeline_from_step": CHANGE_AT + 1})
    restored = read_state(Decoded(engine_checkpoint(old, CHANGE_AT)), range(4), fingerprint(new))
    assert restored.mixture_change == f"keep and repeat of code, prose change from step {CHANGE_AT + 1}"
    resumed = restored.spec(new)
    assert [e.start for e in resumed.pipeline_eras] == [1, CHANGE_AT + 1]

    first = _steps(old, CHANGE_AT + 4)
    group = __import__("zephon_titan.engine", fromlist=["LaneGroup"]).LaneGroup(old, range(4), 2)
    for _ in range(CHANGE_AT):
        group.next_step()
    after = _steps(resumed, 4, group.state(), CHANGE_AT)
    # The uninterrupted run of both eras: the resumed spec from step 0.
    whole = _steps(resumed, CHANGE_AT + 4)
    assert [[r.to_bytes() for r in s] for s in whole[:CHANGE_AT]] == [
        [r.to_bytes() for r in s] for s in first[:CHANGE_AT]
    ]
    assert [[r.to_bytes() for r in s] for s in after] == [[r.to_bytes() for r in s] for s in whole[CHANGE_AT:]]
    records = scored_records(scored)

    def low(steps) -> int:
        return sum(
            records[(p.file, p.row)]["quality"] is None or records[(p.file, p.row)]["quality"] < 0.6
            for step in steps
            for row in step
            for p in row.pieces
        )

    assert low(after) == 0 and low(first[CHANGE_AT:]) > 0
    if packing == "wrap":  # worker processes rebuild the eras from the spec they are sent, and restore the same
        from zephon_titan.engine import open_lane_group

        states = group.state()
        with open_lane_group(resumed, range(4), 2, num_workers=2, states=states, first_step=CHANGE_AT) as workers:
            got = [[row.to_bytes() for lane in workers.next_step() for row in lane] for _ in range(4)]
        assert got == [[r.to_bytes() for r in s] for s in after]
    # A state whose open unit names an era the run does not have is refused in one line.
    from zephon_titan.engine import LaneGroup
    from zephon_titan.errors import ResumeError

    doctored = {
        lane: dataclasses.replace(st, feed=dataclasses.replace(st.feed, era=7))
        for lane, st in group.state().items()
        if st.packer.unit_open
    }
    assert doctored  # lanes with a unit open at the checkpoint (long documents)
    with pytest.raises(ResumeError, match="drawn in pipeline era 7, but the run has 2"):
        LaneGroup(resumed, sorted(doctored), 2, doctored, CHANGE_AT)
    assert before  # the old era's expressions are in the history
    assert resumed.pipeline_eras[0] == PipelineEra(
        1, {n: ("quality >= 0.3", "min(meta.score, 2)") for n in ("code", "prose")}
    )


def test_a_change_at_or_before_the_checkpoint_or_past_its_slots_is_refused(scored, tokenizer_dir):
    from helpers import engine_checkpoint

    from zephon_titan.engine import fingerprint
    from zephon_titan.engine.resume import read_state
    from zephon_titan.errors import ResumeError
    from zephon_titan.loader.state import Decoded

    old = spec_from_table(
        scored_table(scored, tokenizer_dir, keep=("quality >= 0.3", ""), repeat=("min(meta.score, 2)", ""))
    )
    saved = engine_checkpoint(old, CHANGE_AT)
    stricter = scored_table(scored, tokenizer_dir, keep=("quality >= 0.6", ""), repeat=("min(meta.score, 2)", ""))
    with pytest.raises(
        ResumeError,
        match=rf"keep, repeat, transform or chat template of source code changed, .* set \[dataloader\] pipeline_from_step = {CHANGE_AT + 1}",
    ):
        read_state(Decoded(saved), range(4), fingerprint(spec_from_table(stricter)))
    with pytest.raises(ResumeError, match="pipeline_from_step"):
        read_state(
            Decoded(saved), range(4), fingerprint(spec_from_table({**stricter, "pipeline_from_step": CHANGE_AT}))
        )
    more = scored_table(scored, tokenizer_dir, keep=("quality >= 0.3", ""), repeat=("min(meta.score, 3)", ""))
    with pytest.raises(
        ResumeError, match=r"can train a document 3 times a pass, but the run's windows have room for 2"
    ):
        read_state(
            Decoded(saved), range(4), fingerprint(spec_from_table({**more, "pipeline_from_step": CHANGE_AT + 1}))
        )
    # The control: the same pipeline from the next step is no change at all.
    same = scored_table(scored, tokenizer_dir, keep=("quality >= 0.3", ""), repeat=("min(meta.score, 2)", ""))
    restored = read_state(
        Decoded(saved), range(4), fingerprint(spec_from_table({**same, "pipeline_from_step": CHANGE_AT + 1}))
    )
    assert restored.mixture_change == ""


def test_init_lists_the_columns_keep_and_repeat_may_read(scored, tokenizer_dir, tmp_path, monkeypatch, capsys):
    from zephon_titan.cli import main

    monkeypatch.chdir(tmp_path)
    argv = [
        "init",
        f"{scored}/code",
        f"{scored}/prose",
        "--tokenizer",
        tokenizer_dir,
        "--gpus",
        "1,2",
        "-o",
        "job.toml",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    (code,) = [line for line in out.splitlines() if "columns for keep and repeat:" in line][:1]
    assert all(c in code for c in ("quality (double)", "lang (string)", "meta (struct<"))
    written = (tmp_path / "job.toml").read_text()
    assert written.count('# keep = "...", repeat = "..." over its columns: ') == 2
    assert "text (string)" not in out  # the text column is the text, not a column to filter on


def test_a_lance_source_filters_and_transforms_like_parquet(scored, tokenizer_dir, tmp_path):
    """The same records as a Lance dataset and as Parquet: keep, repeat and a transform train the same documents
    the same number of times (Lance blocks are row ranges of fragments, so the documents are matched by text)."""
    lance = pytest.importorskip("lance")
    records = [r for (f, _), r in sorted(scored_records(scored).items()) if "/code/" in f]
    lance.write_dataset(pa.Table.from_pylist(records), str(tmp_path / "code.lance"), max_rows_per_file=12)
    # Whole repeats: a fraction is decided by the document's file name and row, which differ between the two.
    source = {"keep": "quality >= 0.3 and meta.score > 0", "repeat": "if(meta.score > 2, 2, 1)",
              "transform": ["pipeline_transforms:tag_language"]}  # fmt: skip
    trained = {}
    for name, paths in (("lance", [str(tmp_path / "code.lance")]), ("parquet", [f"{scored}/code/*.parquet"])):
        table = {"num_lanes": 2, "seed": 7, "tokenizer_path": tokenizer_dir, "exhaustion": "redistribute",
                 "sources": {"code": {"paths": paths, "block_rows": 4, **source}}}  # fmt: skip
        spec = spec_from_table(table)
        counts: Counter = Counter()
        for row in epoch_rows(spec):
            for p in row.pieces:
                counts[(p.file, p.row)] += p.length
        by_text: Counter = Counter()
        for s in spec.sources:
            for b in range(s.num_blocks):
                block = s.read_block(b)
                for r, text in zip(block.rows, block.texts):
                    if (block.file, r) in counts:
                        by_text[text] += counts[(block.file, r)]
        trained[name] = by_text
    assert trained["lance"] == trained["parquet"] and len(trained["parquet"]) > 3


def test_hostile_expressions_are_one_line(scored, tokenizer_dir):
    deep = "(" * 500 + "quality > 1" + ")" * 500
    for text, message in [
        (deep, "nested over 64 levels deep"),
        ("not " * 400 + "quality > 1", "nested over 64 levels deep"),
        ("- " * 400 + "quality > 1", "nested over 64 levels deep"),
        ("quality > 1 or " * 400 + "quality > 2", "characters, over 4,096"),
    ]:
        with pytest.raises(ExpressionError, match=message) as e:
            check_keep(text, "[dataloader.sources.web] keep")
        assert "\n" not in str(e.value) and len(str(e.value)) < 5000
    check_keep("(" * 20 + "quality > 1" + ")" * 20, "keep")  # the control: nesting within the bound


def test_a_derived_name_that_is_also_a_column_is_refused(scored, tokenizer_dir, tmp_path):
    """`chars` is the text's length; a file with a column `chars` makes it ambiguous: one line, not a guess."""
    pq.write_table(pa.table({"text": ["a b c", "d e"], "chars": [10, 20]}), tmp_path / "c.parquet")
    (tmp_path / "c.jsonl").write_text(json.dumps({"text": "a b c", "chars": 10}) + "\n")
    for path, what in ((tmp_path / "c.parquet", "column"), (tmp_path / "c.jsonl", "field")):
        table = {"num_lanes": 1, "seed": 1, "tokenizer_path": tokenizer_dir, "exhaustion": "redistribute",
                 "sources": {"s": {"paths": [str(path)], "keep": "chars > 3"}}}  # fmt: skip
        with pytest.raises(
            DataError, match=rf"uses chars, the text's length, but .* {what} 'chars' too; write `chars`"
        ):
            epoch_rows(spec_from_table(table))
        table["sources"]["s"]["keep"] = "`chars` > 3"  # the column, by name: no ambiguity
        assert epoch_rows(spec_from_table(table))


def test_a_pipeline_from_step_that_changes_nothing_keeps_the_lanes_as_they_were(scored, tokenizer_dir):
    """pipeline_from_step with no keep or repeat anywhere: no era changes anything, so the lanes need no clock, the
    states keep their form and the rows are the plain loader's (the control: with a keep from that step, they do)."""
    from zephon_titan.engine import LaneStream

    plain = spec_from_table(scored_table(scored, tokenizer_dir))
    idle = spec_from_table({**scored_table(scored, tokenizer_dir), "pipeline_from_step": 3})
    assert not idle.pipelines_change
    assert [r.to_bytes() for r in LaneStream(idle, 0).take(6)] == [r.to_bytes() for r in LaneStream(plain, 0).take(6)]
    later = spec_from_table(
        {**scored_table(scored, tokenizer_dir, keep=("quality > 0.5", "")), "pipeline_from_step": 3}
    )
    assert later.pipelines_change
    with pytest.raises(ValueError, match="keep and repeat by step needs the step of its rows"):
        LaneStream(later, 0)


def test_token_files_take_a_repeat_that_is_a_number_and_nothing_that_reads_columns(tokenizer_dir, tmp_path):
    """Megatron files hold ids only: keep (or chars) is refused in one line; `repeat = "0.5"` trains about half."""
    from token_files import write_megatron

    rng = np.random.default_rng(0)
    write_megatron(str(tmp_path / "ids"), [list(rng.integers(5, 1500, size=40)) for _ in range(400)])

    def table(**source):
        return {"num_lanes": 2, "seed": 3, "tokenizer_path": tokenizer_dir, "exhaustion": "redistribute",
                "sources": {"t": {"paths": [str(tmp_path / "ids.bin")], **source}}}  # fmt: skip

    for bad, message in (({"keep": "quality > 0.5"}, "reads 'quality', but megatron files hold only token ids"),
                         ({"keep": "chars > 10"}, "uses chars or bytes, the length of a text")):  # fmt: skip
        with pytest.raises(ConfigError, match=message):
            spec_from_table(table(**bad))
    trained = {(p.file, p.row) for row in epoch_rows(spec_from_table(table(repeat="0.5"))) for p in row.pieces}
    everything = {(p.file, p.row) for row in epoch_rows(spec_from_table(table())) for p in row.pieces}
    assert len(everything) == 400 and 160 < len(trained) < 240 and trained < everything


def test_the_eval_part_takes_keep_but_not_repeat(scored, tokenizer_dir):
    """The held-out part (split = "eval") keeps the documents keep keeps, each once; training's part repeats them."""
    table = scored_table(
        scored, tokenizer_dir, keep=("quality >= 0.4",) * 2, repeat=("2",) * 2, exhaustion="redistribute"
    )
    for source in table["sources"].values():
        source["eval_fraction"] = 0.3
    records = scored_records(scored)
    seen: dict[str, Counter] = {}
    for split in ("eval", "train"):
        seen[split] = Counter(
            (p.file, p.row) for row in epoch_rows(spec_from_table({**table, "split": split})) for p in row.pieces
            if p.doc_offset == 0
        )  # fmt: skip
        low = [k for k in seen[split] if records[k]["quality"] is None or records[k]["quality"] < 0.4]
        assert seen[split] and not low
    assert set(seen["eval"].values()) == {1} and set(seen["train"].values()) == {2}
    assert not set(seen["eval"]) & set(seen["train"])
