"""Train with TorchTitan from a TOML job config:

    torchrun --nproc_per_node 8 -m zephon_titan.train --job.config_file configs/llama3_1b/16gpu.toml \
        [--training.steps 100 ...]

Command-line overrides (`--section.key value`) apply on top of the file, as in TorchTitan.
The whole job is checked before the trainer is built (batch layout at this world size,
tokenizer, model vocabulary), so a mistake is one line, printed once, before step 1.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable

import torch

from zephon_titan.errors import EXIT_USER_ERROR, ConfigError, ZephonError, report_once
from zephon_titan.titan.job import Job, load_job, without_inapplicable_warnings

CONFIG_FLAG = "--job.config_file"


def parse_args(args: list[str], prepare: Callable | None = None) -> Job:
    """TOML file, then an optional hook (the CPU shims), then command-line overrides."""
    path, rest = None, []
    it = iter(range(len(args)))
    for i in it:
        arg = args[i]
        if arg == CONFIG_FLAG and i + 1 < len(args):
            path = args[i + 1]
            next(it)
        elif arg.startswith(CONFIG_FLAG + "="):
            path = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    if path is None:
        raise ZephonError(f"{CONFIG_FLAG} is required, e.g. {CONFIG_FLAG} configs/debug_cpu.toml")
    return load_job(path, rest, prepare)


def check_resume(job: Job) -> str:
    """The checkpoint a resume will load, checked against the job before the model is built (a changed seed,
    other data, a split change: one line in seconds, not after the model and optimizer are built). The
    loader checks it again when TorchTitan loads it; both use the one resume sequence (loader/state.restore).
    Returns what the run starts from, in words: "a fresh start", or the checkpoint, its step and its ranks."""
    checkpoint = job.checkpoint_to_resume()
    if checkpoint is None:
        return "a fresh start"
    if not os.path.isdir(checkpoint):
        raise ConfigError(
            f"{job.path}: checkpoint {checkpoint} does not exist ([checkpoint] load_step or initial_load_path); "
            "name a step folder that exists, or leave load_step at -1 for the latest"
        )
    from zephon_titan.plan import read_checkpoint

    step = read_checkpoint(checkpoint, job)[0]
    # DCP writes one data file per rank that saved (__<rank>_<n>.distcp).
    ranks = len({name.split("_")[2] for name in os.listdir(checkpoint) if name.endswith(".distcp")})
    saved = f", saved on {ranks} rank{'s' if ranks != 1 else ''}" if ranks else ""
    return f"{checkpoint} (step {step}{saved})"


def run(job: Job) -> None:
    """TorchTitan's training lifecycle (torchtitan.train.main) for a resolved job."""
    job.preflight(int(os.environ.get("WORLD_SIZE", "1")))
    check_resume(job)
    trainer = None
    try:
        with without_inapplicable_warnings(job.config):  # the trainer builds its checkpoint config again
            trainer = job.config.build()
        trainer.train()
    except BaseException:
        if trainer is not None:
            trainer.close()
        raise
    trainer.close()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def main(argv: list[str] | None = None, prepare: Callable | None = None) -> None:
    from torchtitan.tools.logging import init_logger

    from zephon_titan.log_ranks import quiet_other_ranks

    init_logger()
    # TorchTitan's LR schedulers are functions of the step: on a resume its container recomputes each rate with
    # get_lr(), by design, and torch warns on every resume that get_lr() was called outside step().
    warnings.filterwarnings("ignore", message="To get the last learning rate computed by the scheduler")
    quiet_other_ranks()  # our lines once per job (rank 0); other ranks only our warnings and errors
    try:
        run(parse_args(sys.argv[1:] if argv is None else argv, prepare))
    except ZephonError as e:
        # A user mistake: one line, once per job (not once per rank), no traceback.
        report_once(e)
        sys.exit(EXIT_USER_ERROR)


if __name__ == "__main__":
    main()
