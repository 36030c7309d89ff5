"""The headline at its own scale: save on 16 ranks, resume on 8, 32 and 64, with real torchrun
processes (gloo, data only, no model) and real DCP checkpoints, on one CPU machine.

    python scripts/elastic_scale.py                      # 64 lanes: 16 -> 8, 32, 64 and 16 -> 8 -> 64 -> 32
    python scripts/elastic_scale.py --lanes 8 --global-batch 64 --local-batch 8 --ranks 4 \
        --resume-on 8 --chain 4,2                         # a short variant (~1 min)
    python scripts/elastic_scale.py --lanes 16 --global-batch 96 --local-batch 1 --ranks 16 \
        --resume-on 24,12,32,6,48,96 --chain 16,24,96,6   # any divisor of G: W not dividing L, W > L

Phases: the offline `plan`; an uninterrupted run on --ranks that saves a checkpoint at --save-at;
a resume of that checkpoint on every --resume-on size; a chain of resumes (each saving one step later
for the next); a negative control with another seed. Every phase's ledger is compared step by step
with the uninterrupted run and the plan. Prints a table (phase, ranks, steps, matching steps, wall
time, peak RSS and private memory per rank) and exits 1 unless everything matches and the control
differs from its first step.

Each phase is one torchrun launch of `zephon_titan/titan/data_run.py` with `--start-method fork
--run-path` (torchrun's own options): its ranks are forked from torchrun's process, which has imported
torch already, so the ~270 MB of private pages that importing torch makes in every process (cuBLASLt's
.bss alone is 83 MB) are shared by the 64 ranks instead of paid 64 times. A data rank imports no
trainer and no model code (data_run's docstring). Peak RSS counts every shared page once per rank;
private memory (pages no other process maps) is what each rank adds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "examples"))  # the demo corpus

import demo  # noqa: E402

from zephon_titan.engine.ledger import read_ledger  # noqa: E402
from zephon_titan.plan import plan_ledger  # noqa: E402

_MEMORY = re.compile(r"peak RSS (\d+) MB max per rank, \d+ MB summed; private (\d+) MB max per rank, (\d+) MB summed")
DATA_RUN = os.path.join(REPO, "zephon_titan", "titan", "data_run.py")


def write_job(work: str, args, seed: int) -> str:
    data = os.path.join(work, "demo_out")
    demo.build_corpus(data)
    path = os.path.join(work, f"job_seed{seed}.toml")
    with open(path, "w") as f:
        f.write(f"""hf_assets_path = "{data}/tokenizer"
[model]
module = "llama3"
config = "llama3_debugmodel"
[training]
seq_len = {args.seq_len}
global_batch_size = {args.global_batch}
local_batch_size = {args.local_batch}
[dataloader]
num_lanes = {args.lanes}
seed = {seed}
[dataloader.sources.code]
paths = ["{data}/code/*.parquet"]
weight = 0.3
[dataloader.sources.prose]
paths = ["{data}/prose/*.jsonl"]
weight = 0.7
block_bytes = 32768
""")
    return path


def data_run(
    job: str,
    ranks: int,
    steps: int,
    ledger: str,
    resume: str | None = None,
    save_at: int | None = None,
    checkpoint: str | None = None,
) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(ranks),
        "--start-method",
        "fork",
        "--run-path",
        DATA_RUN,
        "--job.config_file",
        job,
        "--steps",
        str(steps),
        "--ledger",
        ledger,
    ]
    if resume:
        cmd += ["--resume", resume]
    if save_at:
        cmd += ["--save-at", str(save_at), "--checkpoint", checkpoint]
    started = time.time()
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.time() - started
    if out.returncode != 0:
        raise SystemExit(f"{ranks}-rank run failed:\n{(out.stdout + out.stderr)[-4000:]}")
    memory = _MEMORY.search(out.stdout)
    rss_max, private_max, private_sum = (int(x) for x in memory.groups()) if memory else (None, None, None)
    return {
        "wall_s": wall,
        "rss_max_mb": rss_max,
        "private_max_mb": private_max,
        "private_sum_mb": private_sum,
        "ledger": {e.step: e.sha256 for e in read_ledger(ledger)},
    }


def _memory(phase: dict) -> str:
    """The table's two memory cells of a phase."""
    if phase["rss_max_mb"] is None:
        return "— | —"
    return f"{phase['rss_max_mb']} MB | {phase['private_max_mb']} / {phase['private_sum_mb']} MB"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default="elastic_out")
    p.add_argument("--lanes", type=int, default=64)
    p.add_argument("--global-batch", type=int, default=1024)
    p.add_argument("--local-batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--save-at", type=int, default=3)
    p.add_argument("--ranks", type=int, default=16)
    p.add_argument("--resume-on", default="8,32,64")
    p.add_argument("--chain", default="16,8,64,32", help="first size = --ranks; each link saves one step later")
    args = p.parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    work = os.path.abspath(args.work)
    job = write_job(work, args, seed=2026)
    ck = lambda name: os.path.join(work, "ckpt", name)  # noqa: E731
    led = lambda name: os.path.join(work, "ledgers", f"{name}.jsonl")  # noqa: E731
    os.makedirs(os.path.join(work, "ledgers"), exist_ok=True)

    started = time.time()
    planned = {e.step: e.sha256 for e in plan_ledger(job, args.steps)}
    phases = [
        {
            "phase": "plan (offline, 1 process)",
            "ranks": 0,
            "wall_s": time.time() - started,
            "ledger": planned,
            "rss_max_mb": None,
            "private_max_mb": None,
            "private_sum_mb": None,
        }
    ]
    print(f"planned {args.steps} steps; running the uninterrupted {args.ranks}-rank run ...", flush=True)
    reference = data_run(
        job, args.ranks, args.steps, led("uninterrupted"), save_at=args.save_at, checkpoint=ck(f"w{args.ranks}")
    )
    phases.append(
        {"phase": f"{args.ranks} ranks, uninterrupted (saves step {args.save_at})", "ranks": args.ranks, **reference}
    )
    base_ckpt = os.path.join(ck(f"w{args.ranks}"), f"step-{args.save_at}")
    for ranks in [int(x) for x in args.resume_on.split(",") if x]:
        print(f"resuming step {args.save_at} on {ranks} ranks ...", flush=True)
        run = data_run(job, ranks, args.steps, led(f"resume_{ranks}"), resume=base_ckpt)
        phases.append({"phase": f"{args.ranks} -> {ranks}", "ranks": ranks, **run})
    chain = [int(x) for x in args.chain.split(",") if x]
    resume, save = base_ckpt, args.save_at
    for link, ranks in enumerate(chain[1:], start=1):
        print(f"chain {' -> '.join(map(str, chain[: link + 1]))}: {ranks} ranks from step {save} ...", flush=True)
        name = f"chain_{link}_w{ranks}"
        last = link == len(chain) - 1
        run = data_run(
            job,
            ranks,
            args.steps,
            led(name),
            resume=resume,
            save_at=None if last else save + 1,
            checkpoint=None if last else ck(name),
        )
        phases.append(
            {"phase": f"chain {' -> '.join(map(str, chain[: link + 1]))} (from step {save})", "ranks": ranks, **run}
        )
        resume, save = os.path.join(ck(name), f"step-{save + 1}"), save + 1
    print("negative control: another seed ...", flush=True)
    control = data_run(write_job(work, args, seed=2027), args.ranks, args.steps, led("other_seed"))

    ok = True
    print(
        "\n| phase | ranks | steps compared | matching uninterrupted | matching plan | wall time | peak RSS per rank "
        "(max) | private memory per rank (max / sum) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for ph in phases:
        steps = sorted(ph["ledger"])
        vs_ref = sum(ph["ledger"][s] == reference["ledger"].get(s) for s in steps)
        vs_plan = sum(ph["ledger"][s] == planned.get(s) for s in steps)
        ok &= vs_ref == vs_plan == len(steps) and len(steps) > 0
        print(
            f"| {ph['phase']} | {ph['ranks'] or '—'} | {steps[0]}-{steps[-1]} | {vs_ref}/{len(steps)} | "
            f"{vs_plan}/{len(steps)} | {ph['wall_s']:.0f} s | {_memory(ph)} |"
        )
    differing = [s for s in sorted(control["ledger"]) if control["ledger"][s] != reference["ledger"][s]]
    control_ok = differing == sorted(reference["ledger"]) and differing[:1] == [1]
    ok &= control_ok
    print(
        f"| negative control: seed 2027 on {args.ranks} ranks | {args.ranks} | 1-{args.steps} | "
        f"{args.steps - len(differing)}/{args.steps} (differs from step {differing[0] if differing else '—'}) | — | "
        f"{control['wall_s']:.0f} s | {_memory(control)} |"
    )
    print("\nALL MATCH" if ok else "\nMISMATCH")
    with open(os.path.join(work, "summary.json"), "w") as f:
        json.dump({"ok": ok, "phases": [{k: v for k, v in ph.items() if k != "ledger"} for ph in phases]}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
