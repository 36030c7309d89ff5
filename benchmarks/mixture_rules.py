"""How closely each step follows a phased mixture: wrap, and best_fit per window (before issue 29) and per step.

    python examples/demo.py --build-only          # writes demo_out/ (code, prose, tokenizer)
    python benchmarks/mixture_rules.py [--steps 30] [--lanes 30]

The job: 30 lanes, 2 rows of 128 tokens per lane per step, three sources of different document lengths
(`code`: the demo's Parquet files; `prose`: its JSONL; `books`: its prose joined 20 documents at a time) and
three phases: books 0.5 / code 0.2 / prose 0.3 from step 1, books 0 / code 0.5 / prose 0.5 from step 11,
books 0.3 / code 0 / prose 0.7 from step 21. Each case is `plan_ledger` (what the trainer's ledger holds).

Per case: the largest |share - weight| of one step (share: a source's part of the step's tokens, padding left
out; weight: the step's), the largest cumulative |share - weight| at the end of a phase (over that phase's
steps), and the tokens of a source at weight 0 in the first three steps after its phase ended (books in steps
11-13, code in 21-23). Then a source added at a resume after step 5 that rests until step 11: how many of steps
6-10 equal the first plan, with the offsets kept (this release) and with s / S over the new sources (before).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

from zephon_titan.plan import plan_ledger

PHASES = [
    (1, {"books": 0.5, "code": 0.2, "prose": 0.3}),
    (11, {"code": 0.5, "prose": 0.5}),
    (21, {"books": 0.3, "prose": 0.7}),
]
RESTING = [("books", 11), ("code", 21)]  # a source at weight 0 from that step on
CASES = [
    ("wrap", 0, ""),
    *((packing, w, m) for packing, w in [("best_fit", 12), ("best_fit", 256)] for m in ("per_window", "per_step")),
]


def write_job(folder: str, demo: str, steps: int, lanes: int, packing: str, window: int, mixing: str) -> str:
    books = os.path.join(folder, "books.jsonl")
    if not os.path.exists(books):
        texts = []
        for name in sorted(os.listdir(os.path.join(demo, "prose"))):
            with open(os.path.join(demo, "prose", name), encoding="utf-8") as f:
                texts.extend(json.loads(line)["text"] for line in f)
        with open(books, "w", encoding="utf-8") as f:
            for i in range(0, len(texts), 20):
                f.write(json.dumps({"text": "\n\n".join(texts[i : i + 20])}) + "\n")
    phases = "".join(
        f"[[dataloader.phases]]\nstart_step = {start}\nweights = {{ "
        + ", ".join(f"{k} = {v}" for k, v in weights.items())
        + " }\n"
        for start, weights in PHASES
    )
    path = os.path.join(folder, f"{packing}_{window}_{mixing}.toml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(
            f'hf_assets_path = "{demo}/tokenizer"\n[model]\nmodule = "llama3"\nconfig = "llama3_debugmodel"\n'
            f"[training]\nseq_len = 128\nglobal_batch_size = {2 * lanes}\nlocal_batch_size = 2\nsteps = {steps}\n"
            f'[dataloader]\nnum_lanes = {lanes}\nseed = 2026\npacking = "{packing}"\n'
            + (f'best_fit_window_docs = {window}\nbest_fit_mixing = "{mixing}"\n' if window else "")
            + f'[dataloader.sources.books]\npaths = ["{books}"]\n'
            f'[dataloader.sources.code]\npaths = ["{demo}/code/*.parquet"]\n'
            f'[dataloader.sources.prose]\npaths = ["{demo}/prose/*.jsonl"]\nblock_bytes = 32768\n' + phases
        )
    return path


def weights_at(step: int) -> dict[str, float]:
    start_weights = [w for start, w in PHASES if start <= step][-1]
    return {name: start_weights.get(name, 0.0) for name in ("books", "code", "prose")}


def measure(entries: list) -> dict[str, float]:
    per_step, cumulative = 0.0, 0.0
    ends = [start - 1 for start, _ in PHASES[1:]] + [entries[-1].step]
    totals: dict[str, int] = {}
    for e in entries:
        if any(start == e.step for start, _ in PHASES):
            totals = dict.fromkeys(e.tokens, 0)
        total = sum(e.tokens.values())
        weights = weights_at(e.step)
        per_step = max(per_step, *(abs(e.tokens[s] / total - w) for s, w in weights.items()))
        totals = {s: totals[s] + e.tokens[s] for s in totals}
        if e.step in ends:
            grand = sum(totals.values())
            cumulative = max(cumulative, *(abs(totals[s] / grand - w) for s, w in weights.items()))
    by_step = {e.step: e for e in entries}
    resting = max(by_step[step + i].tokens[name] for name, step in RESTING for i in range(3) if step + i in by_step)
    return {"per_step": per_step, "cumulative": cumulative, "resting_tokens": resting}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--demo", default="demo_out")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lanes", type=int, default=30)
    args = parser.parse_args()
    demo = os.path.abspath(args.demo)
    print(
        "| packing | best_fit_mixing | largest per-step error | cumulative at phase ends | weight-0 source, "
        "most tokens in one of its first 3 steps |"
    )
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for packing, window, mixing in CASES:
            job = write_job(folder, demo, args.steps, args.lanes, packing, window, mixing)
            m = measure(list(plan_ledger(job, args.steps)))
            name = f"{packing} (window {window})" if window else packing
            print(
                f"| {name} | {mixing or '-'} | {m['per_step']:.3f} | {m['cumulative']:.4f} | {m['resting_tokens']:.0f} |",
                flush=True,
            )
        print("\n| packing | steps before the added source's weight | equal to the first plan: before | after |")
        print("|---|---|---|---|")
        for packing, window in [("wrap", 0), ("best_fit", 12)]:
            count, kept, moved = added_source(folder, demo, args.lanes, packing, window)
            print(f"| {packing} | {count} | {moved} | {kept} |", flush=True)


def added_source(folder: str, demo: str, lanes: int, packing: str, window: int) -> tuple[int, int, int]:
    """Steps 6-10 of the job resumed after step 5 with a fourth source that rests until step 11: (steps, how many
    equal the first plan with the offsets kept (this release), with s / S over the new sources (before))."""
    from zephon_titan.engine import LaneGroup, batch_digest, lane_digest
    from zephon_titan.titan.job import load_job

    path = write_job(folder, demo, 10, lanes, packing, window, "per_step")
    first = load_job(path).spec
    with open(path, encoding="utf-8") as f:
        text = f.read()
    added_path = path.replace(".toml", "_added.toml")
    anneal = f'[dataloader.sources.anneal]\npaths = ["{demo}/prose/*.jsonl"]\nblock_bytes = 8192\n'
    with open(added_path, "w", encoding="utf-8") as f:  # `anneal` sorts first: every source's index moves
        f.write(
            text.replace("[dataloader.sources.books]", anneal + "[dataloader.sources.books]").replace(
                "weights = { code = 0.5, prose = 0.5 }", "weights = { anneal = 0.5, code = 0.25, prose = 0.25 }"
            )
        )
    added = load_job(added_path).spec

    def steps(spec, count, first_step=0, states=None):
        group = LaneGroup(spec, range(lanes), 2, states, first_step)
        return [batch_digest(lane_digest(rows) for rows in group.next_step()) for _ in range(count)], group

    plan, _ = steps(first, 10)
    _, group = steps(first, 5)
    states = {lane: s.with_sources(first.source_names, added.source_names) for lane, s in group.state().items()}
    kept, _ = steps(added.continuing(first), 5, 5, states)
    moved, _ = steps(added, 5, 5, states)
    return 5, sum(a == b for a, b in zip(kept, plan[5:])), sum(a == b for a, b in zip(moved, plan[5:]))


if __name__ == "__main__":
    main()
