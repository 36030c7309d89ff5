"""Documents excluded at a resume on another number of ranks ([dataloader] exclude, engine/exclusion.py), through
torchrun and real DCP: saved on 2 ranks after step 2, resumed on 4 with a list excluded from step 4. Step 3 is the
uninterrupted run's, steps 4-5 are `plan`'s of the new config from the checkpoint (the list's digest in the
ledger from step 4), and no decoded row of steps 4-5 holds an excluded document's text (the uninterrupted run's
do). The same list from step 2 (at the checkpoint's step) is refused in one line before any step."""

from __future__ import annotations

import os
import shutil

import pytest
from conftest import CPU_CONFIG, assert_refused, check, run_each, torchrun

from zephon_titan.engine.ledger import read_ledger

# Slow tier: three torchrun launches of the data path (~15 s each on 2 cores).
pytestmark = [pytest.mark.integration, pytest.mark.slow]
MODULE = "zephon_titan.titan.data_run"
STEPS, SAVED, K = 5, 2, 4


def _config(workdir: str, name: str, extra: str) -> str:
    with open(CPU_CONFIG) as f:
        text = f.read()
    assert "seed = 2026\n" in text
    path = os.path.join(workdir, name)
    with open(path, "w") as f:
        f.write(text.replace("seed = 2026\n", f"seed = 2026\n{extra}"))
    return path


def _run(workdir: str, nproc: int, config: str, ledger: str, *extra: str) -> None:
    args = ["--job.config_file", config, "--steps", str(STEPS), "--local-batch-size", "2", "--ledger", ledger]
    check(torchrun(workdir, MODULE, nproc, [*args, *extra]))


def _decoded_rows(config: str, checkpoint: str | None) -> dict[int, list[str]]:
    """Each planned step's rows decoded to text (from the checkpoint's lane states if given)."""
    from zephon_titan.engine import open_lane_group
    from zephon_titan.engine.lanes import group_steps
    from zephon_titan.plan import read_checkpoint
    from zephon_titan.titan.job import load_job

    job = load_job(config)
    start, states, spec = (0, None, job.spec) if checkpoint is None else read_checkpoint(checkpoint, job)
    group = open_lane_group(spec, range(spec.num_lanes), job.check_layout(1), states=states, first_step=start)
    decode = spec.tokenizer.decode
    return {
        step: [decode([int(t) for t in row.inputs[: len(row.inputs) - row.padding]]) for lane in lanes for row in lane]
        for step, lanes in group_steps(group, start, STEPS)
    }


def _listed_documents(config: str) -> list[tuple[str, str, int, str]]:
    """(source, file, row, snippet) of four documents the run trains at step K or later, each with a piece of
    over 48 tokens in one row: the snippet is 60 characters from the middle of that piece's decoded text (long
    enough to be unambiguous, and what a decoded row shows of the document)."""
    from zephon_titan.engine import open_lane_group
    from zephon_titan.engine.lanes import group_steps
    from zephon_titan.titan.job import load_job

    job = load_job(config)
    spec = job.spec
    group = open_lane_group(spec, range(spec.num_lanes), job.check_layout(1))
    found: dict[tuple[int, str, int], str] = {}
    for step, lanes in group_steps(group, 0, STEPS):
        for row in (row for lane in lanes for row in lane):
            at = 0
            for p in row.pieces:
                text = spec.tokenizer.decode([int(t) for t in row.inputs[at : at + p.length]])
                at += p.length
                if step >= K and p.length > 48 and len(text) > 120 and (p.source, p.file, p.row) not in found:
                    found[(p.source, p.file, p.row)] = text[len(text) // 2 - 30 : len(text) // 2 + 30]
    chosen = sorted(found)[:: max(1, len(found) // 4)][:4]
    return [(spec.source_names[s], f, r, found[(s, f, r)]) for s, f, r in chosen]


def test_an_exclusion_applied_at_a_resume_on_another_number_of_ranks(workdir, monkeypatch):
    from zephon_titan.plan import plan_ledger

    monkeypatch.chdir(workdir)
    data = os.path.join(workdir, "excl")
    os.makedirs(data, exist_ok=True)
    _run(workdir, 2, CPU_CONFIG, "excl/ref.jsonl", "--save-at", str(SAVED), "--checkpoint", "excl/ckpt")
    reference = {e.step: e for e in read_ledger(os.path.join(data, "ref.jsonl"))}
    listed = _listed_documents(CPU_CONFIG)
    assert len(listed) == 4
    with open(os.path.join(data, "list.txt"), "w") as f:
        f.write("# documents to stop training on\n")
        f.writelines(f"{source} {os.path.basename(file)} {row}\n" for source, file, row, _ in listed)
    config = _config(workdir, "excluding.toml", f'exclude = "excl/list.txt"\nexclude_from_step = {K}\n')
    too_early = _config(workdir, "too_early.toml", f'exclude = "excl/list.txt"\nexclude_from_step = {SAVED}\n')
    checkpoint = os.path.join("excl", "ckpt", f"step-{SAVED}")

    shutil.copy(os.path.join(data, "ref.jsonl"), os.path.join(data, "resumed.jsonl"))
    _run(workdir, 4, config, "excl/resumed.jsonl", "--resume", checkpoint)
    resumed = {e.step: e for e in read_ledger(os.path.join(data, "resumed.jsonl"))}
    planned = {e.step: e for e in plan_ledger(config, STEPS, checkpoint)}
    assert sorted(resumed) == list(range(1, STEPS + 1))
    assert [resumed[s] for s in range(1, K)] == [reference[s] for s in range(1, K)]  # steps before K unchanged
    assert all(resumed[s] == planned[s] for s in range(SAVED + 1, STEPS + 1))  # sha256, tokens and digest
    assert all(resumed[s].sha256 != reference[s].sha256 for s in range(K, STEPS + 1))  # the list took effect
    assert [resumed[s].excluded is not None for s in resumed] == [s >= K for s in resumed]

    # No excluded text in a decoded row from step K on; the uninterrupted run's rows hold every one (control).
    rows = _decoded_rows(config, checkpoint)
    before = _decoded_rows(CPU_CONFIG, None)
    snippets = [snippet for *_, snippet in listed]
    assert sorted(rows) == list(range(SAVED + 1, STEPS + 1)) and rows[SAVED + 1] == before[SAVED + 1]
    assert not any(s in row for step in range(K, STEPS + 1) for row in rows[step] for s in snippets)
    assert all(any(s in row for step in range(K, STEPS + 1) for row in before[step]) for s in snippets)

    # The same list from step SAVED: those steps are trained already.
    (outcome,) = run_each(
        workdir,
        "data_run",
        [["--job.config_file", too_early, "--steps", "3", "--local-batch-size", "2", "--resume", checkpoint]],
    )
    assert_refused(outcome, f"[dataloader] exclude_from_step = {SAVED} is at or before the checkpoint's step {SAVED}")
