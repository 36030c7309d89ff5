"""One replica group of TorchTitan's FT trainer on CPU, run by torchrun for test_titan_ft_trainer.py:
`zephon_titan.train_cpu` plus the harness's hooks, which only watch and wait.

ZEPHON_FT_HARNESS (JSON): {"barrier": path prefix, "groups": R, "kill_step": s, "victim": g, "trainer": "zephon" or
"stock", optionally "crash": [g, s, r]: rank r of group g exits inside step s (test_ft_launch.py: torchrun restarts
the group)}. "zephon" is ZephonFtTrainer (titan/ft_trainer.py); "stock" is the negative control, TorchTitan's own FT
path as it is: FaultTolerantTrainer with its TorchFTManager (asynchronous quorum, `get_dp_info`'s fixed share per
group), TorchFTOptimizersContainer (the quorum in zero_grad, should_commit in step) and this package's plain loader
over that share. Per attempt the replica prints one line `ZEPHON_FT_EVENT {...}` (examples/ft_run.py's event
format: step, attempt, participants, rank, commit, the rows' ids, a weight, the loader's begin and finish seconds)
and appends it to attempts.group<G>.jsonl beside the group's ledger. The victim's attempt of kill_step is 2 s long
(after its quorum, before its all-reduce) so that the launcher's SIGKILL lands inside it; every group waits for all
groups before its first quorum, and the survivors for a restarted group to ask for its first quorum
(`<barrier>.hold` until `<barrier>.rejoined`): the harness's pauses, never the loader's.
"""

import glob
import hashlib
import json
import os
import time
from dataclasses import dataclass, fields

from zephon_titan.cpu import install_cpu_device, prepare_cpu_config

install_cpu_device()

import torch  # noqa: E402  (after the device shim, on purpose)
from torchtitan.components.loss import ChunkedLossWrapper  # noqa: E402
from torchtitan.components.optimizer import OptimizersContainer  # noqa: E402
from torchtitan.experiments.torchft.config.job_config import FaultTolerance  # noqa: E402
from torchtitan.experiments.torchft.optimizer import TorchFTOptimizersContainer  # noqa: E402
from torchtitan.experiments.torchft.trainer import FaultTolerantTrainer  # noqa: E402
from torchtitan.trainer import Trainer  # noqa: E402

from zephon_titan.titan.dataloader import ZephonDataLoader  # noqa: E402
from zephon_titan.titan.ft_trainer import ZephonFtTrainer  # noqa: E402
from zephon_titan.train import main  # noqa: E402


def row_id(row) -> str:  # examples/ft_run.py's
    return hashlib.sha256(row.to_bytes()).hexdigest()[:16]


class StockFtTrainer(FaultTolerantTrainer):
    """TorchTitan's FT trainer as it is, with the plain loader, its rows recorded (the control)."""

    @dataclass(kw_only=True, slots=True)
    class Config(FaultTolerantTrainer.Config):
        pass

    def __init__(self, config):
        super().__init__(config)
        if isinstance(self.loss_fn, ChunkedLossWrapper):  # TorchTitan 0.3.0's FT trainer omits it (ft_trainer.py)
            self.loss_fn.set_lm_head(self.model_parts[0].lm_head)
            self.model_parts[0]._skip_lm_head = True
        self.rows_taken: list = []
        self.committed: bool | None = None
        manager = self.ft_manager.manager
        should_commit = manager.should_commit

        def recorded(*args, **kwargs):  # called once per step by torchft's Optimizer.step
            self.committed = should_commit(*args, **kwargs)
            return self.committed

        manager.should_commit = recorded

    def batch_generator(self, data_iterable):
        for batch in super().batch_generator(data_iterable):
            self.rows_taken += list(self.dataloader.last_rows)
            yield batch


def stock_config(config: ZephonFtTrainer.Config) -> StockFtTrainer.Config:
    """The same job as TorchTitan's own FT path takes it."""
    values = {f.name: getattr(config, f.name) for f in fields(Trainer.Config) if f.init}
    loader = ZephonDataLoader.Config(data=config.dataloader.data, ledger=False)
    loader.global_batch_size = config.training.global_batch_size
    values["dataloader"] = loader
    values["fault_tolerance"] = FaultTolerance(
        **{f.name: getattr(config.fault_tolerance, f.name) for f in fields(FaultTolerance)}
    )
    optimizer = object.__new__(TorchFTOptimizersContainer.Config)
    for f in fields(OptimizersContainer.Config):
        setattr(optimizer, f.name, getattr(config.optimizer, f.name))
    values["optimizer"] = optimizer
    # TorchTitan's FT checkpoint manager gives torchft its state dict functions (healing) only when checkpoints are
    # enabled, and then saves each group's loader state every step: its design, kept. No full save before the end.
    checkpoint = config.checkpoint
    checkpoint.enable, checkpoint.interval, checkpoint.enable_ft_dataloader_checkpoints = True, 10_000, True
    values["checkpoint"] = checkpoint
    return StockFtTrainer.Config(**values)


def _install_harness(cls, harness: dict) -> None:
    # Restarted by the test (ZEPHON_FT_RESTARTED) or by torchrun (--max-restarts: a later life of the group).
    restarted = os.environ.get("ZEPHON_FT_RESTARTED") == "1" or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0"
    barrier, rank = harness["barrier"], int(os.environ.get("RANK", "0"))
    crash = harness.get("crash")  # [group, step, rank]: that rank exits inside that step, in its group's first life
    stock = cls is StockFtTrainer
    original_init, original_step = cls.__init__, cls.train_step
    original_forward = cls.forward_backward_step

    def init(self, config):
        original_init(self, config)
        self.group = config.fault_tolerance.replica_id
        folder = os.path.join(config.dump_folder, config.checkpoint.folder)  # beside the group's ledger
        os.makedirs(folder, exist_ok=True)
        self.events = open(os.path.join(folder, f"attempts.group{self.group}{f'.dp{rank}' if rank else ''}.jsonl"), "a")
        self.healed_seen, self.timings, self.tries = 0, {"begin_s": 0.0, "finish_s": 0.0}, {}
        if not stock:
            loader = self.dataloader
            begin, finish = loader.begin, loader.finish

            def timed(name, fn):
                def call(*args):
                    t = time.perf_counter()
                    try:
                        return fn(*args)
                    finally:
                        self.timings[name] = time.perf_counter() - t

                return call

            loader.begin, loader.finish = timed("begin_s", begin), timed("finish_s", finish)
        if restarted:
            return
        everyone = [f"{barrier}.up.{g}" for g in range(harness["groups"])]
        open(everyone[self.group], "w").close()
        while not all(map(os.path.exists, everyone)):  # every group up before the first quorum
            time.sleep(0.05)

    def emit(self, line: dict) -> None:
        line["group"], line["dp"] = self.group, rank
        text = json.dumps(line)
        print(f"ZEPHON_FT_EVENT {text}", flush=True)
        self.events.write(text + "\n")
        self.events.flush()

    def forward_backward_step(self, **kwargs):
        if self.fresh:  # the attempt's first microbatch: after its quorum, before its all-reduce
            self.fresh = False
            step = self.attempt.step if not stock else self.ft_manager.manager.current_step() + 1
            emit(self, {"event": "start", "step": step})
            if self.group == harness["victim"] and step == harness["kill_step"] and not restarted:
                time.sleep(2.0)  # the launcher's SIGKILL lands here
            if crash == [self.group, step, rank] and not restarted:
                os._exit(1)  # a rank failing inside the step (after its quorum): torchrun restarts the group
        return original_forward(self, **kwargs)

    def train_step(self, data_iterator):
        if restarted and not getattr(self, "_asked", False):
            # Up and about to ask for its first quorum: the launcher lets the survivors ask for theirs, so the
            # lighthouse has this group waiting (written earlier, a loaded machine let the survivors finish first).
            self._asked = True
            open(f"{barrier}.ready.{self.group}.{os.getpid()}", "w").close()
        while os.path.exists(f"{barrier}.hold") and not os.path.exists(f"{barrier}.rejoined"):
            time.sleep(0.05)
        if crash and self.group != crash[0] and self.step >= crash[1] + 2:  # the crashed group's new life asks first
            while not glob.glob(f"{barrier}.ready.{crash[0]}.*"):
                time.sleep(0.05)
        self.fresh, self.rows_taken = True, []
        original_step(self, data_iterator)
        manager = self.ft_manager.manager
        if stock:
            step = manager.current_step() + (0 if self.committed else 1)
            self.tries[step] = tried = self.tries.get(step, 0) + 1
            rows = self.rows_taken
        else:
            steps, attempt = self.dataloader.steps, self.attempt
            for was, now in steps.healed[self.healed_seen :]:
                emit(self, {"event": "healed", "from": was, "to": now})
            self.healed_seen = len(steps.healed)
            step, tried, rows = attempt.step, attempt.attempt, attempt.rows
        weight = [p for p in self.model_parts[0].parameters()][-1]
        emit(
            self,
            {
                "event": "end",
                "step": step,
                "attempt": tried,
                "participants": manager.num_participants(),
                "rank": manager.participating_rank(),
                "commit": bool(self.committed),
                "rows": [row_id(r) for r in rows],
                "weight": round(float(weight.detach().full_tensor().flatten()[0]), 6)
                if hasattr(weight, "full_tensor")
                else round(float(weight.detach().flatten()[0]), 6),
                "begin_s": round(self.timings["begin_s"], 4),
                "finish_s": round(self.timings["finish_s"], 4),
            },
        )

    cls.__init__ = init
    cls.train_step = train_step
    cls.forward_backward_step = forward_backward_step


def stock_main() -> None:
    """zephon_titan.train's lifecycle with the job as TorchTitan's own FT path takes it."""
    import sys

    from torchtitan.tools.logging import init_logger

    from zephon_titan.train import parse_args

    init_logger()
    job = parse_args(sys.argv[1:], prepare_cpu_config)
    trainer = stock_config(job.config).build()
    try:
        trainer.train()
    finally:
        trainer.close()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    settings = json.loads(os.environ["ZEPHON_FT_HARNESS"])
    if settings["trainer"] == "stock":
        _install_harness(StockFtTrainer, settings)
        stock_main()
    else:
        _install_harness(ZephonFtTrainer, settings)
        main(prepare=prepare_cpu_config)
