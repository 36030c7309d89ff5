"""ZephonFtDataLoader: TorchTitan 0.3's BaseDataLoader over loader/ft_steps.py, for its FT trainer (titan/ft_trainer.py).

TorchTitan's FT trainer gives each replica group a fixed share of every step (`get_dp_info`: DP degree x groups);
this loader is built with the group's own DP degree and rank only, and the split over the replica groups is made
per step attempt by FtSteps from the Manager's participants. So the loader is not iterated: the trainer asks it for
the attempt (`begin`), trains `microbatches(attempt)` and settles it (`finish`). The Manager exists only once the
trainer has initialised distributed, after TorchTitan builds its loader: `attach` hands it over before step 1.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any

import torch
import tyro
from torchtitan.components.dataloader import BaseDataLoader
from torchtitan.components.loss import IGNORE_INDEX

from zephon_titan.config import DataConfig
from zephon_titan.engine import LayoutError
from zephon_titan.engine.lanes import validate_batch_layout
from zephon_titan.engine.ledger import LedgerWriter
from zephon_titan.engine.spec import build_engine
from zephon_titan.errors import ConfigError
from zephon_titan.job_file import titan_layout_message
from zephon_titan.loader.ft_steps import Attempt, FtSteps, ManagerLike
from zephon_titan.loader.ledger import open_ledger
from zephon_titan.loader.rank_lanes import Microbatch
from zephon_titan.titan.dataloader import Batch, titan_batch
from zephon_titan.titan.tokenizer import loader_tokenizer


class ZephonFtDataLoader(BaseDataLoader):
    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        # The same [dataloader] table as ZephonDataLoader's: a job switches trainers without touching it.
        data: Annotated[DataConfig, tyro.conf.arg(name="")] = field(default_factory=DataConfig)
        """What the rows depend on: sources, lanes, seed, packing, ... (the [dataloader] table)."""

        # Not a user setting: ZephonFtTrainer copies training.global_batch_size here (one truth).
        global_batch_size: Annotated[int, tyro.conf.Suppress] = -1
        """Rows per optimizer step, copied from training.global_batch_size."""

        ledger: bool = True
        """Write each committed step's global-batch SHA-256 to ledger.group<G>.jsonl (the group's DP rank 0)."""

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int,
        dp_rank: int,
        tokenizer: Any,
        seq_len: int,
        local_batch_size: int,
        **_: Any,
    ):
        """TorchTitan's build() keywords; dp_* are the replica group's own (ZephonFtManager.get_dp_info)."""
        self.config = config
        data = config.data
        try:  # the layout must hold for the whole group on its own (the fewest live ranks a step may have)
            validate_batch_layout(data.num_lanes, config.global_batch_size, dp_world_size, local_batch_size)
        except LayoutError as e:
            raise ConfigError(titan_layout_message(e)) from None
        self.spec = build_engine(data, seq_len, loader_tokenizer(data, lambda: tokenizer))
        self.spec.tokenizer.start_backend()
        self.dp_rank, self.dp_size, self.local_batch_size = dp_rank, dp_world_size, local_batch_size
        self.seq_len = seq_len
        self.steps: FtSteps | None = None
        self._ledger: LedgerWriter | None = None

    def attach(
        self,
        manager: ManagerLike,
        group: int,
        dp_allreduce: Callable[[torch.Tensor], None] | None,
        ledger_path: str,
    ) -> None:
        """The trainer's torchft Manager: FtSteps registers the lane table in its healing state dict here, before
        the first quorum. `ledger_path`: the group's ledger (its DP rank 0 writes it)."""
        self.steps = FtSteps(
            self.spec,
            global_batch_size=self.config.global_batch_size,
            local_batch_size=self.local_batch_size,
            manager=manager,
            group=group,
            dp_rank=self.dp_rank,
            dp_size=self.dp_size,
            dp_allreduce=dp_allreduce,
        )
        self.ledger_path = ledger_path

    def _steps(self) -> FtSteps:
        if self.steps is None:
            raise RuntimeError("ZephonFtDataLoader.attach(manager, ...) must run before the first step")
        return self.steps

    def begin(self) -> Attempt:
        """The quorum (healing from a peer when behind), then this rank's rows of the step."""
        return self._steps().begin()

    def finish(self, attempt: Attempt) -> bool:
        """The lane table through the group and the Manager, then should_commit; a commit's ledger line."""
        steps = self._steps()
        committed = steps.finish(attempt)
        if committed and self.config.ledger and self.dp_rank == 0:
            if self._ledger is None:
                os.makedirs(os.path.dirname(self.ledger_path) or ".", exist_ok=True)
                self._ledger = open_ledger(self.ledger_path, resume_step=attempt.step - 1)
            self._ledger.write(steps.entries[-1])
        return committed

    def microbatches(self, attempt: Attempt) -> list[tuple[Batch, bool]]:
        """The attempt's microbatches in TorchTitan's shapes, each with whether it is real: a padding slot is a
        microbatch whose labels are all ignored (no loss, no gradient), trained so that the group's collectives stay
        in line when the live ranks do not divide the step's microbatches (engine/participants.py)."""
        out = []
        for rows in attempt.microbatches():
            if rows is not None:
                out.append((titan_batch(Microbatch(rows, last=False)), True))
                continue
            shape = (self.local_batch_size, self.spec.era_of(attempt.step).seq_len)
            inputs = torch.zeros(shape, dtype=torch.int64)
            positions = torch.arange(shape[1], dtype=torch.int64).expand(shape).contiguous()
            out.append((({"input": inputs, "positions": positions}, torch.full(shape, IGNORE_INDEX)), False))
        return out

    def __iter__(self) -> Iterator[Batch]:
        raise RuntimeError(
            "ZephonFtDataLoader is not iterated: ZephonFtTrainer takes each step attempt's rows from begin()"
        )

    # TorchTitan's Stateful: a group's state comes from a live peer (torchft's healing), not from a checkpoint.
    def state_dict(self) -> dict[str, Any]:
        return self._steps().state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._steps().load_state_dict(state_dict)

    def close(self) -> None:
        if self.steps is not None:
            self.steps.close()
