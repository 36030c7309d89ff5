"""Train with TorchTitan from a TOML job config:

    torchrun --nproc_per_node 8 -m zephon_titan.train --job.config_file configs/llama3_1b.toml \
        [--training.steps 100 ...]

Command-line overrides (`--section.key value`) apply on top of the file, as in TorchTitan.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import torch
import tyro
from torchtitan.config import ConfigManager
from torchtitan.config.manager import custom_registry
from torchtitan.tools.logging import init_logger, logger

from zephon_titan.errors import ZephonError
from zephon_titan.titan.job_config import load_job_config
from zephon_titan.titan.trainer import ZephonTrainer

CONFIG_FLAG = "--job.config_file"


def parse_args(args: list[str], prepare: Callable | None = None) -> ZephonTrainer.Config:
    """TOML file, then an optional hook (the CPU test shims), then command-line overrides."""
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
    config = load_job_config(path)
    if prepare is not None:
        config = prepare(config)
    ConfigManager.register_tyro_rules(custom_registry)
    return tyro.cli(type(config), args=rest, default=config, registry=custom_registry)


def run(config: ZephonTrainer.Config) -> None:
    """TorchTitan's training lifecycle (torchtitan.train.main) for an already parsed config."""
    trainer = None
    try:
        trainer = config.build()
        trainer.train()
    except Exception:
        if trainer is not None:
            trainer.close()
        raise
    trainer.close()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def main(argv: list[str] | None = None, prepare: Callable | None = None) -> None:
    init_logger()
    try:
        run(parse_args(sys.argv[1:] if argv is None else argv, prepare))
    except ZephonError as e:
        # A user mistake: one clear line per rank, no traceback.
        logger.error(f"zephon_titan (rank {os.environ.get('RANK', '0')}): {e}")
        sys.exit(2)


if __name__ == "__main__":
    main()
