"""ZephonFtTrainer: TorchTitan 0.3's FT trainer (experiments/torchft) with the rows of a step by step, not by group.

TorchTitan's FT trainer splits the data statically over the replica groups (`TorchFTManager.get_dp_info`: group g
reads share g of G every step, whoever is alive) and keeps a loader checkpoint per group: a dead group's share is
never trained, a rejoining one resumes from its own disk state. Here, through TorchTitan's extension points (nested
Configs, build()):
- ZephonFtManager: TorchTitan's TorchFTManager with torchft's quorum synchronous (a group heals inside
  start_quorum, before the step's rows are chosen, so a healed group trains that very step: FtSteps needs this) and
  `get_dp_info` the group's own DP degree and rank (the loader splits over the groups per step).
- ZephonFtTrainer.train_step: per attempt, the quorum and this rank's rows (titan/ft_dataloader.py over
  loader/ft_steps.py), every microbatch forward and backward (survivors take more: gradient accumulation), the
  gradients and the token count summed over the step's participants by the Manager, then the lane table and
  should_commit; the optimizer and the LR schedule step only on a commit, else the same step is attempted again
  (the trainer's step counter too) with the same rows over the new quorum.
- Healing: the model, optimizer and LR schedule go to a rejoining group in torchft's state dict beside the loader's
  lane table (the loader registers its own entry).
Not wired (each refused before step 1, in one line): disk checkpoints (a group's state comes from a live peer;
TorchTitan's per-group loader checkpoints are the static split's), pipeline parallelism, semi-sync training
(LocalSGD/DiLoCo own the quorum) and the NCCL FT process group (the lane table is an int64 CPU tensor).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import ReduceOp
from torch.distributed.tensor import DTensor
from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.components.checkpointer.base import ModelWrapper
from torchtitan.components.loss import IGNORE_INDEX, ChunkedLossWrapper
from torchtitan.components.optimizer import OptimizersContainer
from torchtitan.distributed import utils as dist_utils
from torchtitan.experiments.torchft.checkpoint import TorchFTCheckpointManager
from torchtitan.experiments.torchft.config.job_config import FaultTolerance
from torchtitan.experiments.torchft.manager import TorchFTManager
from torchtitan.experiments.torchft.trainer import FaultTolerantTrainer
from torchtitan.trainer import Trainer

from zephon_titan.errors import ConfigError
from zephon_titan.loader.ft_store import fresh_group_store, under_torchrun
from zephon_titan.titan.ft_dataloader import ZephonFtDataLoader

TRAINER_STATE_KEY = "trainer"
"""The model, optimizer and LR schedule's entry in torchft's healing state dict (the loader's is "dataloader")."""


class ZephonFtManager(TorchFTManager):
    """TorchTitan's TorchFTManager, the quorum synchronous and the DP info the group's own."""

    @dataclass(kw_only=True, slots=True)
    class Config(FaultTolerance):
        pass

    def __init__(self, config: Config) -> None:
        if not config.enable:
            self._manager = None
            return
        import torchft

        self._manager = torchft.Manager(
            pg=torchft.ProcessGroupGloo(timeout=timedelta(milliseconds=config.process_group_timeout_ms)),
            min_replica_size=config.min_replica_size,
            load_state_dict=None,
            state_dict=None,
            use_async_quorum=False,  # heal inside start_quorum: the step's rows are chosen after (FtSteps.begin)
            replica_id=f"torchtitan_ft_{config.replica_id}",  # torchft orders participants by its trailing digits
        )
        self.group_size, self.replica_id = config.group_size, config.replica_id
        self.use_async_quorum = False  # TorchFTOptimizersContainer then steps as a plain container: we drive torchft

    def get_dp_info(self, dp_degree: int, dp_rank: int) -> tuple[int, int]:
        return dp_degree, dp_rank  # the group's own: FtSteps splits each step over the live groups


def check_ft_job(config: Any) -> None:
    """What this trainer does not wire, refused before anything is built (one line each)."""
    ft = config.fault_tolerance
    where = "ZephonFtTrainer (TorchTitan's FT trainer with the zephon loader)"
    if not ft.enable:
        raise ConfigError(f"{where} needs [fault_tolerance] enable = true (without it, use the plain trainer)")
    if ft.semi_sync_method is not None:
        raise ConfigError(
            f"{where}: [fault_tolerance] semi_sync_method = {ft.semi_sync_method!r} is not supported (LocalSGD and "
            "DiLoCo own torchft's quorum); remove it"
        )
    if ft.process_group != "gloo":
        raise ConfigError(
            f'{where}: [fault_tolerance] process_group = "{ft.process_group}" is not supported (the loader\'s lane '
            'table is summed as an int64 CPU tensor); set process_group = "gloo"'
        )
    if not 0 <= ft.replica_id < max(ft.group_size, 1):
        raise ConfigError(
            f"{where}: [fault_tolerance] replica_id = {ft.replica_id} must be in [0, group_size = {ft.group_size})"
        )
    if config.checkpoint.enable:
        raise ConfigError(
            f"{where}: disk checkpoints are not wired yet (a group's state comes from a live peer, and TorchTitan's "
            "per-group loader checkpoints are its static split's); set [checkpoint] enable = false"
        )
    if config.parallelism.pipeline_parallel_degree > 1:
        raise ConfigError(
            f"{where}: pipeline parallelism is not supported; set [parallelism] pipeline_parallel_degree = 1"
        )


class ZephonFtTrainer(FaultTolerantTrainer):
    @dataclass(kw_only=True, slots=True)
    class Config(FaultTolerantTrainer.Config):
        dataloader: ZephonFtDataLoader.Config = field(default_factory=ZephonFtDataLoader.Config)
        fault_tolerance: ZephonFtManager.Config = field(default_factory=ZephonFtManager.Config)  # type: ignore[assignment]

        def __post_init__(self):
            FaultTolerantTrainer.Config.__post_init__(self)
            self.dataloader.global_batch_size = self.training.global_batch_size  # one truth

        @classmethod
        def of(cls, config: Trainer.Config, fault_tolerance: dict[str, Any]) -> ZephonFtTrainer.Config:
            """A job's trainer config (ZephonTrainer's: its [dataloader] table) as this trainer's, with
            [fault_tolerance]'s values; checked (check_ft_job) before anything is built."""
            values = {f.name: getattr(config, f.name) for f in fields(Trainer.Config) if f.init}
            loader = config.dataloader
            values["dataloader"] = ZephonFtDataLoader.Config(data=loader.data, ledger=loader.ledger)  # type: ignore[attr-defined]
            # The FT trainer hands its checkpointer the Manager: TorchTitan's FT checkpoint manager, same settings.
            checkpoint: Any = object.__new__(TorchFTCheckpointManager.Config)
            for f in fields(CheckpointManager.Config):
                setattr(checkpoint, f.name, getattr(config.checkpoint, f.name))
            checkpoint.enable_ft_dataloader_checkpoints = False  # the loader's state comes from a live peer
            values["checkpoint"] = checkpoint
            names = {f.name for f in fields(ZephonFtManager.Config)}
            unknown = sorted(set(fault_tolerance) - names)
            if unknown:
                raise ConfigError(f"[fault_tolerance]: unknown keys {unknown}; the keys are {sorted(names)}")
            values["fault_tolerance"] = ZephonFtManager.Config(**fault_tolerance)
            out = cls(**values)
            check_ft_job(out)
            return out

    dataloader: ZephonFtDataLoader

    def __init__(self, config: Config):
        check_ft_job(config)
        super().__init__(config)
        if isinstance(self.loss_fn, ChunkedLossWrapper):
            # TorchTitan 0.3.0's FT trainer (its own copy of Trainer.__init__) never gives the chunked loss the
            # output layer, as the base trainer does: its first forward fails "Set lm_head before calling
            # ChunkedLossWrapper". The base trainer's step (pipeline parallelism is refused: one model part).
            self.loss_fn.set_lm_head(self.model_parts[0].lm_head)
            self.model_parts[0]._skip_lm_head = True
        manager = self.ft_manager.manager
        dims = self.parallel_dims
        group = dims.get_mesh("batch").get_group() if dims.dp_enabled else None
        device = self.device

        def dp_sum(table: torch.Tensor) -> None:  # the group's table first (NCCL sums on the device)
            summed = table.to(device)
            dist.all_reduce(summed, group=group)
            table.copy_(summed.cpu())

        folder = os.path.join(config.dump_folder, config.checkpoint.folder)
        self.dataloader.attach(
            manager,
            self.ft_manager.replica_id,
            dp_sum if group is not None else None,
            os.path.join(folder, f"ledger.group{self.ft_manager.replica_id}.jsonl"),
        )
        model = ModelWrapper(self.model_parts)

        def state() -> dict[str, Any]:
            return {
                "model": model.state_dict(),
                "optimizer": OptimizersContainer.state_dict(self.optimizers),  # TorchFT's container caches it
                "lr_scheduler": self.lr_schedulers.state_dict(),
            }

        def load(values: dict[str, Any]) -> None:
            model.load_state_dict(values["model"])
            self.optimizers.load_state_dict(values["optimizer"])
            self.lr_schedulers.load_state_dict(values["lr_scheduler"])

        manager.register_state_dict_fn(TRAINER_STATE_KEY, load, state)
        self.committed: bool | None = None  # the last attempt's outcome
        self.attempt: Any = None  # the last attempt (loader/ft_steps.Attempt)

    def init_distributed(self) -> Any:
        """TorchTitan's, in a store of this life of the group under torchrun (loader/ft_store.py): the group's own
        process group and torchft's Manager find each other through MASTER_ADDR:MASTER_PORT, and torchrun's store
        there keeps a dead life's addresses after a restart (--max-restarts), where a new rank read them and waited
        for ever (gloo) or was refused (the Manager)."""
        if under_torchrun():
            host, port, self._group_store = fresh_group_store(int(os.environ["RANK"]))
            os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = host, str(port)
        return super().init_distributed()

    def train_step(self, data_iterator: Any) -> None:
        """One attempt of a step (see the module's docstring); `data_iterator` (TorchTitan's) is not used."""
        manager = self.ft_manager.manager
        dims = self.parallel_dims
        self.optimizers.zero_grad()
        began = time.perf_counter()
        attempt = self.dataloader.begin()  # the quorum: a healed group is now at the peers' step
        self.step, self.attempt = attempt.step, attempt
        lr = self.lr_schedulers.schedulers[0].get_last_lr()[0]
        should_log = self.metrics_processor.should_log(self.step)
        microbatches = self.dataloader.microbatches(attempt)
        # TorchTitan's data-loading time: here the quorum (with any healing) and this rank's rows.
        self.metrics_processor.data_loading_times.append(time.perf_counter() - began)
        tokens = torch.tensor(0, dtype=torch.int64)
        for (_, labels), real in microbatches:
            tokens += (labels != IGNORE_INDEX).sum()
            self.metrics_processor.ntokens_since_last_log += labels.numel() if real else 0  # padding slots: none
        # The loss is normalised by the step's tokens over every live rank of every participating group (TorchTitan
        # sums over the group only; with uneven shares the groups' sums differ).
        global_tokens = tokens.to(self.device)
        if dims.dp_enabled:
            global_tokens = dist_utils.dist_sum_tensor(global_tokens, dims.get_mesh("batch"))
        summed = torch.tensor([float(global_tokens)], dtype=torch.float64)
        manager.allreduce(summed, reduce_op=ReduceOp.SUM).wait()
        global_tokens = torch.tensor(max(int(summed.item()), 1), dtype=torch.int64, device=self.device)
        loss_sum = torch.zeros((), device=self.device)
        for (input_dict, labels), _ in microbatches:
            input_dict = {k: v.to(self.device) for k, v in input_dict.items()}
            loss = self.forward_backward_step(
                input_dict=input_dict, labels=labels.to(self.device), global_valid_tokens=global_tokens
            )
            loss_sum += loss.detach()
        if should_log and dims.dp_enabled:  # the group's ranks' shares of the loss (the groups': with the gradients)
            dist.all_reduce(loss_sum, group=dims.get_mesh("batch").get_group())
        grad_norm = self._sum_gradients_over_groups(loss_sum)
        self.committed = self.dataloader.finish(attempt)  # the lane table, then torchft's should_commit
        if not self.committed:
            self.step = attempt.step - 1  # the trainer's loop adds 1: the same step is attempted again
            return
        self.checkpointer.maybe_wait_for_staging()
        self.optimizers.step()
        self.lr_schedulers.step()
        if should_log:
            self.metrics_processor.log(self.step, float(loss_sum), float(loss_sum), grad_norm, extra_metrics={"lr": lr})

    def _sum_gradients_over_groups(self, loss_sum: torch.Tensor) -> float:
        """Every gradient (this rank's local shard under FSDP: torchft pairs rank d of every group, HSDP's order)
        and the loss in one flat tensor, summed by the Manager over the participants (each term is already divided
        by the step's global tokens); then TorchTitan's clipping. A non-participant's contribution is zeroed by
        torchft. One collective a step instead of one per parameter, for a copy of the gradients in memory."""
        params = [p for m in self.model_parts for p in m.parameters() if p.requires_grad]
        local = [self._local(p.grad) if p.grad is not None else torch.zeros_like(self._local(p)) for p in params]
        flat = torch.cat([t.flatten() for t in local] + [loss_sum.reshape(1).to(local[0].dtype)])
        self.ft_manager.manager.allreduce(flat, reduce_op=ReduceOp.SUM).wait()
        at = 0
        for p, t in zip(params, local):
            t.copy_(flat[at : at + t.numel()].view_as(t))  # a DTensor's to_local() shares its storage
            if p.grad is None:  # no gradient here (a part this group's rows never reached), some from the others
                p.grad = self._like(p, t)
            at += t.numel()
        loss_sum.copy_(flat[-1])
        grad_norm = dist_utils.clip_grad_norm_(
            params,
            self.config.training.max_norm,
            foreach=True,
            pp_mesh=self.parallel_dims.get_optional_mesh("pp"),
            ep_enabled=self.parallel_dims.ep_enabled,
        )
        return float(grad_norm)

    @staticmethod
    def _local(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to_local() if isinstance(tensor, DTensor) else tensor

    @staticmethod
    def _like(param: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
        """A gradient for `param` from this rank's part of it: a DTensor sharded as the parameter is (FSDP)."""
        if not isinstance(param, DTensor):
            return local
        return DTensor.from_local(
            local, param.device_mesh, param.placements, shape=param.shape, stride=param.stride(), run_check=False
        )

    def close(self) -> None:
        super().close()
        self.dataloader.close()
