"""The zephon-titan command line on a small job over the test corpus (no torchrun)."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
from helpers import write_job

from zephon_titan.cli import main
from zephon_titan.engine import LaneStream
from zephon_titan.titan.job import load_job


def _job(tmp_path, corpus_dir, tokenizer_dir, name="job.toml"):
    return write_job(tmp_path / name, corpus_dir, tokenizer_dir)


def test_plan_then_verify_identical(tmp_path, corpus_dir, tokenizer_dir, capsys):
    job = _job(tmp_path, corpus_dir, tokenizer_dir)
    assert main(["plan", job, "--steps", "4", "-o", str(tmp_path / "a.jsonl")]) == 0
    assert main(["plan", job, "--steps", "6", "-o", str(tmp_path / "b.jsonl")]) == 0
    assert main(["verify", str(tmp_path / "a.jsonl"), str(tmp_path / "a.jsonl")]) == 0
    assert "identical: all 4 steps (1-4)" in capsys.readouterr().out
    # A run that stopped early is a difference, unless it is declared a run in progress (--prefix).
    assert main(["verify", str(tmp_path / "b.jsonl"), str(tmp_path / "a.jsonl")]) == 1
    assert "first difference at step 5" in capsys.readouterr().out
    assert main(["verify", str(tmp_path / "b.jsonl"), str(tmp_path / "a.jsonl"), "--prefix"]) == 0
    assert "identical: all 4 steps (1-4)" in capsys.readouterr().out


def test_verify_says_when_only_the_record_differs(tmp_path, corpus_dir, tokenizer_dir, capsys):
    # A scheduled job's ledger records each step's seq_len; the same batches without it differ only in the record.
    job = _job(tmp_path, corpus_dir, tokenizer_dir)
    assert main(["plan", job, "--steps", "3", "-o", str(tmp_path / "a.jsonl")]) == 0
    lines = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    (tmp_path / "b.jsonl").write_text("".join(json.dumps({**e, "seq_len": 64}) + "\n" for e in lines))
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "b.jsonl"), str(tmp_path / "a.jsonl")]) == 1
    out = capsys.readouterr().out.splitlines()
    assert (
        out[0]
        == "first difference at step 1 (seq_len) (the batches are byte-identical: the same SHA-256; only what is recorded differs):"
    )
    assert out[1].endswith("  seq_len 64") and out[2].endswith("  seq_len (not recorded)")
    # Control: a batch that differs is not called identical.
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({**e, "sha256": "0" * 64}) + "\n" for e in lines))
    assert main(["verify", str(tmp_path / "c.jsonl"), str(tmp_path / "a.jsonl")]) == 1
    assert capsys.readouterr().out.splitlines()[0] == "first difference at step 1 (sha256):"


def test_verify_takes_replica_group_ledgers_as_their_union(tmp_path, corpus_dir, tokenizer_dir, capsys):
    """`verify plan ledger.group0.jsonl ledger.group1.jsonl ...`: a torchft run's groups each hold the steps they
    committed (one left out of a step lacks it); their union is the run's ledger."""
    job = _job(tmp_path, corpus_dir, tokenizer_dir)
    assert main(["plan", job, "--steps", "6", "-o", str(tmp_path / "plan.jsonl")]) == 0
    lines = (tmp_path / "plan.jsonl").read_text().splitlines(keepends=True)
    groups = [tmp_path / "ledger.group0.jsonl", tmp_path / "ledger.group1.jsonl"]
    groups[0].write_text("".join(lines[:2] + lines[4:]))  # group 0 healed past steps 3 and 4
    groups[1].write_text("".join(lines[:5]))  # group 1 died after step 5
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "plan.jsonl"), *map(str, groups)]) == 0
    assert "identical: all 6 steps (1-6)" in capsys.readouterr().out
    # Controls: a step no group holds is a difference; two groups that recorded a step differently are one line.
    groups[1].write_text("".join(lines[:2]))
    assert main(["verify", str(tmp_path / "plan.jsonl"), *map(str, groups)]) == 1
    assert "first difference at step 3: " in capsys.readouterr().out
    other = json.loads(lines[1])
    groups[1].write_text(lines[0] + json.dumps({**other, "sha256": "0" * 64}) + "\n")
    assert main(["verify", str(tmp_path / "plan.jsonl"), *map(str, groups)]) == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and "two replica groups recorded step 2 differently" in said[0], said
    assert str(groups[0]) in said[0] and str(groups[1]) in said[0]


def _first_step_with(job_path, file, row, steps=12):
    job = load_job(job_path)
    r = job.check_layout(1)
    first = None
    for lane in range(job.spec.num_lanes):
        for i, produced in enumerate(LaneStream(job.spec, lane).take(steps * r)):
            if any((p.file, p.row) == (file, row) for p in produced.pieces):
                first = i // r + 1 if first is None else min(first, i // r + 1)
                break
    return first


def test_verify_names_the_first_step_after_a_one_token_change(tmp_path, corpus_dir, tokenizer_dir, capsys):
    import shutil

    copy = tmp_path / "corpus"
    shutil.copytree(corpus_dir, copy)
    job = _job(tmp_path, str(copy), tokenizer_dir)
    assert main(["plan", job, "--steps", "12", "-o", str(tmp_path / "before.jsonl")]) == 0
    target = sorted((copy / "code").glob("*.parquet"))[1]
    texts = pq.read_table(target).column("text").to_pylist()
    row = 2
    step = _first_step_with(job, str(target), row)
    assert step is not None and step > 1
    texts[row] = "#" + texts[row]  # a change at the document's start, so in its first piece
    pq.write_table(pa.table({"text": texts}), target, row_group_size=4)
    assert main(["plan", job, "--steps", "12", "-o", str(tmp_path / "after.jsonl")]) == 0
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "before.jsonl"), str(tmp_path / "after.jsonl")]) == 1
    assert f"first difference at step {step} (sha256):" in capsys.readouterr().out


def _source_text(piece):
    if piece["file"].endswith(".parquet"):
        return pq.read_table(piece["file"]).column("text")[piece["row"]].as_py()
    with open(piece["file"], "rb") as f:
        f.seek(piece["byte_offset"])
        return json.loads(f.readline())["text"]


def test_inspect_traces_rows_to_files_and_round_trips_text(tmp_path, corpus_dir, tokenizer_dir, capsys):
    job_path = _job(tmp_path, corpus_dir, tokenizer_dir)
    assert main(["inspect", job_path, "--step", "3", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    job = load_job(job_path)
    assert len(rows) == 16 and [r["batch_row"] for r in rows] == list(range(16))
    for row in rows:
        for piece in row["pieces"]:
            tokens = job.spec.tokenizer.encode([_source_text(piece)])[0]
            start, end = piece["doc_tokens"]
            assert job.spec.tokenizer.decode(tokens[start:end]) == piece["text"]
    assert main(["inspect", job_path, "--step", "3", "--lane", "5"]) == 0
    text = capsys.readouterr().out
    assert "step 3 lane 5 row 4 (row 10 of the global batch)" in text and "document tokens" in text


def test_validate_reports_counts_and_world_sizes(tmp_path, corpus_dir, tokenizer_dir, prose_docs, code_docs, capsys):
    job = _job(tmp_path, corpus_dir, tokenizer_dir)
    assert main(["validate", job, "--world-sizes", "2,4,8"]) == 0
    out = capsys.readouterr().out
    assert f"{len(code_docs)} documents" in out and f"{len(prose_docs)} documents" in out
    assert "seed                   7" in out
    assert main(["validate", job, "--no-count", "--world-sizes", "3,8,16"]) == 1
    out = capsys.readouterr().out
    assert "3 ranks: INVALID (the data-parallel size is 3, which does not divide training.global_batch_size" in out
    assert "8 ranks: ok (2 rows per rank per step, 1 microbatch)" in out
    assert "16 ranks: INVALID (each of the 16 data-parallel ranks takes global_batch_size / 16 = 1 rows" in out


def test_validate_suggests_an_index_for_many_files(tmp_path, corpus_dir, tokenizer_dir, capsys, monkeypatch):
    from zephon_titan.cli import validate

    monkeypatch.setattr(validate, "INDEX_HINT_FILES", 3)  # the test corpus has 3 files per source
    job = _job(tmp_path, corpus_dir, tokenizer_dir)
    assert main(["validate", job, "--no-count"]) == 0
    out = capsys.readouterr().out
    assert "hint: every rank lists these 3 files at startup; set index" in out and "[dataloader.sources.prose]" in out
    with open(job) as f:
        text = f.read().replace("weight = 0.6", f'weight = 0.6\nindex = "{tmp_path}/prose.index.json"')
    with open(job, "w") as f:
        f.write(text)
    assert main(["validate", job, "--no-count"]) == 0
    out = capsys.readouterr().out
    assert f"index {tmp_path}/prose.index.json" in out and "[dataloader.sources.prose]" not in out


def test_user_mistakes_are_one_line_errors(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "missing.toml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("zephon-titan: error: config file") and "Traceback" not in err
    assert main(["verify", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]) == 2
    assert "ledger" in capsys.readouterr().err


def _actions(parser):
    """Every option and argument of a parser and its subcommands, as (command, action)."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from ((f"{name} {c}".strip(), a) for c, a in _actions(sub))
        elif not isinstance(action, argparse._HelpAction):
            yield "", action


def test_every_option_has_help_text():
    import argparse

    from zephon_titan.cli import build_parser
    from zephon_titan.titan import data_run

    for parser in (build_parser(), data_run.build_parser()):
        assert [f"{command}: {action.dest}" for command, action in _actions(parser) if not action.help] == []
    # Negative control: the walk sees an option without help.
    bare = argparse.ArgumentParser()
    bare.add_argument("--x")
    assert [a.dest for _, a in _actions(bare) if not a.help] == ["x"]
