"""Does the loader keep a GPU fed? One run of TorchTitan's trainer, timed per step.

    torchrun --standalone --nproc_per_node 1 scripts/gpu_check.py --loader zephon --out zephon.json
    torchrun --standalone --nproc_per_node 1 scripts/gpu_check.py --loader premade --out premade.json
    python scripts/gpu_check.py --report zephon.json premade.json

(`bash scripts/gpu_check.sh` runs all three; `--cpu` runs the same path on CPU as a dry run.)

The job: Llama-3 1B (the llama3_8b recipe's 1B flavor, as configs/llama3_1b) on one GPU,
rows of 2048 tokens, 64 rows per step in microbatches of 8, over the demo corpus (built by
the project, so nothing needs downloading), 64 lanes, 2 worker processes. `--loader zephon`
trains on our loader; `--loader premade` on one real microbatch yielded again and again (what
the trainer does when data costs nothing). Reported per run: median step time, the fraction of
each step spent waiting for the next microbatch, and the
host-to-device copy time of one microbatch from pageable and from pinned memory.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "examples"))

GPU_JOB = """
hf_assets_path = "{tokenizer}"
dump_folder = "{dump}"
[model]
module = "llama3"
config = "llama3_8b"
flavor = "1B"
vocab_size = 2048
[training]
seq_len = 2048
local_batch_size = 8
global_batch_size = 64
steps = {steps}
[checkpoint]
enable = false
[metrics]
log_freq = 5
[dataloader]
num_lanes = 64
num_workers = {workers}
ledger = false
"""

# The CPU dry run: the same code path with the CPU debug model, tiny rows and 2 lanes.
CPU_JOB = """
hf_assets_path = "{tokenizer}"
dump_folder = "{dump}"
[model]
module = "llama3"
config = "llama3_debugmodel"
[training]
seq_len = 64
local_batch_size = 2
global_batch_size = 4
steps = {steps}
[checkpoint]
enable = false
[metrics]
log_freq = 1
[dataloader]
num_lanes = 2
num_workers = {workers}
ledger = false
"""

SOURCES = """
[dataloader.sources.code]
paths = ["{root}/code/*.parquet"]
weight = 0.3
[dataloader.sources.prose]
paths = ["{root}/prose/*.jsonl"]
weight = 0.7
block_bytes = 32768
"""


def write_job(root: str, steps: int, cpu: bool, workers: int = 2) -> str:
    import demo

    demo.build_corpus(root)
    text = (CPU_JOB if cpu else GPU_JOB).format(
        tokenizer=os.path.join(root, "tokenizer"), dump=os.path.join(root, "run"), steps=steps, workers=workers
    ) + SOURCES.format(root=root)
    path = os.path.join(root, "gpu_check.toml")
    with open(path, "w") as f:
        f.write(text)
    return path


def _timed_classes():
    """The trainer and a pre-made-batch loader, as subclasses of ours (defined after torch is set up)."""
    import torch
    from torchtitan.tools.logging import logger

    from zephon_titan.titan.dataloader import ZephonDataLoader
    from zephon_titan.titan.trainer import ZephonTrainer

    class PremadeLoader(ZephonDataLoader):
        """One real microbatch from our loader, yielded forever: data that costs nothing. It hands out the same
        rows at every step, so it counts the steps it stands in for (the checkpoint manager checks that the loader
        handed out the trainer's steps) and writes no ledger."""

        @dataclasses.dataclass(kw_only=True, slots=True)
        class Config(ZephonDataLoader.Config):
            pass

        def __init__(self, config, *, dp_world_size: int, **kwargs):
            config.ledger = False
            super().__init__(config, dp_world_size=dp_world_size, **kwargs)
            self.microbatches = 0
            self.per_step = config.global_batch_size // dp_world_size // self.local_batch_size

        @property
        def steps_done(self) -> int:
            return self.microbatches // self.per_step

        def __iter__(self) -> Iterator:
            batch = next(super().__iter__())
            self.close()
            while True:
                self.microbatches += 1
                yield batch

    class TimedTrainer(ZephonTrainer):
        @dataclasses.dataclass(kw_only=True, slots=True)
        class Config(ZephonTrainer.Config):
            pass

        def __init__(self, config):
            super().__init__(config)
            self.step_seconds: list[float] = []
            self.wait_seconds: list[float] = []
            self.first_batch = None
            self._waited = 0.0

        def batch_generator(self, data_iterable):
            inner = super().batch_generator(data_iterable)
            while True:
                started = time.perf_counter()
                batch = next(inner)  # the time the trainer waits for the next microbatch
                self._waited += time.perf_counter() - started
                if self.first_batch is None:
                    self.first_batch = batch
                yield batch

        def train_step(self, data_iterator):
            self._waited = 0.0
            started = time.perf_counter()
            super().train_step(data_iterator)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.step_seconds.append(time.perf_counter() - started)
            self.wait_seconds.append(self._waited)
            logger.info(f"gpu_check: step {self.step} {self.step_seconds[-1]:.4f} s, data wait {self._waited:.4f} s")

    return TimedTrainer, PremadeLoader


def _copy_seconds(batch, device, pinned: bool, repeats: int = 20) -> float | None:
    """Median time to move one microbatch (inputs, positions, labels) to the device."""
    import torch

    if device.type == "cpu":
        return None
    tensors = [batch[0]["input"], batch[0]["positions"], batch[1]]
    if pinned:
        tensors = [t.pin_memory() for t in tensors]
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        started = time.perf_counter()
        for t in tensors:
            t.to(device, non_blocking=pinned)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def run(args) -> dict:
    from zephon_titan.cpu import use_sdpa_attention

    if args.cpu:
        from zephon_titan.cpu import install_cpu_device, prepare_cpu_config

        install_cpu_device()
        prepare = prepare_cpu_config
    else:
        prepare = use_sdpa_attention if args.attn == "sdpa" else None
    from zephon_titan.titan.job import load_job

    root = args.workdir or tempfile.mkdtemp(prefix="gpu_check_")
    job = load_job(write_job(root, args.steps, args.cpu, args.workers), [], prepare)
    job.preflight(int(os.environ.get("WORLD_SIZE", "1")))
    trainer_class, premade_class = _timed_classes()
    config = job.config
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init}
    if args.loader == "premade":
        loader = config.dataloader
        values["dataloader"] = premade_class.Config(
            **{f.name: getattr(loader, f.name) for f in dataclasses.fields(loader) if f.init}
        )
    config = trainer_class.Config(**values)
    trainer = config.build()
    try:
        trainer.train()
        return _result(args, trainer.device, trainer.first_batch, trainer.step_seconds, trainer.wait_seconds,
                       job.global_batch_size * job.seq_len, trainer="torchtitan")  # fmt: skip
    finally:
        trainer.close()


def build_loader(root: str, steps: int, cpu: bool, workers: int):
    """Our loader for the job gpu_check writes, built as the trainer builds it, without the trainer:
    the [dataloader] table, TorchTitan's HuggingFaceTokenizer, `ZephonDataLoader.Config.build(...)`.
    Returns the loader and the job's TOML document."""
    from zephon_titan.titan.dataloader import loader_config
    from zephon_titan.titan.tokenizer import load_hf_tokenizer
    from zephon_titan.toml_file import load_toml

    document = load_toml(write_job(root, steps, cpu, workers))
    training = document["training"]
    config = loader_config(document["dataloader"])  # ledger = false in the job
    config.global_batch_size = training["global_batch_size"]  # what ZephonTrainer copies in
    loader = config.build(
        dp_world_size=1,
        dp_rank=0,
        tokenizer=load_hf_tokenizer(document["hf_assets_path"]),
        seq_len=training["seq_len"],
        local_batch_size=training["local_batch_size"],
    )
    return loader, document


def run_plain(args) -> dict:
    """The same job without TorchTitan's trainer (scripts/plain_loop.py says why and what)."""
    import plain_loop
    import torch

    root = args.workdir or tempfile.mkdtemp(prefix="gpu_check_")
    loader, document = build_loader(root, args.steps, args.cpu, args.workers)
    training = document["training"]
    device = torch.device("cpu" if args.cpu else "cuda")
    try:
        batches = iter(loader)
        if args.loader == "premade":
            batch = next(batches)
            loader.close()
            batches = iter(lambda: batch, None)
        microbatches = training["global_batch_size"] // training["local_batch_size"]
        shape = plain_loop.TINY if args.cpu else plain_loop.Shape(vocab_size=document["model"]["vocab_size"])
        timed = plain_loop.train(batches, training["steps"], microbatches, shape, device)
    finally:
        loader.close()
    tokens_per_step = training["global_batch_size"] * training["seq_len"]
    return _result(args, device, timed["first_batch"], timed["step_seconds"], timed["wait_seconds"],
                   tokens_per_step, trainer="plain PyTorch loop")  # fmt: skip


def _result(args, device, batch, step_seconds, wait_seconds, tokens_per_step: int, trainer: str) -> dict:
    import torch

    steady = step_seconds[2:] or step_seconds  # the first steps compile and warm up
    waits = wait_seconds[2:] or wait_seconds
    result = {
        "loader": args.loader,
        "workers": args.workers,
        "trainer": trainer,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else str(device),
        "attention": "sdpa" if args.cpu or trainer != "torchtitan" else args.attn,
        "torch": torch.__version__,
        "steps": len(step_seconds),
        "median_step_s": statistics.median(steady),
        "data_wait_fraction": sum(waits) / sum(steady),
        "copy_pageable_s": _copy_seconds(batch, device, pinned=False),
        "copy_pinned_s": _copy_seconds(batch, device, pinned=True),
        "tokens_per_step": tokens_per_step,
    }
    if int(os.environ.get("RANK", "0")) == 0:
        with open(args.out, "w") as f:
            json.dump(result, f)
    return result


def report(paths: list[str]) -> str:
    rows = [json.load(open(p)) for p in paths]

    def ms(v):
        return "n/a (CPU)" if v is None else f"{v * 1000:.2f} ms"

    lines = [
        "| loader | trainer | device (torch, attention) | median step | data wait (of step) | tokens/s | H2D copy, pageable | H2D copy, pinned |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['loader']}, {r.get('workers', 2)} workers | {r.get('trainer', 'torchtitan')} | {r['device']} ({r.get('torch', '?')}, {r.get('attention', '?')}) | {r['median_step_s']:.3f} s | {r['data_wait_fraction']:.1%} | "
            f"{r['tokens_per_step'] / r['median_step_s']:,.0f} | {ms(r['copy_pageable_s'])} | {ms(r['copy_pinned_s'])} |"
        )
    premade = [r for r in rows if r["loader"] == "premade"]
    lines += [""] if premade else []
    for r in rows:
        if premade and r["loader"] == "zephon":
            ratio = r["median_step_s"] / premade[0]["median_step_s"]
            lines.append(
                f"step time with our loader ({r.get('workers', 2)} workers) / with pre-made batches: {ratio:.3f}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--loader", choices=["zephon", "premade"], default="zephon", help="what feeds the trainer")
    p.add_argument("--steps", type=int, default=40, help="optimizer steps (the first 2 are not timed)")
    p.add_argument("--cpu", action="store_true", help="dry run on CPU: the debug model, tiny rows")
    p.add_argument(
        "--trainer",
        choices=["torchtitan", "plain"],
        default="torchtitan",
        help="plain: our loader feeds a Llama-3 1B-shaped model in a plain loop (torch older than 2.14)",
    )
    p.add_argument("--workers", type=int, default=2, help="[dataloader] num_workers (0: in process)")
    p.add_argument("--attn", choices=["flex", "sdpa"], default="flex", help="the model's attention (GPU run)")
    p.add_argument("--workdir", help="where the demo corpus and job go (default: a new temporary directory)")
    p.add_argument("--out", default="gpu_check.json", help="result file (JSON)")
    p.add_argument("--report", nargs="+", metavar="RESULT", help="print the table of these result files")
    args = p.parse_args(argv)
    if args.report:
        print(report(args.report))
        return 0
    print(json.dumps(run_plain(args) if args.trainer == "plain" else run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
