"""TorchTitan's override entry: this loader in a stock TorchTitan recipe (or your own), the recipe kept.

    torchrun --nproc_per_node 8 -m torchtitan.train --module llama3 --config llama3_8b \\
        --training.global_batch_size 512 \\
        --override.imports 'zephon_titan.titan.override.dataloader={"job": "data.toml"}' \\
            zephon_titan.titan.override.checkpoint 'zephon_titan.titan.override.validator={"job": "data.toml"}'

Three `@override` factories replace nodes of the recipe's config tree (TorchTitan's config/override.py):
- `dataloader` becomes ZephonDataLoader, its settings the `[dataloader]` table of `job` (a zephon job file,
  or a file holding that table alone);
- `checkpoint` (required with it: the loader refuses to start without) becomes ZephonCheckpointManager with the recipe's settings: the loader state is loaded through
  the resume checks (no checkpoint byte runs code, the state bound to the trainer's step), the global batch
  size is checked against training.global_batch_size before step 1, and each step's ledger line is written
  beside the checkpoints, as under zephon_titan.train;
- `validator` (optional) becomes ZephonValidator over the job's eval set: its `[validator.dataloader]` table, else
  the held-out part (`eval_fraction`) of its `[dataloader]` sources, as zephon_titan.train reads the job. The
  whole `validator` node is replaced, not only `validator.dataloader` (a BaseDataLoader.Config there): TorchTitan's
  Validator would count `steps` in microbatches of one rank (another eval set on another GPU count) and has no
  eval set SHA-256 or loss per source. The recipe's (and command line's) `enable` and `freq` are kept unless the
  job's `[validator]` table sets them; `steps` is the job's (eval steps of the eval set's global batch; default
  -1, the whole set once). Each validation logs the eval set's SHA-256 (`zephon-titan plan JOB --validation`
  predicts it) and, with the `checkpoint` entry, is appended to validation.jsonl beside the ledger. A job without
  an eval set, or validation left off, is refused in one line.

TorchTitan does not tell a loader the global batch size, and an override sees only the node it replaces: the
loader takes it from the `global_batch_size` argument or the job file's `[training]` table, and the
checkpoint manager refuses a run whose trainer disagrees (titan/trainer.py, `check_global_batch`); the eval set
takes its own (`[validator.dataloader] global_batch_size`), else the same.
What a job file adds on top (zephon_titan.train): the whole-job preflight in seconds, the loss and
tokens of each source in the metrics.
"""

from __future__ import annotations

from typing import Any

from torchtitan.components.checkpointer import CheckpointManager
from torchtitan.components.dataloader import BaseDataLoader
from torchtitan.components.validate import Validator
from torchtitan.config import override

from zephon_titan.config import short_repr
from zephon_titan.errors import ConfigError
from zephon_titan.titan.dataloader import ZephonDataLoader, loader_config
from zephon_titan.titan.job import validator_config
from zephon_titan.titan.trainer import ZephonCheckpointManager
from zephon_titan.titan.validator import ZephonValidator
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


@override(
    target=Validator.Config,
    fqns=["validator"],
    description="zephon_titan: the eval set of a job file, the same rows on every GPU count, with its SHA-256",
)
def validator(config: Validator.Config, *, job: str, global_batch_size: int | None = None) -> Any:
    """The recipe's validator as ZephonValidator over `job`'s eval set (the module's docstring says what is kept)."""
    where = f"{ENTRY}.validator job={job!r}"
    document = load_toml(job)
    loader = _loader_table(document, where, job)
    table = document.get("validator", {})
    eval_table = table.get("dataloader", {}) if isinstance(table, dict) else {}
    if not any(s.eval_fraction > 0 for s in loader.data.sources) and not (
        isinstance(eval_table, dict) and "sources" in eval_table
    ):
        raise ConfigError(
            f"{where}: the job has no eval set; set eval_fraction on a [dataloader.sources.<name>] (documents held "
            "out of training) or add [validator.dataloader.sources.<name>] tables with eval files"
        )
    out: ZephonValidator.Config = validator_config(table, document["dataloader"], loader.data, config, job)
    if not out.enable:
        raise ConfigError(
            f"{where}: validation is off in the recipe; add --validator.enable (or [validator] enable = true in the "
            "job file)"
        )
    if out.dataloader.global_batch_size <= 0:
        out.dataloader.global_batch_size = _global_batch(document, global_batch_size, where, job, "validator")
    return out


def data_loader_config(job: str, global_batch_size: int | None) -> ZephonDataLoader.Config:
    """ZephonDataLoader's config from `job`'s [dataloader] table, with the global batch size given, else the
    file's [training] global_batch_size."""
    where = f"{ENTRY}.dataloader job={job!r}"
    document = load_toml(job)
    loader = _loader_table(document, where, job)
    loader.global_batch_size = _global_batch(document, global_batch_size, where, job, "dataloader")
    return loader


def _loader_table(document: dict[str, Any], where: str, job: str) -> ZephonDataLoader.Config:
    """The job's [dataloader] table as ZephonDataLoader's config (its global batch size not set)."""
    if "dataloader" not in document:
        raise ConfigError(f"{where}: the file has no [dataloader] table (the loader's sources and settings)")
    try:
        return loader_config(document["dataloader"])
    except ConfigError as e:
        raise ConfigError(f"{job}: {e}") from None


def _global_batch(document: dict[str, Any], given: int | None, where: str, job: str, entry: str) -> int:
    """Rows per optimizer step: `given` (the entry's argument), else the file's [training] global_batch_size."""
    if given is None:
        training = document.get("training", {})
        given = training.get("global_batch_size") if isinstance(training, dict) else None
    if isinstance(given, bool) or not isinstance(given, int) or given <= 0:
        raise ConfigError(
            f"{where}: the loader needs the global batch size (rows per optimizer step), got "
            f"{short_repr(given)}; give it as the entry's argument "
            f'(\'{ENTRY}.{entry}={{"job": "{job}", "global_batch_size": 512}}\') or as [training] '
            "global_batch_size in the file, equal to --training.global_batch_size"
        )
    return given
