"""Run only the data path of a job under torchrun (gloo, no model, no GPU) with real DCP checkpoints.

    torchrun --nproc_per_node 16 -m zephon_titan.titan.data_run --job.config_file configs/X.toml \
        --steps 12 --save-at 4 --checkpoint ckpt/ --ledger run16.jsonl
    torchrun --nproc_per_node 8 -m zephon_titan.titan.data_run --job.config_file configs/X.toml \
        --steps 12 --resume ckpt/step-4 --ledger run8.jsonl

Every rank builds the loader exactly as the trainer does (`dataloader.build(dp_world_size=,
dp_rank=, tokenizer=, seq_len=, local_batch_size=)`), consumes each step's microbatches,
and rank 0 writes the batch ledger. `--builtin` runs TorchTitan's own HuggingFace text
loader over the first JSONL source instead (to show it cannot resume on another size).

Memory, for many ranks on one machine (scripts/elastic_scale.py runs 64 in 24 GiB). A data rank imports
neither TorchTitan's trainer nor any model code (~240 MB RSS, ~150 MB of it private, per process), yet
the job is resolved by `load_job`, the trainer's own reader (recipe defaults + TOML + overrides), never
by a second one: rank 0 runs it in a short-lived child process and sends every rank the facts the
loader is built from (`DataJob`). When the job's [tokenizer] is not TorchTitan's stock
HuggingFaceTokenizer (a recipe's own class, whose import may pull in model code), every rank runs
`load_job` itself instead (correct, heavier), and rank 0 says so. What remains is mostly torch's own
import (~270 MB private per process); `torchrun --start-method fork --run-path
zephon_titan/titan/data_run.py ...` forks the ranks from torchrun's process, which has imported torch
already, so they share those pages.
"""

from __future__ import annotations

import argparse
import os
import pickle
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.stateful import Stateful

from zephon_titan.engine import validate_batch_layout
from zephon_titan.errors import EXIT_USER_ERROR, ConfigError, ZephonError, report_once
from zephon_titan.loader.checkpoint import DATALOADER, TRAIN_STATE
from zephon_titan.loader.ledger import gather_ledger_entry, open_ledger
from zephon_titan.loader.save_failure import SAVE_ERRORS, save_failure
from zephon_titan.loader.state import restore
from zephon_titan.log_ranks import quiet_other_ranks
from zephon_titan.titan.dataloader import ZephonDataLoader, titan_layout_message
from zephon_titan.titan.tokenizer import load_hf_tokenizer

if TYPE_CHECKING:
    from zephon_titan.titan.job import Job  # imports torchtitan.trainer: only the child process (or fallback)


class StepCounter(Stateful):
    def __init__(self):
        self.step = 0

    def state_dict(self):
        # A tensor, not an int: DCP stores other values as bytes and rebuilds them by unpickling.
        return {"step": torch.tensor(self.step, dtype=torch.int64)}

    def load_state_dict(self, state_dict):
        self.step = int(state_dict["step"])


@dataclass(frozen=True)
class DataJob:
    """What a data rank needs of a job, taken from the `Job` that load_job resolved (DataJob.of)."""

    path: str
    dataloader: ZephonDataLoader.Config
    seq_len: int
    global_batch_size: int
    local_batch_size: int
    hf_assets_path: str
    tokenizer: Any
    """The job's [tokenizer] config; None for TorchTitan's stock HuggingFaceTokenizer (built here by default)."""

    @classmethod
    def of(cls, job: Job) -> DataJob:
        from torchtitan.components.tokenizer import HuggingFaceTokenizer

        stock = type(job.config.tokenizer) is HuggingFaceTokenizer.Config
        return cls(
            job.path,
            job.config.dataloader,
            job.seq_len,
            job.global_batch_size,
            job.local_batch_size,
            job.config.hf_assets_path,
            None if stock else job.config.tokenizer,
        )

    def check_layout(self, dp_world_size: int) -> None:
        """Job.check_layout: every rank is a data-parallel rank here."""
        data = self.dataloader.data
        try:
            validate_batch_layout(data.num_lanes, self.global_batch_size, dp_world_size, self.local_batch_size)
        except ConfigError as e:
            raise ConfigError(f"{self.path}: {titan_layout_message(e)}") from None

    def trainer_tokenizer(self) -> Any:
        """Job.trainer_tokenizer: the tokenizer object TorchTitan's trainer builds from hf_assets_path."""
        return load_hf_tokenizer(self.hf_assets_path, "hf_assets_path", self.tokenizer)

    def build_loader(self, dp_world_size: int, dp_rank: int, tokenizer: Any) -> ZephonDataLoader:
        """The loader of one data-parallel rank, built as the trainer builds it (`dataloader.build`)."""
        return self.dataloader.build(
            dp_world_size=dp_world_size,
            dp_rank=dp_rank,
            tokenizer=tokenizer,
            seq_len=self.seq_len,
            local_batch_size=self.local_batch_size,
        )


def resolve_job(path: str, overrides: list[str]) -> DataJob:
    """The job as load_job resolves it, on every rank. Rank 0 runs load_job in a child process (it imports
    the trainer and the recipe's model code, ~0.9 GB RSS, then exits) and broadcasts the result (a pickle of
    our own child's output, never of a file)."""
    if dist.get_world_size() == 1 or "torchtitan.trainer" in sys.modules:
        return _load_job(path, overrides)  # one rank, or the trainer imported already: a child saves nothing
    result: list[Any] = [_resolve_in_child(path, overrides) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(result, src=0)
    kind, value = result[0]
    if kind == "error":
        raise ConfigError(value)
    if kind == "fallback":
        if dist.get_rank() == 0:
            print(f"data_run: {value}; every rank resolves the job itself (imports the trainer)", flush=True)
        return _load_job(path, overrides)
    return value


def _load_job(path: str, overrides: list[str]) -> DataJob:
    from zephon_titan.titan.job import load_job  # imports torchtitan.trainer and the recipe's model code

    return DataJob.of(load_job(path, overrides))


def _resolve_in_child(path: str, overrides: list[str]) -> tuple[str, Any]:
    code = "import sys; from zephon_titan.titan.data_run import child_main; child_main(sys.argv[1:])"
    child = subprocess.run([sys.executable, "-c", code, path, *overrides], stdout=subprocess.PIPE)
    if child.returncode != 0 or not child.stdout:
        return "error", f"resolving {path} failed in a child process (exit {child.returncode}; its output is above)"
    return pickle.loads(child.stdout)


def child_main(argv: list[str]) -> None:
    """The child of resolve_job: load_job, then ("job", DataJob) | ("fallback", why) | ("error", message)
    pickled on stdout. Anything else printed (TorchTitan's log) goes to stderr."""
    from torchtitan.tools.logging import init_logger

    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    init_logger()
    try:
        job = _load_job(argv[0], argv[1:])
        result: tuple[str, Any] = ("job", job)
        if job.tokenizer is not None:
            result = (
                "fallback",
                f"[tokenizer] is {type(job.tokenizer).__qualname__}, not the stock HuggingFaceTokenizer",
            )
    except ZephonError as e:
        result = ("error", str(e))
    out.write(pickle.dumps(result))
    out.close()


def _memory_mb() -> list[float]:
    """[peak RSS, private memory now] of this process, in MB. RSS counts the shared libraries (torch's
    alone ~0.2 GB) once per rank although every rank on a host maps the same pages; private memory
    (USS: pages no other process maps, from smaps_rollup; Linux only, else 0) is what each rank adds."""
    private = 0.0
    if os.path.exists("/proc/self/smaps_rollup"):
        with open("/proc/self/smaps_rollup") as f:
            private = sum(int(line.split()[1]) for line in f if line.startswith(("Private_Clean:", "Private_Dirty:")))
    return [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, private / 1024]


def _builtin_loader(job: DataJob, world: int, rank: int, tokenizer):
    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader

    directory = os.path.dirname(job.dataloader.data.sources[-1].paths[0])
    config = HuggingFaceTextDataLoader.Config(dataset="c4_test", dataset_path=directory, infinite=True)
    return config.build(
        dp_world_size=world,
        dp_rank=rank,
        tokenizer=tokenizer,
        seq_len=job.seq_len,
        local_batch_size=job.local_batch_size,
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--job.config_file", dest="config", required=True, help="the job TOML, as for zephon_titan.train")
    p.add_argument("--steps", type=int, required=True, help="run until this step (inclusive)")
    p.add_argument("--save-at", type=int, action="append", default=[], help="save a DCP checkpoint after this step")
    p.add_argument("--checkpoint", help="folder for saved checkpoints (step-N subfolders)")
    p.add_argument("--resume", help="a step-N checkpoint folder to resume from")
    p.add_argument("--ledger", help="ledger.jsonl to write (rank 0)")
    p.add_argument("--local-batch-size", type=int, help="override [training] local_batch_size")
    p.add_argument("--builtin", action="store_true", help="use TorchTitan's built-in loader instead")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from torchtitan.tools.logging import init_logger

    init_logger()  # the loader's notes (tokenizer backend, a resume's changes) as the trainer prints them
    quiet_other_ranks()  # once per job: rank 0's

    dist.init_process_group("gloo", timeout=timedelta(minutes=10))
    world, rank = dist.get_world_size(), dist.get_rank()
    try:
        overrides = ["--training.local_batch_size", str(args.local_batch_size)] if args.local_batch_size else []
        job = resolve_job(args.config, overrides)
        job.check_layout(world)  # every rank is a data-parallel rank here
        tokenizer = job.trainer_tokenizer()
        microbatches = job.global_batch_size // (job.local_batch_size * world)
        if args.builtin:
            loader = _builtin_loader(job, world, rank, tokenizer)
        else:
            loader = job.build_loader(world, rank, tokenizer)
        counter = StepCounter()
        if args.resume:
            # The loader's resume sequence (loader/state.restore): no checkpoint byte runs. TorchTitan's
            # own loader (--builtin) stores its state as pickles, which it unpickles itself.
            states = {DATALOADER: loader, TRAIN_STATE: counter}
            restore(states, args.resume, None if args.builtin else loader)
        ledger = open_ledger(args.ledger, resume_step=counter.step) if args.ledger and rank == 0 else None
        batches = iter(loader)
        ledger_seconds = data_seconds = 0.0
        first_step = counter.step
        while counter.step < args.steps:
            started = time.perf_counter()
            try:
                for _ in range(microbatches):
                    next(batches)
            except StopIteration:
                print(f"data_run: rank {rank} stopped after step {counter.step}: data exhausted", flush=True)
                break
            data_seconds += time.perf_counter() - started
            counter.step += 1
            if not args.builtin and loader.config.ledger:
                started = time.perf_counter()
                entry = gather_ledger_entry(loader, counter.step, dist.group.WORLD)
                if ledger is not None and entry is not None:
                    ledger.write(entry)
                ledger_seconds += time.perf_counter() - started
            if counter.step in args.save_at:
                path = os.path.join(args.checkpoint, f"step-{counter.step}")
                try:
                    dcp.save({DATALOADER: loader, TRAIN_STATE: counter}, checkpoint_id=path)
                except SAVE_ERRORS as e:  # a full or vanished disk: one line, not one DCP traceback per rank
                    raise save_failure(e, path) from None
        steps = max(counter.step - first_step, 1)
        memory = torch.tensor(_memory_mb() * 2, dtype=torch.float64)  # [rss, private] max, then summed
        dist.all_reduce(memory[:2], op=dist.ReduceOp.MAX)
        dist.all_reduce(memory[2:], op=dist.ReduceOp.SUM)
        if rank == 0:
            rss, private, rss_sum, private_sum = memory.tolist()
            print(
                f"data_run: {steps} steps on {world} ranks; rank 0 spent {data_seconds / steps * 1e3:.1f} ms "
                f"per step producing its batches, {ledger_seconds / steps * 1e3:.2f} ms per step on the ledger "
                f"(gather + write); peak RSS {rss:.0f} MB max per rank, {rss_sum:.0f} MB summed; "
                f"private {private:.0f} MB max per rank, {private_sum:.0f} MB summed",
                flush=True,
            )
    except ZephonError as e:
        report_once(e)
        return EXIT_USER_ERROR
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
