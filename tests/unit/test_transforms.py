"""A source's `transform` (engine/transforms.py): the rows train what applying the functions by hand gives, in
process and in workers; the determinism checks catch state across documents and dependence on the hash seed;
every misuse is one line. The transforms: tests/pipeline_transforms.py."""

from __future__ import annotations

import importlib
import sys
from collections import Counter

import pytest
from helpers import scored_records, scored_table

from zephon_titan.engine.feed import Document
from zephon_titan.engine.rows import RowShape
from zephon_titan.errors import ConfigError, DataError
from zephon_titan.testing import epoch_rows, spec_from_table


def _spec(root, tokenizer_dir, transform, keep=("", ""), **overrides):
    table = scored_table(root, tokenizer_dir, keep=keep, **{"exhaustion": "redistribute", **overrides})
    for source in table["sources"].values():
        source["transform"] = transform
    return spec_from_table(table)


def _slots_trained(spec) -> Counter:
    out: Counter = Counter()
    for row in epoch_rows(spec):
        for piece in row.pieces:
            out[(piece.file, piece.row)] += piece.length
    return out


def test_the_rows_train_the_transformed_documents(scored, tokenizer_dir):
    import pipeline_transforms as t

    spec = _spec(scored, tokenizer_dir, ["pipeline_transforms:tag_language", "pipeline_transforms:drop_short"],
                 keep=("quality >= 0.3", "quality >= 0.3"))  # fmt: skip
    shape = RowShape.of(spec)
    expected = Counter()
    for (file, row), record in scored_records(scored).items():
        if record["quality"] is None or record["quality"] < 0.3:
            continue
        text = t.drop_short(t.tag_language(record))
        if text is None:
            continue
        (ids,) = spec.tokenizer.encode([text])
        expected[(file, row)] = shape.piece_slots(Document(0, ids, file, row, 0, len(ids)))
    assert _slots_trained(spec) == +expected
    plain = _slots_trained(_spec(scored, tokenizer_dir, [], keep=("quality >= 0.3", "quality >= 0.3")))
    assert plain != +expected  # the control: without the transforms the rows differ


def test_workers_import_the_transforms_and_give_the_same_rows(scored, tokenizer_dir):
    from zephon_titan.engine import LaneGroup, open_lane_group

    spec = _spec(scored, tokenizer_dir, ["pipeline_transforms:drop_short"], exhaustion="repeat")
    group = LaneGroup(spec, range(4), 2)
    expected = [row.to_bytes() for _ in range(4) for lane in group.next_step() for row in lane]
    with open_lane_group(spec, range(4), 2, num_workers=2) as workers:
        assert [row.to_bytes() for _ in range(4) for lane in workers.next_step() for row in lane] == expected


def test_the_fingerprint_names_each_function_and_its_code(scored, tokenizer_dir, tmp_path, monkeypatch):
    from zephon_titan.engine import fingerprint

    fp = fingerprint(_spec(scored, tokenizer_dir, ["pipeline_transforms:drop_short", "pipeline_transforms:versioned"]))
    assert fp["transform.code"].startswith("pipeline_transforms:drop_short (sha256 ")
    assert fp["transform.code"].endswith("; pipeline_transforms:versioned (version 3)")
    # Another body under the same name is another fingerprint (a resume refuses it).
    monkeypatch.syspath_prepend(str(tmp_path))
    digests = []
    for body in ("return record['text']", "return record['text'].strip()"):
        (tmp_path / "my_cleanup.py").write_text(f"def clean(record):\n    {body}\n")
        sys.modules.pop("my_cleanup", None)
        importlib.invalidate_caches()
        digests.append(fingerprint(_spec(scored, tokenizer_dir, ["my_cleanup:clean"]))["transform.code"])
    assert digests[0] != digests[1]


@pytest.mark.parametrize(
    "reference, message",
    [
        ("pipeline_transforms:numbered", "is not a pure function of its record: sample record 0 gave"),
        ("pipeline_transforms:by_hash", "gave another result in a fresh process with another hash seed"),
        ("no_such_module:f", "cannot import 'no_such_module' (ModuleNotFoundError"),
        ("pipeline_transforms:nothing", "module 'pipeline_transforms' has no function 'nothing'"),
        ("pipeline_transforms:never_returns", "did not finish 16 sample records in 2 s in a fresh process"),
    ],
)
def test_a_transform_that_cannot_be_trusted_is_refused_before_any_row(
    scored, tokenizer_dir, reference, message, monkeypatch
):
    from zephon_titan.engine import transforms

    monkeypatch.setattr(transforms, "FRESH_TIMEOUT_S", 2)  # a transform that never returns: said, not waited for
    with pytest.raises(ConfigError, match=r"\[dataloader.sources.code\] transform") as e:
        _spec(scored, tokenizer_dir, [reference])
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "reference, message",
    [
        (
            "pipeline_transforms:fails_on_long",
            r"(row|byte offset) \d+ \(source '\w+'\): transform pipeline_transforms:fails_on_long raised ValueError: too long",
        ),
        (
            "pipeline_transforms:returns_a_number",
            r"transform pipeline_transforms:returns_a_number returned int; return the new text",
        ),
    ],
)
def test_a_transform_that_fails_on_a_document_names_it(scored, tokenizer_dir, reference, message):
    spec = _spec(scored, tokenizer_dir, [reference])
    with pytest.raises(DataError, match=message) as e:
        epoch_rows(spec)
    assert "\n" not in str(e.value)


def test_a_malformed_reference_is_refused_when_the_config_is_made(scored, tokenizer_dir):
    with pytest.raises(ConfigError, match=r"'strip' is not module:function"):
        _spec(scored, tokenizer_dir, ["strip"])


def test_validate_and_where_report_the_transforms(scored, tokenizer_dir, tmp_path, capsys):
    import pipeline_transforms as t
    from helpers import write_job

    from zephon_titan.cli import main

    job = write_job(
        tmp_path / "job.toml", scored, tokenizer_dir, source='transform = ["pipeline_transforms:drop_short"]'
    )
    assert main(["validate", job, "--world-sizes", "2"]) == 0
    out = capsys.readouterr().out
    records = scored_records(scored)
    for source in ("code", "prose"):
        mine = [r for (f, _), r in records.items() if f"/{source}/" in f]
        dropped = sum(t.drop_short(r) is None for r in mine)
        assert f"they drop {dropped:,} of {len(mine):,} documents ({dropped / len(mine):.1%})" in out
    assert "transforms: pipeline_transforms:drop_short (sha256 " in out
    short = next(k for k, r in records.items() if "/prose/" in k[0] and t.drop_short(r) is None)
    assert main(["where", job, "--source", "prose", "--file", short[0], "--row", str(short[1]), "--steps", "1-2"]) == 1
    assert "dropped by its transforms (pipeline_transforms:drop_short)" in capsys.readouterr().out


def test_a_transform_a_worker_cannot_import_is_one_line_naming_the_worker(scored, tokenizer_dir, tmp_path, monkeypatch):
    from zephon_titan.engine import open_lane_group

    (tmp_path / "only_here.py").write_text(
        "import multiprocessing\n"
        "if multiprocessing.current_process().name != 'MainProcess':\n"
        '    raise ImportError("importable only in the trainer\'s process")\n'
        "def clean(record):\n    return record['text']\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = _spec(scored, tokenizer_dir, ["only_here:clean"], exhaustion="repeat")
    with pytest.raises(ConfigError) as e:
        with open_lane_group(spec, range(4), 1, num_workers=2) as workers:
            workers.next_step()
    message = str(e.value)
    assert "transform 'only_here:clean': cannot import 'only_here' (ImportError: importable only" in message
    assert "(in loader worker " in message and "\n" not in message


def test_inspect_shows_the_text_after_the_transforms(scored, tokenizer_dir, tmp_path, capsys):
    import json

    from helpers import write_job

    from zephon_titan.cli import main

    records = scored_records(scored)
    for transform, tagged in (["pipeline_transforms:tag_language"], True), ([], False):  # and the control
        job = write_job(tmp_path / "job.toml", scored, tokenizer_dir, source=f"transform = {json.dumps(transform)}")
        assert main(["inspect", job, "--step", "1", "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)
        starts = [p for row in rows for p in row["pieces"] if p["doc_tokens"][0] == 0]
        assert starts
        for p in starts:
            row = p["row"] if "row" in p else p["byte_offset"]  # a JSONL document is named by its line's byte offset
            lang = records[(p["file"], row)].get("lang") or "xx"
            assert p["text"].replace("<|bos|>", "", 1).startswith(f"[{lang}] ") == tagged, p["text"][:40]


# ---- the batched form ---------------------------------------------------------------------------------------


def test_a_batched_transform_gives_the_rows_of_its_per_record_form(scored, tokenizer_dir):
    """One call per block over the documents a keep lets through: the same rows as the function applied record by
    record, in process and in workers, and after a per-record transform in the same list."""
    from zephon_titan.engine import LaneGroup, fingerprint, open_lane_group

    keep = ("quality >= 0.2", "lang != 'de'")
    per_record = _spec(scored, tokenizer_dir, ["pipeline_transforms:short_words"], keep=keep)
    batched = _spec(scored, tokenizer_dir, ["pipeline_transforms:short_words_batched"], keep=keep)
    rows = [r.to_bytes() for r in epoch_rows(per_record)]
    assert [r.to_bytes() for r in epoch_rows(batched)] == rows
    assert [r.to_bytes() for r in epoch_rows(_spec(scored, tokenizer_dir, [], keep=keep))] != rows  # the control
    chain = ["pipeline_transforms:tag_language", "pipeline_transforms:short_words_batched"]
    mixed = _spec(scored, tokenizer_dir, chain, keep=keep, exhaustion="repeat")
    by_hand = _spec(
        scored, tokenizer_dir, [*chain[:1], "pipeline_transforms:short_words"], keep=keep, exhaustion="repeat"
    )
    group = LaneGroup(by_hand, range(4), 2)
    expected = [row.to_bytes() for _ in range(4) for lane in group.next_step() for row in lane]
    with open_lane_group(mixed, range(4), 2, num_workers=2) as workers:
        assert [row.to_bytes() for _ in range(4) for lane in workers.next_step() for row in lane] == expected
    assert fingerprint(mixed)["transform.code"].endswith(") batched")  # another form is another fingerprint


@pytest.mark.parametrize(
    "reference, error, message",
    [
        ("pipeline_transforms:batch_sized", ConfigError, "among the 16 sample records and "),
        ("pipeline_transforms:one_result", ConfigError, "returned 1 results for 16 sample records"),
    ],
)
def test_a_batched_transform_that_depends_on_its_call_is_refused(scored, tokenizer_dir, reference, error, message):
    with pytest.raises(error, match=r"\[dataloader.sources.code\] batched transform") as e:
        _spec(scored, tokenizer_dir, [reference])
    assert message in str(e.value) and "\n" not in str(e.value)


# ---- a transform changed from a step on ------------------------------------------------------------------------

CHANGE_AT = 3  # the checkpoint's step; the new transform from the next


def _steps(spec, steps, states=None, first=0) -> list[list[bytes]]:
    from zephon_titan.engine import LaneGroup

    group = LaneGroup(spec, range(4), 2, states, first)
    return [[row for lane in group.next_step() for row in lane] for _ in range(steps)]


def _resumed(scored, tokenizer_dir, saved, transform, from_step):
    from zephon_titan.engine import fingerprint
    from zephon_titan.engine.resume import read_state
    from zephon_titan.loader.state import Decoded

    new = _spec(scored, tokenizer_dir, transform, exhaustion="repeat", pipeline_from_step=from_step)
    restored = read_state(Decoded(saved), range(4), fingerprint(new))
    return restored, restored.spec(new)


def test_a_transform_changed_from_the_step_after_the_checkpoint(scored, tokenizer_dir):
    """Saved after step 3 with drop_short, resumed with drop_german from step 4: steps 1-3 are the first run's,
    steps 4.. equal an uninterrupted run of both eras (the open documents drawn before the change end as drawn,
    less those the new transform drops) and hold no German document; the first run's steps 4.. hold some."""
    from helpers import engine_checkpoint

    from zephon_titan.engine import LaneGroup, open_lane_group

    old = _spec(scored, tokenizer_dir, ["pipeline_transforms:drop_short"], exhaustion="repeat")
    saved = engine_checkpoint(old, CHANGE_AT)
    restored, resumed = _resumed(scored, tokenizer_dir, saved, ["pipeline_transforms:drop_german"], CHANGE_AT + 1)
    assert restored.mixture_change == f"the pipelines of code, prose change from step {CHANGE_AT + 1}"
    first = _steps(old, CHANGE_AT + 4)
    group = LaneGroup(old, range(4), 2)
    for _ in range(CHANGE_AT):
        group.next_step()
    after = _steps(resumed, 4, group.state(), CHANGE_AT)
    whole = _steps(resumed, CHANGE_AT + 4)  # the uninterrupted run of both eras
    assert [[r.to_bytes() for r in s] for s in whole[:CHANGE_AT]] == [
        [r.to_bytes() for r in s] for s in first[:CHANGE_AT]
    ]
    assert [[r.to_bytes() for r in s] for s in after] == [[r.to_bytes() for r in s] for s in whole[CHANGE_AT:]]
    assert [[r.documents for r in s] for s in after] == [[r.documents for r in s] for s in whole[CHANGE_AT:]]
    records = scored_records(scored)

    def german(steps) -> int:
        return sum(records[(p.file, p.row)]["lang"] == "de" for step in steps for row in step for p in row.pieces)

    assert german(after) == 0 and german(first[CHANGE_AT:]) > 0
    # Worker processes import both eras' transforms and restore the same rows.
    with open_lane_group(resumed, range(4), 2, num_workers=2, states=group.state(), first_step=CHANGE_AT) as workers:
        got = [[row.to_bytes() for lane in workers.next_step() for row in lane] for _ in range(4)]
    assert got == [[r.to_bytes() for r in s] for s in after]


def test_a_transform_change_is_refused_where_the_steps_before_could_not_be_replayed(
    scored, tokenizer_dir, tmp_path, monkeypatch
):
    from helpers import engine_checkpoint

    from zephon_titan.errors import ResumeError

    old = _spec(scored, tokenizer_dir, ["pipeline_transforms:drop_short"], exhaustion="repeat")
    saved = engine_checkpoint(old, CHANGE_AT)
    for from_step in (1, CHANGE_AT):  # at or before the checkpoint's step: those steps are trained already
        with pytest.raises(
            ResumeError, match=r"keep, repeat, transform or chat template of source code, prose changed, .* = 4"
        ):
            _resumed(scored, tokenizer_dir, saved, ["pipeline_transforms:drop_german"], from_step)
    # The old function's code changed under its name: the documents drawn before the change cannot be drawn again.
    monkeypatch.syspath_prepend(str(tmp_path))
    v2 = "\ndef clean_v2(record):\n    return record['text'].lower()\n"
    (tmp_path / "my_cleanup.py").write_text("def clean(record):\n    return record['text']\n" + v2)
    sys.modules.pop("my_cleanup", None)
    saved = engine_checkpoint(_spec(scored, tokenizer_dir, ["my_cleanup:clean"], exhaustion="repeat"), CHANGE_AT)
    (tmp_path / "my_cleanup.py").write_text("def clean(record):\n    return record['text'].strip()\n" + v2)
    sys.modules.pop("my_cleanup", None)
    importlib.invalidate_caches()
    with pytest.raises(ResumeError, match=r"were made by my_cleanup:clean \(sha256 \w+\), but this code has") as e:
        _resumed(scored, tokenizer_dir, saved, ["my_cleanup:clean_v2"], CHANGE_AT + 1)
    assert "keep that code importable unchanged" in str(e.value) and "\n" not in str(e.value)
    # A checkpoint never chooses code: its old transform is looked up only in a module the job's transforms name.
    with pytest.raises(ResumeError, match=r"my_cleanup:clean is not in a module this job's transforms name"):
        _resumed(scored, tokenizer_dir, saved, ["pipeline_transforms:drop_german"], CHANGE_AT + 1)
    # The control: the old code back, the change from the next step is taken.
    (tmp_path / "my_cleanup.py").write_text("def clean(record):\n    return record['text']\n" + v2)
    sys.modules.pop("my_cleanup", None)
    importlib.invalidate_caches()
    restored, _ = _resumed(scored, tokenizer_dir, saved, ["my_cleanup:clean_v2"], CHANGE_AT + 1)
    assert restored.mixture_change.endswith(f"change from step {CHANGE_AT + 1}")
