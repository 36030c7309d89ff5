"""Validation on a fixed eval set, the same rows for every GPU count, with the loss of each source.

`[validator.dataloader]` configures ZephonEvalLoader like `[dataloader]`; with no sources of its
own it reads the held-out part (`eval_fraction`) of the training sources. The eval set is a
finite sequence of steps of `global_batch_size` rows (engine/eval_set.py), restarted from the
beginning at every validation, so the same model sees the same rows on 1 GPU or 64.

ZephonValidator is TorchTitan's Validator with two changes: it steps through the eval set in
whole eval steps (`steps` counts steps of global_batch_size rows, not microbatches of one rank,
which would change the set with W), and besides `validation_metrics/loss` it logs
`validation_metrics/loss/<source>`: each token's loss counts for the source of its input, so the
token-weighted mean of the sources' losses is the overall loss. The losses of all sources come from one
per-token loss per microbatch, summed by source (titan/source_loss.py), not one loss call per source. Each validation also logs the
eval set's SHA-256 and appends it, with the losses, to validation.jsonl beside the checkpoints
(an append-only record like the ledger, engine/jsonl_log.py: a crash or a full disk cannot tear it).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any

import numpy as np
import torch
import torch.distributed as dist
import tyro
from torchtitan.components.dataloader import BaseDataLoader
from torchtitan.components.validate import Validator
from torchtitan.tools import utils
from torchtitan.tools.logging import logger

from zephon_titan.config import DataConfig
from zephon_titan.engine import batch_digest
from zephon_titan.engine.eval_set import VALIDATION_RECORD, EvalStep, eval_set_digest
from zephon_titan.engine.jsonl_log import AppendOnlyLog
from zephon_titan.errors import ConfigError
from zephon_titan.job_file import check_eval_data, eval_message
from zephon_titan.loader.eval_steps import RankEvalSteps
from zephon_titan.loader.rank_lanes import lane_table
from zephon_titan.titan.dataloader import Batch, RankLoader, titan_batch
from zephon_titan.titan.source_loss import (
    decode_labels,
    encode_labels,
    one_call_per_source,
    source_recorder,
    source_token_counts,
)

# The eval set of one rank is kept in memory after the first validation when it is at most this
# big (it is then not read and tokenized again); larger sets are produced again every time.
CACHE_BYTES = 1 << 30
TitanMicrobatch = tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]


class ZephonEvalLoader(RankEvalSteps, RankLoader):
    """The eval set's rows of one DP rank (loader/eval_steps.py), in microbatches of local_batch_size in TorchTitan's
    shapes (no checkpoint state)."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        data: Annotated[DataConfig, tyro.conf.arg(name="")] = field(default_factory=DataConfig)
        """The eval set's sources and settings (the [validator.dataloader] table)."""

        global_batch_size: int = 0
        """Rows per eval step (0: training.global_batch_size), the same for every W."""

        infinite: Annotated[bool, tyro.conf.Suppress] = False
        """Set by TorchTitan's Validator; an eval set is always finite."""

    refused = (ConfigError,)  # every error of the eval set's table names [validator.dataloader]

    @staticmethod
    def message(error: ConfigError) -> str:
        return eval_message(error)

    def __init__(self, config: Config, **build: Any):
        """`build`: TorchTitan's build() keywords (RankLoader._start)."""
        check_eval_data(config.data)
        self._start(RankEvalSteps, config, **build)
        self.check_not_empty()

    def microbatches(self, step: EvalStep) -> Iterator[TitanMicrobatch]:
        """(inputs and positions, labels, the source of each position (-1: padding)) per microbatch of this
        rank's rows of the step."""
        for microbatch in self.step_microbatches(step):
            yield *titan_batch(microbatch), microbatch.sources()

    def __iter__(self) -> Iterator[Batch]:
        for step in self.steps():
            for microbatch in self.step_microbatches(step):
                yield titan_batch(microbatch)

    def state_dict(self) -> dict[str, Any]:
        return {}  # every validation starts the eval set over

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass


@dataclass
class _EvalSet:
    """This rank's microbatches of the eval set, and the eval set's SHA-256 (the same on every rank)."""

    microbatches: list[TitanMicrobatch]
    sha256: str
    steps: int
    rows: int
    seq_len: int
    """Tokens per row: an eval at another seq_len is another set (other rows, another sha256)."""


class ZephonValidator(Validator):
    @dataclass(kw_only=True, slots=True)
    class Config(Validator.Config):
        dataloader: ZephonEvalLoader.Config = field(default_factory=ZephonEvalLoader.Config)  # type: ignore[assignment]
        """The eval set ([validator.dataloader]); `steps` counts its steps of global_batch_size rows
        (-1: the whole eval set once)."""

    def __init__(self, config: Config, **kwargs: Any):
        # TorchTitan's own __init__ keeps what its methods use (parallel_dims, loss_fn, ...). It warns that
        # steps = -1 may hang when ranks run out of data at different steps: not here, where one collective per
        # eval step decides the end for every rank (engine/eval_set.py); it sees steps = 1 and says nothing.
        quiet = copy.copy(config)
        quiet.steps = max(config.steps, 1)
        Validator.__init__(self, quiet, **kwargs)
        self.config = config
        if self.parallel_dims.pp_enabled:
            raise ConfigError(
                "[validator] with zephon_titan's eval set does not support pipeline parallelism yet; "
                "disable validation ([validator] enable = false) or pipeline parallelism"
            )
        self.loader = config.dataloader.build(
            dp_world_size=self.dp_world_size,
            dp_rank=self.dp_rank,
            tokenizer=self.tokenizer,
            seq_len=self.seq_len,
            local_batch_size=self.local_batch_size,
        )
        self.source_names = self.loader.spec.source_names
        self.ledger_path: str | None = None  # validation.jsonl; set by ZephonTrainer
        self.resume_step = 0  # the checkpoint's step; set by ZephonTrainer before the first validation
        self._record: AppendOnlyLog[dict[str, Any]] | None = None
        self._cached: _EvalSet | None = None

    # ---- the eval set ----------------------------------------------------------------------

    def _eval_set(self) -> _EvalSet:
        """Produce this rank's share of the eval set, with its SHA-256 (collectives over all ranks)."""
        if self._cached is not None:
            return self._cached
        config: ZephonValidator.Config = self.config  # type: ignore[assignment]
        microbatches: list[TitanMicrobatch] = []
        digests: list[list[bytes]] = []
        for step in self.loader.steps(config.steps):
            digests.append(self.loader.lanes.of_owned(step.lane_digests()))
            microbatches.extend(self.loader.microbatches(step))
        rows = len(digests) * config.dataloader.global_batch_size
        seq_len = self.loader.spec.seq_len
        eval_set = _EvalSet(microbatches, self._global_digest(digests), len(digests), rows, seq_len)
        row_bytes = seq_len * 4 * 8  # four int64 tensors per row
        if sum(len(mb[1]) for mb in microbatches) * row_bytes <= CACHE_BYTES:  # the same answer on every rank
            self._cached = eval_set
        return eval_set

    def _global_digest(self, digests: list[list[bytes]]) -> str:
        """SHA-256 of the eval set: over its steps' batch digests, each over the lane digests in lane
        order as in the training ledger; each rank gives the digests of the lanes it owns (`digests`: per step,
        per owned lane), summed into one table over the batch mesh."""
        lanes = self.loader.lanes
        local = np.frombuffer(b"".join(d for step in digests for d in step), dtype=np.int64)
        owned = torch.from_numpy(local.reshape(len(digests), len(lanes.owned), 4).transpose(1, 0, 2).copy())
        group = self.parallel_dims.get_mesh("batch").get_group() if self.parallel_dims.dp_enabled else None
        table = lane_table(lanes.owned, owned.to(utils.device_type), lanes.spec.num_lanes, group)  # [lanes, steps, 4]
        step_major = table.cpu().numpy().transpose(1, 0, 2)  # [steps, all lanes, 4]
        return eval_set_digest(batch_digest(lane.tobytes() for lane in step) for step in step_major)

    # ---- validation ------------------------------------------------------------------------

    @torch.no_grad()
    def validate(self, model_parts: list[torch.nn.Module], step: int) -> None:
        for model in model_parts:
            model.eval()
        eval_set = self._eval_set()
        num_sources = len(self.source_names)
        device = utils.device_type
        loss_sums = torch.zeros(num_sources, dtype=torch.float64, device=device)
        valid = torch.zeros(num_sources, dtype=torch.int64, device=device)
        recorder = source_recorder(self.loss_fn)
        for inputs, labels, sources in eval_set.microbatches:
            self.metrics_processor.ntokens_since_last_log += labels.numel()
            input_dict = {k: v.to(device) for k, v in inputs.items()}
            labels, sources = labels.to(device), sources.to(device)
            valid += source_token_counts(labels, sources, num_sources)  # before CP sharding, as TorchTitan counts
            model_inputs, combined, extra = self.post_dataloading_process(
                input_dict, encode_labels(labels, sources), model_parts
            )
            with self.validation_context():
                predictions = model_parts[0](model_inputs, **extra)
                if recorder is not None:  # one call of TorchTitan's loss, its per-token loss summed by source
                    recorder.recording = loss_sums
                    try:
                        self.loss_fn(predictions, combined)
                    finally:
                        recorder.recording = None
                else:
                    labels, sources = decode_labels(combined)
                    loss_sums += one_call_per_source(self.loss_fn, predictions, labels, sources, num_sources)
        if self.parallel_dims.dp_cp_enabled:
            dist.all_reduce(loss_sums, group=self.parallel_dims.get_optional_mesh("loss").get_group())
        if self.parallel_dims.dp_enabled:
            dist.all_reduce(valid, group=self.parallel_dims.get_mesh("batch").get_group())
        sums, counts = loss_sums.cpu().tolist(), valid.cpu().tolist()
        loss = sum(sums) / max(sum(counts), 1)
        per_source = {name: s / n for name, s, n in zip(self.source_names, sums, counts) if n}
        extra_metrics = {f"validation_metrics/loss/{name}": value for name, value in per_source.items()}
        extra_metrics["validation_metrics/eval_tokens"] = sum(counts)
        self.metrics_processor.log_validation(loss=loss, step=step, extra_metrics=extra_metrics)
        self._report(step, eval_set, loss, per_source, dict(zip(self.source_names, counts)))
        for model in model_parts:
            model.train()

    def _report(
        self, step: int, eval_set: _EvalSet, loss: float, per_source: dict[str, float], tokens: dict[str, int]
    ) -> None:
        """The log line and the validation.jsonl entry (rank 0). `tokens`: targets per source."""
        if dist.is_initialized() and dist.get_rank() != 0:
            return
        logger.info(
            f"zephon validation at step {step}: eval set sha256 {eval_set.sha256[:16]} ({eval_set.steps} steps, "
            f"{eval_set.rows} rows of {eval_set.seq_len}, {sum(tokens.values())} tokens); loss {loss:.5f}; per source: "
            + ", ".join(f"{name} {value:.5f}" for name, value in per_source.items())
        )
        if self.ledger_path is None:
            return
        entry = {
            "step": step,
            "sha256": eval_set.sha256,
            "steps": eval_set.steps,
            "rows": eval_set.rows,
            "seq_len": eval_set.seq_len,
            "tokens": tokens,
            "loss": loss,
            "loss_per_source": per_source,
        }
        if self._record is None:  # drops what a stopped run wrote after the checkpoint, then only appends
            self._record = AppendOnlyLog(self.ledger_path, VALIDATION_RECORD, self.resume_step)
        self._record.append(entry)
