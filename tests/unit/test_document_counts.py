"""What happened to each source's documents, counted per row (engine/document_counts.py), against a reference.

The reference reads the fixture's records itself and decides each document's fate in plain Python (the keep by
hand, the repeat's copies by splitmix64, the transform called directly); a pass of the loader must count exactly
that. Per step the counts are the same for any layout, worker count and restore, and in the ledger `plan` writes
and `verify` compares. Negative controls: another threshold counts otherwise; a changed count fails `verify`.
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest
from helpers import reference_copies, scored_records, scored_table, write_job
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zephon_titan.engine import LaneGroup, open_lane_group
from zephon_titan.engine.document_counts import COUNTS, PER_SOURCE, by_source, document_metrics, documents_line
from zephon_titan.engine.rows import step_tally
from zephon_titan.engine.stream import LaneStream
from zephon_titan.testing import drain, spec_from_table

NAMES = ("code", "prose")
STEPS = 24  # long enough that lanes reach their windows' second copies


def _reference(scored: str, t: float, repeat: float, seed: int, transform) -> dict[str, Counter]:
    """Per source, the counts of one pass decided apart from the engine: keep `quality >= t`, `repeat` copies."""
    out = {name: Counter({count: 0 for count in COUNTS}) for name in NAMES}
    for (file, row), record in scored_records(scored).items():
        name = "code" if "/code/" in file else "prose"
        counts = out[name]
        counts["read"] += 1
        if record["quality"] is None or record["quality"] < t:
            counts["dropped_by_keep"] += 1
            continue
        copies = reference_copies(repeat, seed, name, file, row)
        if not copies:
            counts["dropped_by_repeat"] += 1
        elif transform is not None and transform(record) is None:
            counts["dropped_by_transform"] += 1
        else:
            counts["repeated"] += copies - 1
    return out


def _lane_counts(spec, lane: int) -> tuple[list[int], list[int]]:
    """A finite lane drained: the sum of its rows' counts, and everything its feed counted (the rows' and what it
    dropped after its last row, which no row follows)."""
    stream = LaneStream(spec, lane)
    rows = drain(stream)
    summed = [sum(column) for column in zip(*(row.documents for row in rows))] or [0] * len(stream.feed.counted)
    return summed, list(stream.feed.counted)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    t=st.floats(0.05, 0.95),
    repeat=st.sampled_from([0.4, 1.0, 1.6, 2.5]),
    seed=st.integers(0, 2**32),
    packing=st.sampled_from(["wrap", "best_fit"]),
    transform=st.sampled_from(["", "drop_short"]),
)
def test_a_pass_counts_each_document_by_its_fate(scored, tokenizer_dir, t, repeat, seed, packing, transform):
    import pipeline_transforms

    keep = f"quality >= {t}"
    table = scored_table(scored, tokenizer_dir, keep=(keep, keep), repeat=(str(repeat), str(repeat)), seed=seed)
    for source in table["sources"].values():
        source["transform"] = [f"pipeline_transforms:{transform}"] if transform else []
    spec = spec_from_table({**table, "packing": packing, "exhaustion": "redistribute"})
    rows_total, fed_total = [0] * (2 * PER_SOURCE), [0] * (2 * PER_SOURCE)
    for lane in range(spec.num_lanes):
        summed, fed = _lane_counts(spec, lane)
        rows_total = [a + b for a, b in zip(rows_total, summed)]
        fed_total = [a + b for a, b in zip(fed_total, fed)]
        tail = by_source([f - s for f, s in zip(fed, summed)], NAMES)
        for name, counts in tail.items():  # after the last row: only documents dropped, each read once
            dropped = sum(n for count, n in counts.items() if count.startswith("dropped") or count == "excluded")
            assert counts["read"] == dropped and counts["repeated"] == 0, (lane, name, counts)
    expected = _reference(scored, t, repeat, seed, getattr(pipeline_transforms, transform) if transform else None)
    assert by_source(fed_total, NAMES) == {name: dict(c) for name, c in expected.items()}


def _steps(spec, groups: list[list[int]], steps: int, **kw) -> list[list[int]]:
    """Per step, the documents' counts of every lane, the lanes stepped in `groups` (as ranks would)."""
    made = [LaneGroup(spec, lanes, 2, **kw) for lanes in groups]
    out = []
    for _ in range(steps):
        tallies = [step_tally((row for rows in g.next_step() for row in rows), 2)[3:] for g in made]
        out.append([sum(column) for column in zip(*tallies)])
    return out


@pytest.mark.parametrize("packing", ["wrap", "best_fit"])
def test_each_step_counts_the_same_for_any_layout_worker_count_and_restore(scored, tokenizer_dir, packing):
    table = scored_table(
        scored,
        tokenizer_dir,
        keep=("quality >= 0.3", "lang != 'de'"),
        repeat=("1.5", "min(meta.score, 2.5)"),
        packing=packing,
    )
    spec = spec_from_table(table)
    one = _steps(spec, [[0, 1, 2, 3]], STEPS)
    assert _steps(spec, [[0, 2], [1, 3]], STEPS) == one
    assert _steps(spec, [[0], [1], [2], [3]], STEPS) == one
    totals = by_source([sum(column) for column in zip(*one)], NAMES)
    assert totals["code"]["dropped_by_keep"] and totals["prose"]["dropped_by_keep"]  # the check can fail
    assert totals["prose"]["repeated"] and totals["prose"]["dropped_by_repeat"]
    with open_lane_group(spec, range(4), 2, num_workers=2) as workers:
        got = [step_tally((row for rows in workers.next_step() for row in rows), 2)[3:] for _ in range(STEPS)]
    assert got == one
    group = LaneGroup(spec, range(4), 2)
    for _ in range(3):
        group.next_step()
    assert _steps(spec, [[0, 1, 2, 3]], STEPS - 3, states=group.state(), first_step=3) == one[3:]
    stricter = {
        **table,
        "sources": {name: {**source, "keep": "quality >= 0.8"} for name, source in table["sources"].items()},
    }
    assert _steps(spec_from_table(stricter), [[0, 1, 2, 3]], STEPS) != one  # the control: another threshold


def test_an_exclusion_is_counted_from_its_step(scored, tokenizer_dir, tmp_path):
    records = sorted(scored_records(scored))
    listed = [
        f"{'code' if '/code/' in file else 'prose'}\t{os.path.basename(file)}\t{row}" for file, row in records[::3]
    ]
    (tmp_path / "exclude.txt").write_text("\n".join(listed) + "\n")
    table = {**scored_table(scored, tokenizer_dir), "exclude": str(tmp_path / "exclude.txt"), "exclude_from_step": 3}
    spec = spec_from_table(table)
    assert spec.counts_documents
    steps = _steps(spec, [[0, 1, 2, 3]], STEPS)
    excluded = [
        by_source(step, NAMES)["prose"]["excluded"] + by_source(step, NAMES)["code"]["excluded"] for step in steps
    ]
    assert excluded[:2] == [0, 0] and sum(excluded[2:]) > 0
    assert _steps(spec, [[0, 2], [1, 3]], STEPS) == steps


def test_plan_writes_the_counts_and_verify_compares_them(scored, tokenizer_dir, tmp_path, capsys):
    from zephon_titan.cli import main

    job = write_job(tmp_path / "job.toml", scored, tokenizer_dir, source='keep = "quality >= 0.4"\nrepeat = "1.5"')
    plain = write_job(tmp_path / "plain.toml", scored, tokenizer_dir)
    assert main(["plan", job, "--steps", "4", "--output", str(tmp_path / "a.jsonl")]) == 0
    assert main(["plan", plain, "--steps", "2", "--output", str(tmp_path / "plain.jsonl")]) == 0
    lines = [json.loads(line) for line in open(tmp_path / "a.jsonl")]
    assert all(set(line["documents"]) == {"code", "prose"} for line in lines)
    assert sum(line["documents"]["prose"]["dropped_by_keep"] for line in lines) > 0
    assert all("documents" not in json.loads(line) for line in open(tmp_path / "plain.jsonl"))  # its form kept

    changed = [dict(line) for line in lines]
    changed[2] = {**changed[2], "documents": {**changed[2]["documents"], "prose": {**changed[2]["documents"]["prose"]}}}
    changed[2]["documents"]["prose"]["read"] += 1
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(line, sort_keys=True) + "\n" for line in changed))
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]) == 1
    assert "first difference at step 3 (documents)" in capsys.readouterr().out
    older = [{k: v for k, v in line.items() if k != "documents"} for line in lines]  # a ledger from before counts
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(line, sort_keys=True) + "\n" for line in older))
    assert main(["verify", str(tmp_path / "a.jsonl"), str(tmp_path / "c.jsonl")]) == 0


def test_a_ledger_entry_with_bad_counts_is_refused(tmp_path):
    from zephon_titan.engine.ledger import read_ledger

    line = {"step": 1, "sha256": "0" * 64, "rows": 2, "tokens": {"web": 10}, "padding": 0}
    for documents in ({"web": {"read": 1}}, {"web": dict.fromkeys(COUNTS, 1.5)}, {"web": 3}):
        (tmp_path / "l.jsonl").write_text(json.dumps({**line, "documents": documents}) + "\n")
        with pytest.raises(Exception, match="documents of 'web' must map read, repeated"):
            read_ledger(str(tmp_path / "l.jsonl"))
    (tmp_path / "l.jsonl").write_text(json.dumps({**line, "documents": {"web": dict.fromkeys(COUNTS, 2)}}) + "\n")
    assert read_ledger(str(tmp_path / "l.jsonl"))[0].documents == {"web": dict.fromkeys(COUNTS, 2)}


def test_metrics_and_the_log_line():
    code, prose = [0] * PER_SOURCE, [0] * PER_SOURCE
    code[:3], prose[0] = [7, 1, 2], 5
    counts = code + prose
    assert document_metrics(NAMES, counts, False) == {"zephon/documents/code/read": 7, "zephon/documents/prose/read": 5}
    every = document_metrics(NAMES, counts, True)
    assert every["zephon/documents/code/dropped_by_keep"] == 2 and len(every) == 2 * PER_SOURCE
    assert documents_line(NAMES, counts) == "code read 7 (repeated 1, dropped by keep 2); prose read 5"
