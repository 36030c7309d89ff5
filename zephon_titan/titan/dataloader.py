"""ZephonDataLoader: TorchTitan 0.3's BaseDataLoader over one DP rank's steps (loader/rank_steps.py).

What is TorchTitan 0.3's here: the nested Config and build() keywords, and the shapes: each microbatch of this
rank's rows of a step (loader/rank_lanes.py cuts them), {"input", "positions"} [B, S] and labels [B, S]. Which rows,
what was consumed and the checkpoint entries are RankSteps'. RankLoader is what ZephonDataLoader and the eval set's
ZephonEvalLoader (titan/validator.py) share: build()'s keywords handed to their loader/ class, its errors in
TorchTitan's words, and those shapes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar

import torch
import tyro
from torchtitan.components.dataloader import BaseDataLoader

from zephon_titan.config import DataConfig
from zephon_titan.engine import LayoutError, Row
from zephon_titan.errors import ConfigError
from zephon_titan.job_file import loader_settings, titan_layout_message
from zephon_titan.loader.rank_lanes import Microbatch
from zephon_titan.loader.rank_steps import RankSteps
from zephon_titan.titan.tokenizer import loader_tokenizer

Batch = tuple[dict[str, torch.Tensor], torch.Tensor]


def titan_batch(microbatch: Microbatch) -> Batch:
    """A microbatch as TorchTitan 0.3's loaders yield it: ({"input", "positions"} [B, S], labels [B, S])."""
    return {"input": microbatch.inputs(), "positions": microbatch.positions()}, microbatch.labels()


class RankLoader(BaseDataLoader):
    """What ZephonDataLoader and ZephonEvalLoader share: TorchTitan's build() keywords handed to their loader/
    class (RankSteps, RankEvalSteps) with the tokenizer (the job's tokenizer_path, else the trainer's), and its
    errors in TorchTitan's words."""

    refused: ClassVar[tuple[type[ConfigError], ...]] = (LayoutError,)
    """The loader/ class's errors given TorchTitan's words (`message`); others pass as they are."""

    @staticmethod
    def message(error: ConfigError) -> str:
        return titan_layout_message(error)

    def _start(
        self,
        core: Any,
        config: Any,
        *,
        dp_world_size: int,
        dp_rank: int,
        tokenizer: Any,
        seq_len: int,
        local_batch_size: int,
        snapshot_every_n_steps: int | None = None,
        **options: Any,
    ) -> None:
        """`core.__init__` (a base class of this loader's) from TorchTitan's build() keywords and `config`'s data
        and global_batch_size, plus the core's own `options`. `snapshot_every_n_steps` is TorchTitan's, for a
        training loader: the state is always exact, no snapshots needed."""
        self.config = config
        data = config.data
        try:
            core.__init__(
                self,
                data,
                global_batch_size=config.global_batch_size,
                dp_world_size=dp_world_size,
                dp_rank=dp_rank,
                local_batch_size=local_batch_size,
                seq_len=seq_len,
                tokenizer=lambda: loader_tokenizer(data, lambda: tokenizer),
                **options,
            )
        except self.refused as e:
            raise ConfigError(self.message(e)) from None


class ZephonDataLoader(RankSteps, RankLoader):
    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        # Flat on the command line (--dataloader.seed) and in the TOML [dataloader] table, as before.
        data: Annotated[DataConfig, tyro.conf.arg(name="")] = field(default_factory=DataConfig)
        """What the rows depend on: sources, lanes, seed, packing, ... (the [dataloader] table)."""

        # Not a user setting: ZephonTrainer copies training.global_batch_size here (one truth).
        global_batch_size: Annotated[int, tyro.conf.Suppress] = -1
        """Rows per optimizer step, copied from training.global_batch_size."""

        ledger: bool = True
        """Write each step's global-batch SHA-256 to ledger.jsonl beside the checkpoints."""

        # Not a user setting: set by titan/override.py, whose loader runs in a stock trainer and needs
        # ZephonCheckpointManager (the ledger, the resume checks, the global batch check).
        checkpointer_required: Annotated[bool, tyro.conf.Suppress] = False

    def __init__(self, config: Config, **build: Any):
        """`build`: TorchTitan's build() keywords (RankLoader._start)."""
        self._start(RankSteps, config, ledger=config.ledger, **build)
        self.checkpointer: Any = None  # the ZephonCheckpointManager that saves and loads this loader, if any
        self.last_rows: list[Row] = []  # the rows of the microbatch yielded last (ZephonTrainer: loss per source)

    def __iter__(self) -> Iterator[Batch]:
        if self.config.checkpointer_required and self.checkpointer is None:
            raise ConfigError(
                "the zephon loader of --override.imports zephon_titan.titan.override.dataloader needs its "
                "checkpoint manager: add zephon_titan.titan.override.checkpoint to --override.imports"
            )
        for step in self.steps():
            for microbatch in self.step_microbatches(step):
                batch = titan_batch(microbatch)
                if microbatch.last:
                    # Handing over the step's last microbatch is consuming the step (TorchTitan saves between
                    # steps): record it before yielding.
                    self.consume(step)
                self.last_rows = list(microbatch.rows)
                yield batch


def loader_config(table: Any) -> ZephonDataLoader.Config:
    """The [dataloader] table: the data settings (config/) plus the TorchTitan loader's own (`ledger`), read by
    job_file.loader_settings; usable where TorchTitan's trainer cannot import (scripts/gpu_check.py)."""
    data, ledger = loader_settings(table)
    return ZephonDataLoader.Config(data=data, ledger=ledger)
