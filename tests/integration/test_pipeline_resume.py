"""A source's keep and repeat through torchrun and real DCP (engine/pipeline.py): a Parquet source with a quality
column, `keep` and `repeat` set, saved on 2 ranks after step 2 and resumed on 3. Every step equals the
uninterrupted run's and `plan`'s, and no decoded row holds a document the condition drops, while the run without
the condition trains some of them (the control). Then the same checkpoint resumed on 3 ranks with a stricter
threshold from step 3: steps 1-2 stay, steps 3.. are `plan --from-checkpoint`'s with the new pipeline's digest in
the ledger, and no row from step 3 holds a document the new threshold drops; the change at step 2 is refused."""

from __future__ import annotations

import glob
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import CPU_CONFIG, assert_refused, check, run_each, torchrun

from zephon_titan.engine.ledger import read_ledger

# Slow tier: three torchrun launches of the data path (~15 s each on 2 cores).
pytestmark = [pytest.mark.integration, pytest.mark.slow]
MODULE = "zephon_titan.titan.data_run"
STEPS, SAVED = 5, 2


def _quality(i: int) -> float:
    return ((i * 7919) % 1000) / 1000


def _scored_corpus(workdir: str) -> str:
    """The demo's code documents as Parquet with a quality column (4 rows a row group)."""
    out = os.path.join(workdir, "scored")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    texts = [t for path in sorted(glob.glob(os.path.join(workdir, "demo_out", "code", "*.parquet")))
             for t in pq.read_table(path).column("text").to_pylist()]  # fmt: skip
    for f in range(2):
        rows = range(f, len(texts), 2)
        table = pa.table({"text": [texts[i] for i in rows], "quality": [_quality(i) for i in rows]})
        pq.write_table(table, os.path.join(out, f"part-{f}.parquet"), row_group_size=4)
    return out


def _config(workdir: str, name: str, keep: str) -> str:
    with open(CPU_CONFIG) as f:
        text = f.read()
    text = text.replace("global_batch_size = 16", "global_batch_size = 24").replace("num_lanes = 8", "num_lanes = 6")
    text = text.replace('paths = ["demo_out/code/*.parquet"]', f'paths = ["scored/*.parquet"]\n{keep}')
    text = text.replace("block_bytes = 32768", 'block_bytes = 32768\nrepeat = "0.6"')
    path = os.path.join(workdir, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def _decoded_pieces(
    config: str, source: str, checkpoint: str | None = None
) -> tuple[dict[int, list[str]], dict[tuple[str, int], str]]:
    """Each planned step's rows decoded to text (from the checkpoint if given), and the text of each of `source`'s
    pieces by document."""
    from zephon_titan.engine import open_lane_group
    from zephon_titan.engine.lanes import group_steps
    from zephon_titan.plan import read_checkpoint
    from zephon_titan.titan.job import load_job

    job = load_job(config)
    start, states, spec = (0, None, job.spec) if checkpoint is None else read_checkpoint(checkpoint, job)
    group = open_lane_group(spec, range(spec.num_lanes), job.check_layout(1), states=states, first_step=start)
    rows, pieces = {}, {}
    for step, lanes in group_steps(group, start, STEPS):
        rows[step] = []
        for row in (row for lane in lanes for row in lane):
            rows[step].append(spec.tokenizer.decode([int(t) for t in row.inputs[: len(row.inputs) - row.padding]]))
            at = 0
            for p in row.pieces:
                text = spec.tokenizer.decode([int(t) for t in row.inputs[at : at + p.length]])
                at += p.length
                if spec.source_names[p.source] == source and p.length > 48 and len(text) > 120:
                    pieces[(p.file, p.row)] = text[len(text) // 2 - 30 : len(text) // 2 + 30]
    return rows, pieces


def test_keep_and_repeat_resume_on_another_number_of_ranks(workdir, monkeypatch):
    from zephon_titan.plan import plan_ledger

    monkeypatch.chdir(workdir)
    scored = _scored_corpus(workdir)
    config = _config(workdir, "keeping.toml", 'keep = "quality >= 0.5"\nrepeat = "min(quality * 3, 2)"')
    args = ["--job.config_file", config, "--steps", str(STEPS), "--local-batch-size", "4"]
    check(torchrun(workdir, MODULE, 2, [*args, "--ledger", "scored/ref.jsonl", "--save-at", str(SAVED),
                                        "--checkpoint", "scored/ckpt"]))  # fmt: skip
    checkpoint = os.path.join("scored", "ckpt", f"step-{SAVED}")
    shutil.copy(os.path.join(scored, "ref.jsonl"), os.path.join(scored, "resumed.jsonl"))
    check(torchrun(workdir, MODULE, 3, [*args, "--ledger", "scored/resumed.jsonl", "--resume", checkpoint]))
    reference = {e.step: e for e in read_ledger(os.path.join(scored, "ref.jsonl"))}
    resumed = {e.step: e for e in read_ledger(os.path.join(scored, "resumed.jsonl"))}
    planned = {e.step: e for e in plan_ledger(config, STEPS, checkpoint)}
    assert sorted(resumed) == list(range(1, STEPS + 1))
    assert all(resumed[s] == reference[s] for s in resumed)
    assert all(resumed[s] == planned[s] for s in range(SAVED + 1, STEPS + 1))

    # No row holds a document the condition drops; the run without it trains some (the control).
    rows, _ = _decoded_pieces(config, "code")
    _, unfiltered = _decoded_pieces(_config(workdir, "all.toml", ""), "code")
    by_key = {(os.path.basename(f), r): snippet for (f, r), snippet in unfiltered.items()}
    quality = {}
    for f in range(2):
        for r, i in enumerate(
            range(f, 10**6, 2)[: pq.read_metadata(os.path.join(scored, f"part-{f}.parquet")).num_rows]
        ):
            quality[(f"part-{f}.parquet", r)] = _quality(i)
    dropped = [snippet for key, snippet in by_key.items() if quality[key] < 0.5]
    kept = [snippet for key, snippet in by_key.items() if quality[key] >= 0.5]
    assert len(dropped) >= 3 and kept
    text = "\n".join(row for step in rows.values() for row in step)
    assert not any(s in text for s in dropped)
    assert any(s in text for s in kept)

    # A stricter threshold from the step after the checkpoint, on 3 ranks.
    stricter = _config(workdir, "stricter.toml", 'keep = "quality >= 0.75"\nrepeat = "min(quality * 3, 2)"')
    text_of = open(stricter).read().replace("num_lanes = 6", f"num_lanes = 6\npipeline_from_step = {SAVED + 1}")
    with open(stricter, "w") as f:
        f.write(text_of)
    with open(stricter.replace("stricter", "too_early"), "w") as f:
        f.write(text_of.replace(f"pipeline_from_step = {SAVED + 1}", f"pipeline_from_step = {SAVED}"))
    shutil.copy(os.path.join(scored, "ref.jsonl"), os.path.join(scored, "changed.jsonl"))
    check(torchrun(workdir, MODULE, 3, ["--job.config_file", stricter, "--steps", str(STEPS), "--local-batch-size",
                                        "4", "--ledger", "scored/changed.jsonl", "--resume", checkpoint]))  # fmt: skip
    changed = {e.step: e for e in read_ledger(os.path.join(scored, "changed.jsonl"))}
    planned = {e.step: e for e in plan_ledger(stricter, STEPS, checkpoint)}
    assert [changed[s] for s in range(1, SAVED + 1)] == [reference[s] for s in range(1, SAVED + 1)]
    assert all(changed[s] == planned[s] for s in range(SAVED + 1, STEPS + 1))
    assert all(changed[s].sha256 != reference[s].sha256 for s in range(SAVED + 1, STEPS + 1))
    assert [changed[s].pipeline is not None for s in sorted(changed)] == [s > SAVED for s in sorted(changed)]
    after, _ = _decoded_pieces(stricter, "code", checkpoint)
    between = [snippet for key, snippet in by_key.items() if 0.5 <= quality[key] < 0.75]
    assert between and any(s in text for s in between)  # the first threshold trains them (the control)
    later = "\n".join(row for step in after.values() for row in step)
    assert sorted(after) == list(range(SAVED + 1, STEPS + 1))
    assert not any(s in later for s in between + dropped)
    (outcome,) = run_each(
        workdir,
        "data_run",
        [
            [
                "--job.config_file",
                stricter.replace("stricter", "too_early"),
                "--steps",
                "3",
                "--local-batch-size",
                "4",
                "--resume",
                checkpoint,
            ]
        ],  # fmt: skip
        nproc=1,
    )
    assert_refused(outcome, f"set [dataloader] pipeline_from_step = {SAVED + 1} (or later)")
