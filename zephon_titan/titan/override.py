"""TorchTitan's override entry: this loader in a stock TorchTitan recipe (or your own), the recipe kept.

    torchrun --nproc_per_node 8 -m torchtitan.train --module llama3 --config llama3_8b \\
        --training.global_batch_size 512 \\
        --override.imports 'zephon_titan.titan.override.dataloader={"job": "data.toml"}' \
            zephon_titan.titan.override.checkpoint

Two `@override` factories replace two nodes of the recipe's config tree (TorchTitan's config/override.py):
- `dataloader` becomes ZephonDataLoader, its settings the `[dataloader]` table of `job` (a zephon job file,
  or a file holding that table alone);
- `checkpoint` (required with it: the loader refuses to start without) becomes ZephonCheckpointManager with the recipe's settings: the loader state is loaded through
  the resume checks (no checkpoint byte runs code, the state bound to the trainer's step), the global batch
  size is checked against training.global_batch_size before step 1, and each step's ledger line is written
  beside the checkpoints, as under zephon_titan.train.

TorchTitan does not tell a loader the global batch size, and an override sees only the node it replaces: the
loader takes it from the `global_batch_size` argument or the job file's `[training]` table, and the
checkpoint manager refuses a run whose trainer disagrees (titan/trainer.py, `check_global_batch`).
What a job file adds on top (zephon_titan.train): the whole-job preflight in seconds, the loss and
tokens of each source in the metrics, the eval set.
"""

from __future__ import annotations

from typing import Any

from torchtitan.components.checkpointer import CheckpointManager
from torchtitan.components.dataloader import BaseDataLoader
from torchtitan.config import override

from zephon_titan.config import short_repr
from zephon_titan.errors import ConfigError
from zephon_titan.titan.dataloader import ZephonDataLoader, loader_config
from zephon_titan.titan.trainer import ZephonCheckpointManager
from zephon_titan.toml_file import load_toml

ENTRY = "zephon_titan.titan.override"


@override(
    target=BaseDataLoader.Config,
    fqns=["dataloader"],
    description="zephon_titan: the elastic deterministic loader, from a job file's [dataloader] table",
)
def dataloader(config: BaseDataLoader.Config, *, job: str, global_batch_size: int | None = None) -> Any:
    """The recipe's training loader as ZephonDataLoader, from `job`'s [dataloader] table (the recipe's
    loader settings do not apply: the table says what the rows depend on)."""
    loader = data_loader_config(job, global_batch_size)
    loader.checkpointer_required = True  # the loader refuses to start without the checkpoint entry below
    return loader


@override(
    target=CheckpointManager.Config,
    fqns=["checkpoint"],
    description="zephon_titan: the recipe's checkpoint settings, loading and binding the zephon loader's state",
)
def checkpoint(config: CheckpointManager.Config) -> Any:
    """The recipe's checkpoint config as ZephonCheckpointManager's, every setting kept."""
    return config if isinstance(config, ZephonCheckpointManager.Config) else ZephonCheckpointManager.Config.of(config)


def data_loader_config(job: str, global_batch_size: int | None) -> ZephonDataLoader.Config:
    """ZephonDataLoader's config from `job`'s [dataloader] table, with the global batch size given, else the
    file's [training] global_batch_size."""
    where = f"{ENTRY}.dataloader job={job!r}"
    document = load_toml(job)
    if "dataloader" not in document:
        raise ConfigError(f"{where}: the file has no [dataloader] table (the loader's sources and settings)")
    try:
        loader = loader_config(document["dataloader"])
    except ConfigError as e:
        raise ConfigError(f"{job}: {e}") from None
    if global_batch_size is None:
        training = document.get("training", {})
        global_batch_size = training.get("global_batch_size") if isinstance(training, dict) else None
    if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, int) or global_batch_size <= 0:
        raise ConfigError(
            f"{where}: the loader needs the global batch size (rows per optimizer step), got "
            f"{short_repr(global_batch_size)}; give it as the entry's argument "
            f'(\'{ENTRY}.dataloader={{"job": "{job}", "global_batch_size": 512}}\') or as [training] '
            "global_batch_size in the file, equal to --training.global_batch_size"
        )
    loader.global_batch_size = global_batch_size
    return loader
