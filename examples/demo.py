"""The elastic training demo on bundled offline text (CPU, 2 cores, a few minutes).

1. Builds a corpus from text every Python install has (the standard library's own
   modules as a `code` source in Parquet, the pydoc topics as a `prose` source in
   JSONL) and trains a small BPE tokenizer on it, in ./demo_out.
2. Predicts the batch ledger offline (`zephon_titan.plan`: all lanes in one process).
3. Trains a tiny Llama-3 with TorchTitan's real trainer under torchrun on 2 ranks,
   checkpointing (DCP) every 2 steps.
4. Resumes the step-2 checkpoint on 4 ranks and on 1 rank.
5. Prints every step's global-batch SHA-256 and loss side by side, and exits non-zero
   unless all of them match the prediction.

    python examples/demo.py [--steps 6] [--save-at 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time

import corpus  # examples/: the offline corpora and run folders
from logs import STEP_LINE
from runs import copy_checkpoint

from zephon_titan.config import DataConfig, SourceConfig
from zephon_titan.engine.ledger import read_ledger
from zephon_titan.pictures import shares_svg

DEMO_DIR = "demo_out"
PLOT_STEPS = 200
CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "debug_cpu.toml")


def build_corpus(out: str = DEMO_DIR) -> DataConfig:
    """Write the demo corpus and tokenizer into `out` (once) and describe its sources."""
    prose, code = corpus.prose_documents(), corpus.code_documents(max_files=60, max_bytes=12_000)
    tokenizer = os.path.join(out, "tokenizer")
    if not os.path.exists(os.path.join(tokenizer, "tokenizer.json")):
        corpus.write_jsonl(prose, os.path.join(out, "prose"), num_files=4)
        corpus.write_parquet(code, os.path.join(out, "code"), num_files=3, row_group_size=5)
        corpus.train_tokenizer(prose + code, tokenizer, vocab_size=2000)  # <= llama3 debugmodel's 2048
    return DataConfig(
        sources=[
            SourceConfig(name="code", paths=[os.path.join(out, "code", "*.parquet")], weight=0.3),
            SourceConfig(name="prose", paths=[os.path.join(out, "prose", "*.jsonl")], weight=0.7, block_bytes=32768),
        ],
        num_lanes=8,
        seed=2026,
        tokenizer_path=tokenizer,
    )


class StepProgress:
    """One line per step as a run logs it (every rank logs each step: said once), with the time left."""

    def __init__(self, nproc: int, last_step: int):
        self.nproc, self.last_step = nproc, last_step
        self.first: tuple[int, float] | None = None  # the first step seen, and when
        self.step = 0

    def feed(self, line: str, now: float | None = None) -> str | None:
        """The line to print for one line of the run's log, or None."""
        found = STEP_LINE.search(line)
        if not found or int(found.group(1)) <= self.step:
            return None
        now = time.time() if now is None else now
        self.step, loss = int(found.group(1)), found.group(2)
        if self.first is None:
            self.first = (self.step, now)
        done = self.step - self.first[0]
        left = self.last_step - self.step
        if done == 0:
            eta = ""
        elif left == 0:
            eta = ", then the last checkpoint"
        else:
            eta = f", ~{(now - self.first[1]) / done * left:.0f} s left"
        return f"      step {self.step}/{self.last_step} on {self.nproc} rank{'s' if self.nproc > 1 else ''}: loss {loss}{eta}"


def _train(name: str, nproc: int, steps: int, resume_from: tuple[str, int] | None) -> dict:
    """One torchrun of the CPU trainer; returns {"ledger": {step: sha}, "losses": {step: loss}}."""
    from logs import parse_losses

    run = os.path.join(DEMO_DIR, "runs", name)
    shutil.rmtree(run, ignore_errors=True)
    if resume_from is not None:
        copy_checkpoint(resume_from[0], resume_from[1], run)
    os.makedirs(run, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(nproc),
        "-m",
        "zephon_titan.train_cpu",
        "--job.config_file",
        CONFIG,
        "--dump_folder",
        run,
        "--training.steps",
        str(steps),
        "--metrics.disable_color_printing",
    ]
    log = os.path.join(run, "train.log")
    started = time.time()
    progress = StepProgress(nproc, steps)
    print(f"      starting {nproc} rank{'s' if nproc > 1 else ''} (imports, model, loader{', checkpoint' if resume_from else ''})...", flush=True)  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(log, "w") as f, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True) as child:  # fmt: skip
        assert child.stdout is not None
        for line in child.stdout:  # the run's log as it comes: kept whole in the file, one line per step here
            f.write(line)
            if said := progress.feed(line):
                print(said, flush=True)
    with open(log) as f:
        output = f.read()
    if child.returncode != 0:
        raise SystemExit(f"training run {name!r} failed; see {log}:\n{output[-3000:]}")
    losses = parse_losses(output)
    print(f"      done in {time.time() - started:.0f} s: steps {min(losses)}-{max(losses)}, log {log}", flush=True)
    ledger = {e.step: e.sha256 for e in read_ledger(os.path.join(run, "checkpoint", "ledger.jsonl"))}
    return {"run": run, "ledger": ledger, "losses": losses}


def draw_shares(entries: list) -> None:
    """demo_out/token_shares.svg: each source's share of every planned step and cumulative, against its weight
    (what `zephon-titan plan --plot` draws for any job)."""
    from zephon_titan.plan import mixture_report

    sources = build_corpus().sources
    weight = {s.name: s.weight / sum(x.weight for x in sources) for s in sources}
    weights = [weight[name] for name in entries[0].tokens]  # in the ledger's order of the sources
    mix = mixture_report(entries, weights)
    title = f"demo: token share per source, {len(entries)} planned steps"
    with open(os.path.join(DEMO_DIR, "token_shares.svg"), "w") as f:
        f.write(shares_svg(mix.names, mix.steps, mix.shares, mix.cumulative, [weights] * len(mix.steps), title))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--save-at", type=int, default=2, help="resume the checkpoint of this step (a multiple of 2)")
    p.add_argument("--build-only", action="store_true", help="only write the corpus and tokenizer")
    args = p.parse_args(argv)

    print(f"[1/5] corpus and tokenizer in {DEMO_DIR}/ (Python stdlib as 'code', pydoc topics as 'prose'; the first time ~10 s: a BPE tokenizer is trained)", flush=True)  # fmt: skip
    build_corpus()
    if args.build_only:
        return 0
    from zephon_titan.plan import plan_ledger

    print(f"[2/5] predicting the ledger offline from {os.path.relpath(CONFIG)} (no torchrun)", flush=True)
    planned_entries = list(plan_ledger(CONFIG, max(args.steps, PLOT_STEPS)))
    planned = {e.step: e.sha256 for e in planned_entries[: args.steps]}
    draw_shares(planned_entries[:PLOT_STEPS])
    print(f"      per-source token shares over {PLOT_STEPS} steps: {DEMO_DIR}/token_shares.svg", flush=True)
    print(f"[3/5] training on 2 ranks, steps 1-{args.steps}, a DCP checkpoint every 2 steps", flush=True)
    runs = {"2 ranks": _train("w2", 2, args.steps, None)}
    print(f"[4/5] resuming the step-{args.save_at} checkpoint on 4 ranks", flush=True)
    runs["resumed on 4"] = _train("w2_to_w4", 4, args.steps, (runs["2 ranks"]["run"], args.save_at))
    print(f"[5/5] resuming the step-{args.save_at} checkpoint on 1 rank", flush=True)
    runs["resumed on 1"] = _train("w2_to_w1", 1, args.steps, (runs["2 ranks"]["run"], args.save_at))

    print(f"\n{'step':>4}  {'global batch SHA-256 (planned)':<22}  " + "  ".join(f"{n:<21}" for n in runs))
    ok = True
    for step in range(1, args.steps + 1):
        cells = []
        for run in runs.values():
            if step not in run["losses"]:
                cells.append(f"{'(before resume)':<21}")
                continue
            same = run["ledger"].get(step) == planned[step]
            ok &= same
            cells.append(f"{'same' if same else 'DIFFERENT'} loss {run['losses'][step]:.5f}")
        print(f"{step:>4}  {planned[step][:16]}...        " + "  ".join(f"{c:<21}" for c in cells))
    print(
        "\nevery global batch of every run is SHA-256-identical to the offline plan"
        if ok
        else "\nMISMATCH: some global batches differ"
    )
    return 0 if ok else 1


def finish(code: int) -> None:
    """Exit now. Nothing is left to write or join (the runs are over, every file is closed): the interpreter's
    teardown of torch and TorchTitan would only keep a finished demo silent for seconds after its verdict."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    finish(main())
