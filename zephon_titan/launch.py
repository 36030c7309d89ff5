"""`zephon-titan run`: start a training job with torchrun's own launcher, checked first, rank 0 on the console,
and a failing job ending in one line.

    zephon-titan run --nproc 8 JOB.toml [--training.steps 100 ...]
    zephon-titan run --cpu --nproc 2 configs/debug_cpu.toml

1. The job is resolved and checked here, before any rank starts: the batch layout for nproc x nnodes ranks,
   the tokenizer, the model's vocabulary, and the checkpoint a resume will load (seed, data, split). A
   mistake is one line and nothing is launched. Then one line says what starts: N ranks from a fresh start, or
   from <checkpoint> (step k, saved on W ranks); on a terminal a line says what is checked meanwhile.
2. torchrun's API (torch.distributed.run, the code behind the `torchrun` command) starts the ranks. The
   console shows rank 0 (TorchTitan's own launcher filters ranks the same way); every rank's output is kept
   in files under <dump_folder>/logs. `--quiet`: of rank 0, only the lines a person reads during a run
   (console.py); TorchTitan's other INFO lines stay in the files.
3. A rank that stops on a job error (ours): its one line, printed here once. Any other failure: which rank,
   its exit code, the last line of its error output and the file holding all of it; no launcher traceback.

Plain `torchrun ... -m zephon_titan.train` keeps working; this is the quiet way to run it.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import sys
import time
from typing import Any

from zephon_titan import log_ranks
from zephon_titan.console import Follower
from zephon_titan.errors import EXIT_USER_ERROR, ZephonError

LAUNCHED = "ZEPHON_TITAN_LAUNCHED"
"""Set for the ranks `run` starts: a rank's job error goes to its torchrun error file only; `run` prints it."""
OUR_PREFIX = "zephon_titan: error: "


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="check a job, then train it with torchrun (rank 0 on the console, one line on a job error)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("config", help="the job TOML")
    p.add_argument("overrides", nargs=argparse.REMAINDER, help="--section.key value ... (as TorchTitan takes them)")
    p.add_argument("--nproc", type=int, default=1, help="ranks on this node (torchrun --nproc-per-node)")
    p.add_argument("--nnodes", type=int, default=1, help="nodes (torchrun --nnodes); more than 1 needs --rdzv")
    p.add_argument("--rdzv", default="", help="HOST:PORT of the rendezvous (torchrun --rdzv-endpoint, c10d)")
    p.add_argument("--cpu", action="store_true", help="train on CPU with gloo (zephon_titan.train_cpu)")
    p.add_argument(
        "--quiet",
        action="store_true",
        help="the console shows rank 0's step lines, our lines, checkpoints, warnings and errors; every line stays "
        "in the ranks' logs",
    )
    p.add_argument(
        "--log-ranks",
        default="0",
        help="local ranks shown on the console: 0 (default), 0,3 or all; other than 0: our log lines on every rank",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.nproc < 1 or args.nnodes < 1:
        raise ZephonError(f"--nproc and --nnodes must be at least 1, got {args.nproc} and {args.nnodes}")
    if args.nnodes > 1 and not args.rdzv:
        raise ZephonError("--nnodes > 1 needs --rdzv HOST:PORT (the same on every node)")
    module = "zephon_titan.train_cpu" if args.cpu else "zephon_titan.train"
    job_args = ["--job.config_file", args.config, *args.overrides]
    world_size = args.nproc * args.nnodes
    ranks = f"{world_size} rank{'s' if world_size != 1 else ''}"
    # On a terminal, a line says what is being checked while it is; it gives way to the result (a mistake stays
    # one line). To a pipe, only the result.
    terminal = sys.stdout.isatty()
    if terminal:
        say(f"checking {args.config} for {ranks} (the batch layout, tokenizer, model, a checkpoint to resume)", "")
    started = time.monotonic()
    try:
        log_dir, start = check_job(args, job_args)
    finally:
        if terminal:
            print(CLEAR_LINE, end="", flush=True)
    device = "CPU (gloo)" if args.cpu else "GPU"
    say(
        f"checked {args.config} for {ranks} in {time.monotonic() - started:.0f} s; starting "
        f"{'them' if args.nproc * args.nnodes > 1 else 'it'} on {device} from "
        f"{start}; rank 0's log below, every rank's in {log_dir}"
    )
    return launch(args, module, job_args, log_dir)


CLEAR_LINE = "\r\x1b[2K"


def say(line: str, end: str = "\n") -> None:
    """What `run` does, as it does it (the ranks' own lines follow)."""
    print(f"zephon-titan run: {line}", end=end, flush=True)


def check_job(args: argparse.Namespace, job_args: list[str]) -> tuple[str, str]:
    """The checks every rank would make first, made once here (raises the job's ZephonError); the logs folder and
    what the run starts from (train.check_resume). The job file's first pass (job_file.py) comes before torch and
    TorchTitan are imported."""
    from zephon_titan.job_file import read_job_file

    read_job_file(args.config)
    from zephon_titan import train

    world_size = args.nproc * args.nnodes
    prepare = None
    if args.cpu:
        from zephon_titan.cpu import prepare_cpu_config

        os.environ["WORLD_SIZE"] = str(world_size)  # as each rank sees it (torchrun sets it again there)
        prepare = prepare_cpu_config
    job = train.parse_args(job_args, prepare)
    job.preflight(world_size)
    start = train.check_resume(job)
    return os.path.join(job.config.dump_folder, "logs"), start


def launch(args: argparse.Namespace, module: str, job_args: list[str], log_dir: str) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser
    from torch.distributed.run import run as torchrun

    os.makedirs(log_dir, exist_ok=True)
    launcher = ["--nproc-per-node", str(args.nproc), "--nnodes", str(args.nnodes), "--log-dir", log_dir]
    # Quiet: the ranks' output to the files only, and rank 0's lines that matter followed here (console.py).
    launcher += ["--redirects", "3"] if args.quiet else ["--tee", "3"]
    if args.log_ranks != "all" and not args.quiet:
        launcher += ["--local-ranks-filter", args.log_ranks]
    if args.nnodes > 1:
        launcher += ["--rdzv-backend", "c10d", "--rdzv-endpoint", args.rdzv]
    else:
        launcher += ["--standalone"]
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default for several ranks, without its banner
    os.environ[LAUNCHED] = "1"
    if args.log_ranks != "0":  # other ranks shown: with our lines too (zephon_titan/log_ranks.py)
        os.environ.setdefault(log_ranks.ENV, "all")
    try:
        with Follower(log_dir) if args.quiet else contextlib.nullcontext():
            torchrun(get_args_parser().parse_args([*launcher, "-m", module, *job_args]))
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        print(failure_line(rank, failure.local_rank, failure.exitcode, failure.message, log_dir), file=sys.stderr)
        return EXIT_USER_ERROR if failure.message.startswith(OUR_PREFIX) else 1
    return 0


def failure_line(rank: int, local_rank: int, exitcode: int, message: str, log_dir: str) -> str:
    """One line for a failed job: our error as the rank said it, else what the rank said last and where
    all its output is."""
    if message.startswith(OUR_PREFIX):
        return message
    # torchrun keeps each rank's output in <log_dir>/<run id>/attempt_<n>/<local rank>/: the newest run's.
    logs = glob.glob(os.path.join(glob.escape(log_dir), "*", "attempt_*", str(local_rank), "stderr.log"))
    stderr_log = os.path.abspath(max(logs, key=os.path.getmtime)) if logs else ""
    last = _last_line(stderr_log) if stderr_log else ""
    where = f"; its output: {stderr_log}" if stderr_log else f"; the ranks' output: {os.path.abspath(log_dir)}"
    said = f": {last}" if last else ""
    return f"zephon_titan: rank {rank} failed with exit code {exitcode}{said}{where}"


def _last_line(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""
