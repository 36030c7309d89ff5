"""ZephonTrainer: TorchTitan's Trainer with the zephon loader wired in.

TorchTitan does not tell a loader the global batch size; this Config subclass is
the one hook that sees `training.*` and the dataloader together (TorchTitan's
docs/extension.md), so it copies training.global_batch_size into the loader.
The trainer also logs globally correct tokens per source (TorchTitan's own
`ntokens_seen` is per rank and wrong after a resize) and each source's share of the
tokens since the previous log (per step with log_freq = 1), writes the batch ledger,
and turns a checkpoint written with another lane count into an error that says so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torchtitan.tools.logging import logger
from torchtitan.trainer import Trainer

from zephon_titan.engine.ledger import LedgerWriter
from zephon_titan.titan.dataloader import ZephonDataLoader, with_lane_check
from zephon_titan.titan.ledger import gather_ledger_entry
from zephon_titan.titan.validator import ZephonValidator


class ZephonTrainer(Trainer):
    @dataclass(kw_only=True, slots=True)
    class Config(Trainer.Config):
        dataloader: ZephonDataLoader.Config = field(default_factory=ZephonDataLoader.Config)
        validator: ZephonValidator.Config = field(default_factory=ZephonValidator.Config)  # type: ignore[assignment]

        def __post_init__(self):
            Trainer.Config.__post_init__(self)
            # training.global_batch_size is the single source of truth; the loader
            # refuses to start if it is left at TorchTitan's W-dependent default.
            if isinstance(self.dataloader, ZephonDataLoader.Config):
                self.dataloader.global_batch_size = self.training.global_batch_size
            if isinstance(self.validator, ZephonValidator.Config) and self.validator.dataloader.global_batch_size <= 0:
                self.validator.dataloader.global_batch_size = self.training.global_batch_size

    def __init__(self, config: Config):
        super().__init__(config)
        self._ledger: LedgerWriter | None = None
        self._share_base: list[int] | None = None  # global tokens per source at the previous log
        if isinstance(self.dataloader, ZephonDataLoader):
            self._wrap_metrics_log()
            self._wrap_checkpoint_load()
        if isinstance(getattr(self, "validator", None), ZephonValidator):
            self.validator.ledger_path = os.path.join(os.path.dirname(self.ledger_path), "validation.jsonl")

    def close(self) -> None:
        super().close()
        if isinstance(self.dataloader, ZephonDataLoader):
            self.dataloader.close()  # stop and join the worker processes

    @property
    def ledger_path(self) -> str:
        return os.path.join(self.config.dump_folder, self.config.checkpoint.folder, "ledger.jsonl")

    def train_step(self, data_iterator):
        if isinstance(self.dataloader, ZephonDataLoader) and self._share_base is None:
            self._share_base = self._global_counts()  # where this run (or resume) starts
            if isinstance(getattr(self, "validator", None), ZephonValidator):
                self.validator.resume_step = self.step - 1  # the checkpoint's step (0: a fresh run)
        super().train_step(data_iterator)
        if isinstance(self.dataloader, ZephonDataLoader) and self.dataloader.config.ledger:
            self._record_ledger()

    def _record_ledger(self) -> None:
        group = self.parallel_dims.get_mesh("batch").get_group() if self.parallel_dims.dp_enabled else None
        entry = gather_ledger_entry(self.dataloader, self.step, group, self.device)
        if entry is None:
            return
        if self._ledger is None:
            self._ledger = LedgerWriter(self.ledger_path, resume_step=self.step - 1)
        self._ledger.write(entry)

    def _global_counts(self) -> list[int]:
        """Tokens consumed per source over all lanes, then padding (a sum over the batch mesh)."""
        loader: ZephonDataLoader = self.dataloader  # type: ignore[assignment]
        counts = torch.tensor(loader.consumed_tokens(), dtype=torch.int64, device=self.device)
        if self.parallel_dims.dp_enabled:
            # TP/CP/PP peers share a DP rank and its lanes: reduce over the batch mesh only.
            dist.all_reduce(counts, group=self.parallel_dims.get_mesh("batch").get_group())
        return counts.tolist()

    def token_metrics(self) -> dict[str, float]:
        """Tokens per source so far, and each source's share of the tokens since the previous log."""
        loader: ZephonDataLoader = self.dataloader  # type: ignore[assignment]
        values = self._global_counts()
        names = loader.spec.source_names
        base = self._share_base or [0] * len(values)
        since = [v - b for v, b in zip(values[:-1], base)]
        self._share_base = values
        metrics: dict[str, float] = {f"zephon/tokens/{name}": v for name, v in zip(names, values)}
        metrics.update({f"zephon/share/{name}": n / max(sum(since), 1) for name, n in zip(names, since)})
        metrics["zephon/tokens_total"] = sum(values[:-1])
        metrics["zephon/padding_tokens"] = values[-1]
        if dist.is_initialized() and dist.get_rank() != 0:
            return metrics  # the same global figures on every rank: said once
        logger.info(
            "zephon tokens consumed: "
            + ", ".join(f"{n} {v}" for n, v in zip(names, values))
            + f" (total {metrics['zephon/tokens_total']}, padding {values[-1]}); share since the last log: "
            + ", ".join(f"{n} {metrics[f'zephon/share/{n}']:.4f}" for n in names)
        )
        return metrics

    def _wrap_metrics_log(self) -> None:
        log = self.metrics_processor.log

        def log_with_tokens(step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=None):
            extra = {**(extra_metrics or {}), **self.token_metrics()}
            return log(step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=extra)

        self.metrics_processor.log = log_with_tokens

    def _wrap_checkpoint_load(self) -> None:
        self.checkpointer.load = with_lane_check(self.checkpointer.load, self.dataloader.config.data.num_lanes)
        dcp_load = getattr(self.checkpointer, "dcp_load", None)
        if dcp_load is None:
            return

        def dcp_load_sized(state_dict, checkpoint_id, *args, **kwargs):
            with self.dataloader.sized_for(checkpoint_id):  # the checkpoint's entry sizes (sources may be added)
                return dcp_load(state_dict, checkpoint_id, *args, **kwargs)

        self.checkpointer.dcp_load = dcp_load_sized
