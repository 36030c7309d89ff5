"""zephon-titan: look inside a data stream and prove two runs saw the same data, without GPUs.

zephon-titan plan CONFIG.toml --steps N [--from-checkpoint DIR] [-o ledger.jsonl] [--procs N] [--mixture] [--plot F.svg]
zephon-titan plan CONFIG.toml --validation [--json]
zephon-titan verify A.jsonl B.jsonl
zephon-titan inspect CONFIG.toml --step S [--lane L] [--json]
zephon-titan where CONFIG.toml --source S (--file F --row N | --match TEXT) [--steps A-B] [--json]
zephon-titan validate CONFIG.toml [--world-sizes 8,16,32] [--plot F.svg]
zephon-titan run [--nproc N] [--cpu] CONFIG.toml [--section.key value ...]
zephon-titan torchft --groups R --nproc D [--min-replicas N] SCRIPT [ARGS ...]
zephon-titan index CONFIG.toml [--check]
zephon-titan init DATA... --tokenizer DIR [--gpus 8,16] [-o job.toml]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import shlex
import sys

from zephon_titan import ft_launch, launch
from zephon_titan.cli.index import cmd_index
from zephon_titan.cli.ledgers import cmd_plan, cmd_verify
from zephon_titan.cli.trace import cmd_inspect, cmd_where
from zephon_titan.cli.validate import cmd_validate
from zephon_titan.errors import EXIT_USER_ERROR, ZephonError
from zephon_titan.progress import Waiting

# The parser and the dispatch; each command lives in a module of this package and imports what it needs
# when it runs: `verify` and `--help` must not pay for torch and TorchTitan (seconds and ~1 GB), which only
# the commands that resolve a job's tokenizer or model need.


def cmd_init(args) -> int:
    from zephon_titan.init_job import run

    return run(args, shlex.join(["zephon-titan", *args.argv]))


JOB_HELP = "the job TOML (relative paths inside it start from the current directory)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="zephon-titan", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True)
    _add_plan(sub)
    _add_verify(sub)
    _add_inspect(sub)
    _add_where(sub)
    _add_validate(sub)
    launch.add_parser(sub)
    ft_launch.add_parser(sub)
    _add_index(sub)
    _add_init(sub)
    return p


def _add_plan(sub) -> None:
    plan = sub.add_parser("plan", help="write the ledger a run of CONFIG will write")
    plan.add_argument("config", help=JOB_HELP)
    plan.add_argument("--steps", type=_positive, help="last step to plan")
    plan.add_argument(
        "--validation",
        action="store_true",
        help="print the eval set's SHA-256, steps, rows and targets per source, as every validation of the run logs them",
    )
    plan.add_argument(
        "--json", action="store_true", help="with --validation: one JSON line, as validation.jsonl has it"
    )
    plan.add_argument("--from-checkpoint", help="a DCP step-N folder: plan from its step on")
    plan.add_argument("-o", "--output", help="ledger file (default: standard output)")
    plan.add_argument(
        "--procs",
        type=int,
        default=1,
        help="simulate the lanes in this many processes, each a range of them (the same ledger; "
        "default 1: all lanes in this process)",
    )
    plan.add_argument(
        "--mixture",
        action="store_true",
        help="also print each source's share of every planned step (mean, min, max) and cumulative, "
        "against its normalized weight",
    )
    plan.add_argument(
        "--plot",
        metavar="FILE.svg",
        help="also draw each source's share of every planned step and cumulative, against its target weight "
        "(the schedule's per step), as an SVG picture",
    )
    plan.set_defaults(run=cmd_plan)


def _add_verify(sub) -> None:
    verify = sub.add_parser("verify", help="compare two ledgers; exit 1 at the first differing step")
    verify.add_argument("a", help="a ledger (e.g. the plan, or a finished run)")
    verify.add_argument(
        "b",
        nargs="+",
        help="another ledger; several: their union (a torchft run's replica-group ledgers, e.g. ledger.group*.jsonl)",
    )
    verify.add_argument(
        "--prefix",
        action="store_true",
        help="B may end before A (a run still in progress); every step B has must match",
    )
    verify.add_argument(
        "--steps",
        type=_step_range,
        metavar="FIRST-LAST",
        help="compare only these steps (e.g. 5-8: a plan from a step-4 checkpoint)",
    )
    verify.set_defaults(run=cmd_verify)


def _add_inspect(sub) -> None:
    inspect = sub.add_parser("inspect", help="decode the rows of a step and trace them to files")
    inspect.add_argument("config", help=JOB_HELP)
    inspect.add_argument("--step", type=int, required=True, help="the optimizer step to show (from 1)")
    inspect.add_argument("--lane", type=int, help="only this lane (default: every lane of the step)")
    inspect.add_argument("--json", action="store_true", help="machine-readable, full text")
    inspect.add_argument("--full", action="store_true", help="do not shorten texts")
    inspect.add_argument(
        "--from-checkpoint", help="a DCP step-N folder: the step as the run continues from it (e.g. another seq_len)"
    )
    inspect.set_defaults(run=cmd_inspect)


def _add_validate(sub) -> None:
    validate = sub.add_parser("validate", help="check a config and its data, list valid data-parallel sizes")
    validate.add_argument("config", help=JOB_HELP)
    validate.add_argument(
        "--world-sizes",
        type=_int_list,
        default=[],
        metavar="W1,W2,...",
        help="data-parallel sizes to check the batch layout for; exit 1 if one is invalid",
    )
    validate.add_argument("--no-count", action="store_true", help="skip reading every document")
    validate.add_argument(
        "--plot",
        metavar="F.svg",
        help="draw each source's tokens per epoch beside what the run's steps draw from it (an SVG)",
    )
    validate.add_argument(
        "--check-tokenizer",
        action="store_true",
        help="compare the fast tokenizer backend (fastokens) with tokenizers on every document; exit 1 at the "
        "first document whose ids differ, naming its file and row",
    )
    validate.set_defaults(run=cmd_validate)


def _add_index(sub) -> None:
    index = sub.add_parser("index", help="list the files of every source with an `index` and write the index")
    index.add_argument("config", help=JOB_HELP)
    index.add_argument("--check", action="store_true", help="compare the indexes with the files; exit 1 if stale")
    index.set_defaults(run=cmd_index)


def _add_where(sub) -> None:
    where = sub.add_parser("where", help="every step and row where a document's pieces are (or will be) trained")
    where.add_argument("config", help=JOB_HELP)
    where.add_argument("--source", required=True, help="the source's name ([dataloader.sources.NAME])")
    where.add_argument("--file", help="the document's file (its path as the source lists it, or its end)")
    where.add_argument("--row", type=int, help="the document's row in the file: Parquet row number, JSONL byte offset")
    where.add_argument(
        "--match", metavar="TEXT", help="instead of --file/--row: every document whose text contains TEXT"
    )
    where.add_argument(
        "--steps",
        type=_step_range,
        metavar="FIRST-LAST",
        help="the steps to search (default: 1, or the checkpoint's step + 1, to [training] steps)",
    )
    where.add_argument("--from-checkpoint", help="a DCP step-N folder: search the steps after it, as the run continues")
    where.add_argument("--json", action="store_true", help="machine-readable")
    where.set_defaults(run=cmd_where)


def _add_init(sub) -> None:
    init = sub.add_parser("init", help="write a starter job from your data files and tokenizer (then validate it)")
    init.add_argument(
        "data",
        nargs="+",
        metavar="[NAME=]PATH",
        help="a source each: a directory (its Parquet/JSONL files), a file or a quoted glob; NAME= names it",
    )
    init.add_argument("--tokenizer", required=True, help="the directory holding tokenizer.json (hf_assets_path)")
    init.add_argument("-o", "--output", default="my_job.toml", help="the job file to write (default my_job.toml)")
    init.add_argument("--force", action="store_true", help="replace the output file if it exists")
    init.add_argument(
        "--gpus",
        type=_int_list,
        default=[1, 2, 4, 8],
        metavar="N1,N2,...",
        help="the data-parallel sizes (GPU counts, with FSDP) the job must run on (default 1,2,4,8)",
    )
    init.add_argument(
        "--recipe",
        default="llama3:llama3_debugmodel",
        metavar="MODULE:CONFIG",
        help="TorchTitan's --module and --config (default llama3:llama3_debugmodel, a small model to start with)",
    )
    init.add_argument("--flavor", help="the model size within the recipe's model (e.g. 1B)")
    init.add_argument("--seq-len", type=_positive, default=2048, help="tokens per row (default 2048)")
    init.add_argument("--local-batch-size", type=_positive, help="rows per microbatch (default: 8 rows of 2048 tokens)")
    init.add_argument("--global-batch-size", type=_positive, help="rows per step (default: the least that fits --gpus)")
    init.add_argument("--steps", type=_positive, help="training steps (default: about one pass over the data)")
    init.add_argument("--weights", metavar="NAME=W,...", help="each source's weight (default: its share of the tokens)")
    init.add_argument("--seed", type=int, default=1234, help="[dataloader] seed (default 1234)")
    init.set_defaults(run=cmd_init)


def _step_range(text: str) -> tuple[int, int]:
    first, _, last = text.partition("-")
    try:
        return int(first), int(last or first)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected FIRST-LAST (e.g. 5-8), got {text!r}") from None


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return int(text)


def _int_list(text: str) -> list[int]:
    """Counts of ranks or GPUs: whole numbers >= 1 (a 0 divided the batch by zero)."""
    try:
        numbers = [int(x) for x in text.split(",") if x]
    except ValueError:
        numbers = [0]
    if not all(n >= 1 for n in numbers):
        raise argparse.ArgumentTypeError(f"expected numbers >= 1 separated by commas (e.g. 8,16), got {text!r}")
    return numbers


# The commands that may keep a person waiting (reading every file, simulating every lane): what they are doing is
# said on standard error once they take long (progress.py); the others are quick, or say it themselves (run).
SAY_PROGRESS = ("plan", "inspect", "where", "validate")


# Exit status when the reader of standard output went away (`zephon-titan verify A B | head -1`): what a
# shell reports for a command ended by SIGPIPE (128 + 13), as `yes | head -1` does.
EXIT_BROKEN_PIPE = 141


def _stdout_closed() -> bool:
    """Is standard output a pipe whose reader has gone (poll reports an error on its write end)?"""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no poll (not Linux), no file descriptor (a test's capture)
        return False


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv  # the command as typed (init writes it into the job)
    try:
        with Waiting(args.command) if args.command in SAY_PROGRESS else contextlib.nullcontext():
            status = args.run(args)
            sys.stdout.flush()  # a closed pipe is found here, not in the interpreter's exit
        return status
    except BrokenPipeError:
        if not _stdout_closed():
            raise  # another pipe (a loader worker's): not the reader going away
        # Nothing more can be said on standard output, and a traceback helps no one. Point it at /dev/null
        # so that the interpreter's own final flush does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE
    except ZephonError as e:  # one line, as report_once prints it under torchrun (a library's text may hold more)
        print("zephon-titan: error: " + " ".join(str(e).split("\n")), file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return 130
