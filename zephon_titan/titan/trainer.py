"""ZephonTrainer: TorchTitan's Trainer with the zephon loader wired in.

TorchTitan does not tell a loader the global batch size; this Config subclass is
the one hook that sees `training.*` and the dataloader together (TorchTitan's
docs/extension.md), so it copies training.global_batch_size into the loader.
The trainer also logs globally correct tokens per source (TorchTitan's own
`ntokens_seen` is per rank and wrong after a resize) and each source's share of the
tokens since the previous log (per step with log_freq = 1), writes the batch ledger,
and loads checkpoints with ZephonCheckpointManager: no checkpoint byte runs code, the loader's
entries are sized from the checkpoint, a checkpoint written with another lane count is an error
that says so, and the loader state must be of the checkpoint's training step.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import torch
import torch.distributed as dist
from torchtitan.components.checkpointer import DATALOADER, MODEL, TRAIN_STATE, CheckpointManager
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.tools.logging import logger
from torchtitan.trainer import Trainer

from zephon_titan.engine.document_counts import document_metrics, documents_line
from zephon_titan.engine.eval_set import slot_sources
from zephon_titan.engine.ledger import LedgerWriter
from zephon_titan.errors import ConfigError
from zephon_titan.loader.ledger import gather_ledger_entry, open_ledger
from zephon_titan.loader.rank_lanes import long_tensor
from zephon_titan.loader.save_failure import SAVE_ERRORS, save_failure
from zephon_titan.loader.state import restore
from zephon_titan.progress import on_terminal
from zephon_titan.titan.dataloader import ZephonDataLoader
from zephon_titan.titan.source_loss import (
    SourceCrossEntropyLoss,
    encode_labels,
    source_recorder,
    source_token_counts,
    with_source_loss,
)
from zephon_titan.titan.validator import ZephonValidator


def check_global_batch(trainer_rows: int, loader_rows: int) -> None:
    """The trainer's global batch (training.global_batch_size) must be the loader's: TorchTitan accumulates
    global / (local x DP) microbatches a step and never tells the loader, so a difference would move every
    step boundary."""
    if trainer_rows != loader_rows:
        raise ConfigError(
            f"training.global_batch_size is {trainer_rows} but the zephon loader was given {loader_rows}: set "
            f"--training.global_batch_size {loader_rows} (TorchTitan's default, -1, depends on the GPU count), or "
            "give the loader the trainer's"
        )


def _stock_as(cls: type, config: Any, stock: type) -> Any:
    """A recipe's `stock` component config as our subclass `cls`, field by field. Its values were checked
    when it was built: __post_init__ is not run again (it would log TorchTitan's notes twice)."""
    out: Any = object.__new__(cls)
    for f in fields(stock):
        setattr(out, f.name, getattr(config, f.name))
    return out


class ZephonMetricsProcessor(MetricsProcessor):
    """TorchTitan's MetricsProcessor with the loader's metrics added to every log (`extra_metrics`, set by
    ZephonTrainer): TorchTitan's trainer has no hook of its own for a component's metrics."""

    @dataclass(kw_only=True, slots=True)
    class Config(MetricsProcessor.Config):
        @classmethod
        def of(cls, config: MetricsProcessor.Config) -> ZephonMetricsProcessor.Config:
            return _stock_as(cls, config, MetricsProcessor.Config)

    extra_metrics: Callable[[], dict[str, float]] | None = None
    """Called at every log, on every rank (it may run a collective)."""

    def log(self, step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=None):
        extra = {**(extra_metrics or {}), **(self.extra_metrics() if self.extra_metrics is not None else {})}
        return super().log(step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=extra)


class ZephonCheckpointManager(CheckpointManager):
    """TorchTitan's CheckpointManager, loading through the loader's resume sequence (loader/state.restore):
    no checkpoint byte runs (`.metadata` through the allow-listed unpickler, bytes entries such as train_state
    weights-only, a `dataloader.*` entry declared as a Python object refused before DCP reads it); with the
    zephon loader, its index checked and its templates sized before DCP runs, and the loader state bound to
    the trainer's restored step. Loading HF safetensors (model only, no pickle) is TorchTitan's own.

    With the zephon loader it also writes each step's ledger line (the trainer saves, or not, after every
    step: `save` is TorchTitan's per-step hook), so a stock trainer (titan/override.py) keeps one too, and it
    refuses a trainer whose global batch size is not the loader's before step 1; with the zephon validator, its
    validation.jsonl beside the ledger."""

    @dataclass(kw_only=True, slots=True)
    class Config(CheckpointManager.Config):
        def __post_init__(self) -> None:
            CheckpointManager.Config.__post_init__(self)

        @classmethod
        def of(cls, config: CheckpointManager.Config) -> ZephonCheckpointManager.Config:
            return _stock_as(cls, config, CheckpointManager.Config)

    def __init__(self, config: Config, *, dataloader: Any, states: dict[str, Any], base_folder: str = "", **kwargs):
        # Kept apart from TorchTitan's attributes, which a disabled checkpointer never sets: the ledger is
        # written whether or not checkpoints are.
        self._loader = dataloader if isinstance(dataloader, ZephonDataLoader) else None
        self._trainer: Any = states.get(TRAIN_STATE)
        self.ledger_path = os.path.join(base_folder, config.folder, "ledger.jsonl")
        self._ledger: LedgerWriter | None = None
        super().__init__(config, dataloader=dataloader, states=states, base_folder=base_folder, **kwargs)
        if self._loader is not None:
            self._loader.checkpointer = self
        if self._loader is not None and self._trainer is not None:
            check_global_batch(self._trainer.config.training.global_batch_size, self._loader.config.global_batch_size)

    def save(self, curr_step: int, last_step: bool = False) -> None:
        if self._loader is not None and self._trainer is not None and curr_step > 0:
            self._record_step(self._loader, curr_step)
        if self._trainer is not None and curr_step > 0:
            self._record_validations(curr_step)
        super().save(curr_step, last_step)

    def _record_validations(self, step: int) -> None:
        """A ZephonValidator in a stock trainer (titan/override.py's `validator` entry) appends its validations to
        validation.jsonl beside the ledger, from this run's first step on, as under ZephonTrainer (which sets that up
        itself: nothing to do then). The trainer builds its validator after this manager: hence here, at the first
        step's save, before its first validation."""
        validator = getattr(self._trainer, "validator", None)
        if isinstance(validator, ZephonValidator) and validator.ledger_path is None:
            validator.ledger_path = os.path.join(os.path.dirname(self.ledger_path), "validation.jsonl")
            validator.resume_step = step - 1  # the checkpoint's step (0: a fresh run), as ZephonTrainer's

    def _record_step(self, loader: ZephonDataLoader, step: int) -> None:
        """The step's ledger line (a collective over the batch mesh), after checking that the loader handed
        out exactly this step's rows."""
        if loader.steps_done != step:
            raise RuntimeError(
                f"zephon_titan: the trainer finished step {step} but the loader handed out {loader.steps_done} "
                "steps of rows: the trainer's batch layout is not the loader's (global batch, local batch, "
                "pipeline microbatches)"
            )
        if not loader.config.ledger:
            return
        parallel_dims = self._trainer.parallel_dims
        group = parallel_dims.get_mesh("batch").get_group() if parallel_dims.dp_enabled else None
        entry = gather_ledger_entry(loader, step, group, self._trainer.device)
        if entry is None:
            return
        if self._ledger is None:
            self._ledger = open_ledger(self.ledger_path, resume_step=step - 1)
        self._ledger.write(entry)

    def dcp_save(self, state_dict: dict[str, Any], checkpoint_id: str, *args: Any, **kwargs: Any) -> Any:
        """TorchTitan's save; one that fails on the disk (full, gone) ends the job in one line (save_failure.py).
        An asynchronous save's failure surfaces in TorchTitan's own wait, as before."""
        try:
            return super().dcp_save(state_dict, checkpoint_id, *args, **kwargs)
        except SAVE_ERRORS as e:
            raise save_failure(e, checkpoint_id) from None

    def dcp_load(self, state_dict: dict[str, Any], checkpoint_id: str, from_hf: bool, from_quantized: bool) -> None:
        if from_hf:  # safetensors: no pickle anywhere; the model only
            return super().dcp_load(state_dict, checkpoint_id, from_hf, from_quantized)
        loader = state_dict.get(DATALOADER)  # absent when excluded from loading (or a model-only load)
        restore(state_dict, checkpoint_id, loader if isinstance(loader, ZephonDataLoader) else None)
        # As TorchTitan's dcp_load: the model's states are flattened into state_dict, loaded by hand.
        if MODEL in self.states:
            self.states[MODEL].load_state_dict(state_dict)


class ZephonTrainer(Trainer):
    @dataclass(kw_only=True, slots=True)
    class Config(Trainer.Config):
        dataloader: ZephonDataLoader.Config = field(default_factory=ZephonDataLoader.Config)
        validator: ZephonValidator.Config = field(default_factory=ZephonValidator.Config)  # type: ignore[assignment]
        checkpoint: ZephonCheckpointManager.Config = field(  # type: ignore[assignment]
            default_factory=ZephonCheckpointManager.Config
        )
        metrics: ZephonMetricsProcessor.Config = field(  # type: ignore[assignment]
            default_factory=ZephonMetricsProcessor.Config
        )

        def __post_init__(self):
            Trainer.Config.__post_init__(self)
            # A recipe's (or job file's) stock checkpoint config: the same settings, loaded by ours.
            if type(self.checkpoint) is CheckpointManager.Config:
                self.checkpoint = ZephonCheckpointManager.Config.of(self.checkpoint)
            if type(self.metrics) is MetricsProcessor.Config:
                self.metrics = ZephonMetricsProcessor.Config.of(self.metrics)
            if not on_terminal(None):  # TorchTitan's metric lines in colour codes only where a terminal draws them
                self.metrics.disable_color_printing = True
            # training.global_batch_size is the single source of truth; the loader
            # refuses to start if it is left at TorchTitan's W-dependent default.
            if isinstance(self.dataloader, ZephonDataLoader.Config):
                self.dataloader.global_batch_size = self.training.global_batch_size
            if isinstance(self.validator, ZephonValidator.Config) and self.validator.dataloader.global_batch_size <= 0:
                self.validator.dataloader.global_batch_size = self.training.global_batch_size
            # TorchTitan's cross-entropy, able to record the loss of each source (titan/source_loss.py).
            self.loss = with_source_loss(self.loss)  # type: ignore[misc,has-type]

    def __init__(self, config: Config):
        super().__init__(config)
        self._share_base: list[int] | None = None  # global tokens per source at the previous log
        self._documents_base: list[int] | None = None  # and what happened to documents (document_counts.py)
        if isinstance(self.dataloader, ZephonDataLoader) and isinstance(self.metrics_processor, ZephonMetricsProcessor):
            self.metrics_processor.extra_metrics = self.token_metrics
        if isinstance(getattr(self, "validator", None), ZephonValidator):
            self.validator.ledger_path = os.path.join(os.path.dirname(self.ledger_path), "validation.jsonl")
        # The loss of each source (zephon/loss/<source>): TorchTitan's cross-entropy (SourceCrossEntropyLoss,
        # Config) records a per-token loss by source during train_step, its loss unchanged; the labels carry their
        # sources from batch_generator on. A pipeline schedule's labels stay plain (no per-source loss there).
        self._source_loss: SourceCrossEntropyLoss | None = None
        self._source_sums = torch.zeros(0, dtype=torch.float64)  # loss sums per source this step (this rank)
        self._source_targets = torch.zeros(0, dtype=torch.int64)  # targets per source this step (this DP rank)
        recorder = source_recorder(self.loss_fn)
        if (
            recorder is not None
            and isinstance(self.dataloader, ZephonDataLoader)
            and not self.parallel_dims.pp_enabled
            and config.parallelism.spmd_backend != "full_dtensor"
        ):
            num_sources = len(self.dataloader.spec.source_names)
            self._source_loss = recorder
            self._source_sums = torch.zeros(num_sources, dtype=torch.float64, device=self.device)
            self._source_targets = torch.zeros(num_sources, dtype=torch.int64)

    def close(self) -> None:
        super().close()
        if isinstance(self.dataloader, ZephonDataLoader):
            self.dataloader.close()  # stop and join the worker processes

    @property
    def ledger_path(self) -> str:
        return os.path.join(
            self.config.dump_folder, self.config.checkpoint.folder, "ledger.jsonl"
        )  # as the checkpointer's

    def train_step(self, data_iterator):
        if isinstance(self.dataloader, ZephonDataLoader) and self._share_base is None:
            counts = self._global_counts()  # where this run (or resume) starts
            self._share_base = counts[: len(self.dataloader.spec.source_names) + 1]
            self._documents_base = counts[len(self._share_base) :]
            if isinstance(getattr(self, "validator", None), ZephonValidator):
                self.validator.resume_step = self.step - 1  # the checkpoint's step (0: a fresh run)
        if self._source_loss is None:
            super().train_step(data_iterator)
        else:  # the logged per-source losses are of the log step, as TorchTitan's loss
            self._source_sums.zero_()
            self._source_targets.zero_()
            self._source_loss.recording = self._source_sums
            try:
                super().train_step(data_iterator)
            finally:
                self._source_loss.recording = None

    def batch_generator(self, data_iterable):
        """TorchTitan's, with each target's source (that of its input token, from the loader's rows) carried in
        its label when the loss per source is recorded."""
        for input_dict, labels in super().batch_generator(data_iterable):
            if self._source_loss is not None:
                rows = self.dataloader.last_rows  # type: ignore[attr-defined]
                sources = long_tensor([slot_sources(row) for row in rows])
                self._source_targets += source_token_counts(labels, sources, len(self._source_targets))
                labels = encode_labels(labels, sources)
            yield input_dict, labels

    def _global_counts(self) -> list[int]:
        """Tokens consumed per source over all lanes, then padding, then what happened to documents in this
        process's steps (engine/document_counts.py): a sum over the batch mesh."""
        loader: ZephonDataLoader = self.dataloader  # type: ignore[assignment]
        local = loader.consumed_tokens() + loader.consumed_documents()
        counts = torch.tensor(local, dtype=torch.int64, device=self.device)
        if self.parallel_dims.dp_enabled:
            # TP/CP/PP peers share a DP rank and its lanes: reduce over the batch mesh only.
            dist.all_reduce(counts, group=self.parallel_dims.get_mesh("batch").get_group())
        return counts.tolist()

    def token_metrics(self) -> dict[str, float]:
        """Tokens per source so far, and each source's share of the tokens since the previous log."""
        loader: ZephonDataLoader = self.dataloader  # type: ignore[assignment]
        names = loader.spec.source_names
        values = self._global_counts()
        values, documents = values[: len(names) + 1], values[len(names) + 1 :]
        base = self._share_base or [0] * len(values)
        since = [v - b for v, b in zip(values[:-1], base)]
        self._share_base = values
        documents_since = [d - b for d, b in zip(documents, self._documents_base or [0] * len(documents))]
        self._documents_base = documents
        metrics: dict[str, float] = {f"zephon/tokens/{name}": v for name, v in zip(names, values)}
        metrics.update({f"zephon/share/{name}": n / max(sum(since), 1) for name, n in zip(names, since)})
        metrics["zephon/tokens_total"] = sum(values[:-1])
        metrics["zephon/padding_tokens"] = values[-1]
        counted = document_metrics(names, documents_since, loader.spec.counts_documents)
        metrics.update(counted)
        if self._source_loss is not None:
            metrics.update(self.source_loss_metrics())
        if dist.is_initialized() and dist.get_rank() != 0:
            return metrics  # the same global figures on every rank: said once
        logger.info(
            "zephon tokens consumed: "
            + ", ".join(f"{n} {v}" for n, v in zip(names, values))
            + f" (total {metrics['zephon/tokens_total']}, padding {values[-1]}); share since the last log: "
            + ", ".join(f"{n} {metrics[f'zephon/share/{n}']:.4f}" for n in names)
        )
        if loader.spec.counts_documents:
            logger.info(f"zephon documents since the last log: {documents_line(names, documents_since)}")
        return metrics

    def source_loss_metrics(self) -> dict[str, float]:
        """The loss of each source's targets at this step, reduced like TorchTitan's loss (sums over the loss
        mesh, targets counted before CP sharding over the batch mesh), and its targets (zephon/loss_targets/)."""
        sums = self._source_sums.clone()
        targets = self._source_targets.to(self.device)
        if self.parallel_dims.dp_cp_enabled:
            dist.all_reduce(sums, group=self.parallel_dims.get_optional_mesh("loss").get_group())
        if self.parallel_dims.dp_enabled:
            dist.all_reduce(targets, group=self.parallel_dims.get_mesh("batch").get_group())
        names = self.dataloader.spec.source_names  # type: ignore[attr-defined]
        metrics: dict[str, float] = {}
        for name, loss_sum, n in zip(names, sums.tolist(), targets.tolist()):
            metrics[f"zephon/loss_targets/{name}"] = n
            if n:
                metrics[f"zephon/loss/{name}"] = loss_sum / n
        if not dist.is_initialized() or dist.get_rank() == 0:
            logger.info(
                "zephon loss per source: "
                + ", ".join(
                    f"{name} {metrics[f'zephon/loss/{name}']:.5f}" for name in names if f"zephon/loss/{name}" in metrics
                )
                + " (targets: "
                + ", ".join(f"{name} {metrics[f'zephon/loss_targets/{name}']}" for name in names)
                + ")"
            )
        return metrics
