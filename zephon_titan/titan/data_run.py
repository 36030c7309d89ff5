"""Run only the data path of a job under torchrun (gloo, no model, no GPU) with real DCP checkpoints.

    torchrun --nproc_per_node 16 -m zephon_titan.titan.data_run --job.config_file configs/X.toml \
        --steps 12 --save-at 4 --checkpoint ckpt/ --ledger run16.jsonl
    torchrun --nproc_per_node 8 -m zephon_titan.titan.data_run --job.config_file configs/X.toml \
        --steps 12 --resume ckpt/step-4 --ledger run8.jsonl

Every rank builds the loader exactly as the trainer does (`dataloader.build(dp_world_size=,
dp_rank=, tokenizer=, seq_len=, local_batch_size=)`), consumes each step's microbatches,
and rank 0 writes the batch ledger. `--builtin` runs TorchTitan's own HuggingFace text
loader over the first JSONL source instead (to show it cannot resume on another size).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.stateful import Stateful

from zephon_titan.engine.ledger import LedgerWriter
from zephon_titan.errors import EXIT_USER_ERROR, ZephonError, report_once
from zephon_titan.titan.job import Job, load_job
from zephon_titan.titan.ledger import gather_ledger_entry
from zephon_titan.titan.loader_state import restore


class StepCounter(Stateful):
    def __init__(self):
        self.step = 0

    def state_dict(self):
        # A tensor, not an int: DCP stores other values as bytes and rebuilds them by unpickling.
        return {"step": torch.tensor(self.step, dtype=torch.int64)}

    def load_state_dict(self, state_dict):
        self.step = int(state_dict["step"])


def _builtin_loader(job: Job, world: int, rank: int, tokenizer):
    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader

    directory = os.path.dirname(job.data.sources[-1].paths[0])
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

    dist.init_process_group("gloo", timeout=timedelta(minutes=10))
    world, rank = dist.get_world_size(), dist.get_rank()
    try:
        overrides = ["--training.local_batch_size", str(args.local_batch_size)] if args.local_batch_size else []
        job = load_job(args.config, overrides)
        job.check_layout(world)  # every rank is a data-parallel rank here
        tokenizer = job.trainer_tokenizer()
        microbatches = job.global_batch_size // (job.local_batch_size * world)
        if args.builtin:
            loader = _builtin_loader(job, world, rank, tokenizer)
        else:
            loader = job.config.dataloader.build(
                dp_world_size=world,
                dp_rank=rank,
                tokenizer=tokenizer,
                seq_len=job.seq_len,
                local_batch_size=job.local_batch_size,
            )
        counter = StepCounter()
        if args.resume:
            # The loader's resume sequence (titan/loader_state.restore): no checkpoint byte runs. TorchTitan's
            # own loader (--builtin) stores its state as pickles, which it unpickles itself.
            states = {"dataloader": loader, "train_state": counter}
            restore(states, args.resume, None if args.builtin else loader)
        ledger = LedgerWriter(args.ledger, resume_step=counter.step) if args.ledger and rank == 0 else None
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
                dcp.save({"dataloader": loader, "train_state": counter}, checkpoint_id=path)
        steps = max(counter.step - first_step, 1)
        rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024] * 2, dtype=torch.float64)
        dist.all_reduce(rss[:1], op=dist.ReduceOp.MAX)
        dist.all_reduce(rss[1:], op=dist.ReduceOp.SUM)
        if rank == 0:
            print(
                f"data_run: {steps} steps on {world} ranks; rank 0 spent {data_seconds / steps * 1e3:.1f} ms "
                f"per step producing its batches, {ledger_seconds / steps * 1e3:.2f} ms per step on the ledger "
                f"(gather + write); peak RSS {rss[0]:.0f} MB max per rank, {rss[1]:.0f} MB summed",
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
