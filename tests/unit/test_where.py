"""`zephon-titan where`: every piece of a document, found by the plan's simulation, is where `inspect` shows it."""

import json
import os
import shutil

import pyarrow.parquet as pq
import pytest
from helpers import write_job

from zephon_titan.cli import main
from zephon_titan.errors import ZephonError
from zephon_titan.where import where

STEPS = 20


@pytest.fixture(scope="module")
def job_path(tmp_path_factory, corpus_dir, tokenizer_dir):
    return write_job(tmp_path_factory.mktemp("where") / "job.toml", corpus_dir, tokenizer_dir)


@pytest.fixture(scope="module")
def code_report(job_path):
    """Every code document's pieces in steps 1-20 (--match "": every document of the source), one simulation."""
    return where(job_path, "code", match="", steps=(1, STEPS)).to_json()["documents"]


@pytest.fixture(scope="module")
def document(code_report) -> dict:
    """The code document whose pieces spread over the most lanes in steps 1-20 (a later epoch reads its block in
    another lane)."""
    return max(code_report, key=lambda d: (len({p["lane"] for p in d["placements"]}), len(d["placements"])))


def _where(capsys, *argv) -> tuple[int, dict]:
    status = main(["where", *argv, "--json"])
    return status, json.loads(capsys.readouterr().out)


def _inspected(capsys, job_path, step) -> list[tuple]:
    """(file, row, batch_row, lane, lane_row, row_tokens, doc_tokens) of every code piece inspect shows at `step`."""
    assert main(["inspect", job_path, "--step", str(step), "--json"]) == 0
    return sorted(
        (p["file"], p["row"], r["batch_row"], r["lane"], r["lane_row"], p["row_tokens"], p["doc_tokens"])
        for r in json.loads(capsys.readouterr().out)
        for p in r["pieces"]
        if p["source"] == "code"
    )


def test_where_finds_every_piece_inspect_shows(job_path, code_report, document, capsys):
    placements = document["placements"]
    assert len({p["lane"] for p in placements}) >= 2 and len({p["step"] for p in placements}) >= 3, placements
    found: dict = {}
    for d in code_report:
        for p in d["placements"]:
            found.setdefault(p["step"], []).append(
                (d["file"], d["row"], p["batch_row"], p["lane"], p["lane_row"], p["row_tokens"], p["doc_tokens"])
            )
    steps = sorted({p["step"] for p in placements})
    absent = next(s for s in range(1, STEPS + 1) if s not in steps)
    # A sample: the document's first step, its last (in another lane), and a step without it; every code piece
    for step in (steps[0], steps[-1], absent):
        assert sorted(found[step]) == _inspected(capsys, job_path, step), step
    assert [p for p in placements if p["step"] == absent] == []


def test_where_by_text(job_path, document, capsys):
    text = pq.read_table(document["file"]).column("text")[document["row"]].as_py()
    needle = text[len(text) // 2 : len(text) // 2 + 40]
    status, by_text = _where(capsys, job_path, "--source", "code", "--match", needle, "--steps", f"1-{STEPS}")
    assert status == 0 and document in by_text["documents"]
    # Several documents: the count line, then each one reached
    assert main(["where", job_path, "--source", "code", "--match", "def ", "--steps", "1-2"]) == 0
    out = capsys.readouterr().out.splitlines()
    count, reached = out[0].removeprefix("source code: ").split(" documents contain 'def '; ")
    assert int(count) > 1 and reached.endswith(" in steps 1-2")
    assert sum(line.startswith("code: ") for line in out) == int(reached.split()[0]) > 1


def test_by_file_and_row_a_document_out_of_the_steps_and_user_mistakes_are_one_line(job_path, document, capsys):
    file, row = document["file"], document["row"]
    first = min(p["step"] for p in document["placements"])
    status, report = _where(
        capsys, job_path, "--source", "code", "--file", file, "--row", str(row), "--steps", f"1-{first}"
    )
    assert status == 0 and report["documents"][0]["placements"] == [
        p for p in document["placements"] if p["step"] <= first
    ]
    absent = next(s for s in range(1, STEPS + 1) if s not in {p["step"] for p in document["placements"]})
    assert (
        main(
            ["where", job_path, "--source", "code", "--file", file, "--row", str(row), "--steps", f"{absent}-{absent}"]
        )
        == 1
    )
    assert capsys.readouterr().out == f"code: {file} row {row}: in no step of {absent}-{absent}\n"
    assert main(["where", job_path, "--source", "code", "--match", "no such text \x00", "--steps", "1-1"]) == 2
    assert main(["where", job_path, "--source", "web", "--match", "x"]) == 2
    assert main(["where", job_path, "--source", "code", "--file", "nope.parquet", "--row", "0"]) == 2
    assert main(["where", job_path, "--source", "code", "--file", file, "--row", "99999"]) == 2
    assert main(["where", job_path, "--source", "code", "--file", file]) == 2
    huge = job_path.replace("job.toml", "huge.toml")
    with open(huge, "w") as f:
        f.write(open(job_path).read().replace("[training]\n", "[training]\nsteps = 2000000\n"))
    assert main(["where", huge, "--source", "code", "--file", file, "--row", str(row)]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert "give --steps FIRST-LAST" in errors[-1]
    assert len(errors) == 6 and all(e.startswith("zephon-titan: error: ") for e in errors), errors


def test_another_seed_places_the_document_elsewhere(tmp_path, job_path, document, capsys):
    """Negative control: the same document under another seed is at other steps or rows."""
    other = tmp_path / "seed8.toml"
    other.write_text(open(job_path).read().replace("seed = 7", "seed = 8"))
    argv = ["--source", "code", "--file", document["file"], "--row", str(document["row"]), "--steps", f"1-{STEPS}"]
    _, there = _where(capsys, str(other), *argv)
    assert there["documents"][0]["placements"] != document["placements"]


def test_from_a_checkpoint_the_run_goes_on_where_the_plan_said(tmp_path, monkeypatch):
    """From the version-2 checkpoint fixture (step 3): every books document is where the uninterrupted run puts it,
    rows in the lane counted from the run's first row (the checkpoint's lane states)."""
    fixture = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "checkpoint_v2")
    shutil.copytree(fixture, tmp_path / "v2", copy_function=shutil.copy, ignore=shutil.ignore_patterns("*.py", "*.md"))
    monkeypatch.chdir(tmp_path / "v2")
    resumed = where("job.toml", "books", match="", steps=(4, 9), checkpoint="checkpoint/step-3")
    assert resumed.placements == where("job.toml", "books", match="", steps=(4, 9)).placements
    assert resumed.placements and {p.step for p in resumed.placements} <= set(range(4, 10))
    assert min(p.lane_row for p in resumed.placements) >= 3 * 2  # after the 3 steps of 2 rows per lane before it
    with pytest.raises(ZephonError, match="starts at or before the checkpoint's step 3"):
        where("job.toml", "books", match="", steps=(3, 9), checkpoint="checkpoint/step-3")


def test_a_document_held_out_for_validation_is_said_so(tmp_path, corpus_dir, tokenizer_dir, capsys):
    from zephon_titan.engine.split import held_out

    job = write_job(tmp_path / "job.toml", corpus_dir, tokenizer_dir, source="eval_fraction = 0.5")
    file = f"{corpus_dir}/code/part-00000.parquet"
    row = next(r for r in range(8) if held_out(0, file, [r], 0.5)[0])
    assert main(["where", job, "--source", "code", "--file", file, "--row", str(row), "--steps", "1-1"]) == 1
    assert (
        capsys.readouterr().out
        == f"code: {file} row {row}: in no step of 1-1 (held out for validation: eval_fraction)\n"
    )


def test_an_excluded_document_is_in_no_step_from_k_and_validate_counts_the_list(
    tmp_path, corpus_dir, tokenizer_dir, document, capsys
):
    """A document on the `[dataloader] exclude` list from step k: `where` finds its pieces before k only and says
    it is excluded from k (without the list it has pieces from k on: the control); `validate` counts the listed
    documents it found and names those it did not (five, then how many more)."""
    steps = sorted({p["step"] for p in document["placements"]})
    k = steps[len(steps) // 2]
    listed = tmp_path / "exclude.txt"
    missing = [f"code part-00000.parquet {10_000 + i}" for i in range(6)] + ["nosuch part-00000.parquet 1"]
    listed.write_text("\n".join([f"code {os.path.basename(document['file'])} {document['row']}", *missing]) + "\n")
    job = write_job(
        tmp_path / "job.toml", corpus_dir, tokenizer_dir, dataloader=f'exclude = "{listed}"\nexclude_from_step = {k}'
    )
    argv = ["--source", "code", "--file", document["file"], "--row", str(document["row"]), "--steps", f"1-{STEPS}"]
    status, report = _where(capsys, job, *argv)
    (found,) = report["documents"]
    assert status == 0 and found["excluded_from_step"] == k
    assert found["placements"] == [p for p in document["placements"] if p["step"] < k]
    assert any(p["step"] >= k for p in document["placements"])  # control: trained from k without the list
    assert main(["where", job, *argv]) == 0
    assert f"excluded from step {k} ([dataloader] exclude): in no step from it" in capsys.readouterr().out

    assert main(["validate", job, "--no-count"]) == 0
    out = capsys.readouterr().out
    assert f"exclude: {listed}, from step {k} (list sha256 " in out and "1 of 8 listed documents found" in out
    assert "not found: line 2 (code part-00000.parquet 10000: " in out and "has no document at row 10000" in out
    assert out.count("has no document at row") == 5 and out.rstrip().count("and 2 more") == 1
