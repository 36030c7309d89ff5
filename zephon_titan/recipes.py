"""zephon_titan recipes for TorchTitan's own registry:

    torchrun ... -m torchtitan.train --module zephon_titan.recipes --config job_from_env
    ZEPHON_JOB_CONFIG=configs/llama3_1b/16gpu.toml   (the TOML job file to load)

`job_from_env` loads the TOML named by ZEPHON_JOB_CONFIG, so stock `torchtitan.train`
(and its `--section.key value` overrides) runs any zephon_titan job config.
`llama3_debugmodel` is the CPU debug job (configs/debug_cpu.toml) built in Python,
over the demo corpus in ./demo_out.
"""

from __future__ import annotations

import dataclasses
import os
import sys

from torchtitan.models.llama3.config_registry import llama3_debugmodel as _titan_debugmodel

from zephon_titan.config import DataConfig, SourceConfig
from zephon_titan.errors import EXIT_USER_ERROR, ConfigError, ZephonError, report_once
from zephon_titan.titan.dataloader import ZephonDataLoader
from zephon_titan.titan.job import load_job
from zephon_titan.titan.trainer import ZephonTrainer
from zephon_titan.titan.validator import ZephonValidator

JOB_CONFIG_ENV = "ZEPHON_JOB_CONFIG"


def job_from_env() -> ZephonTrainer.Config:
    """The job named by ZEPHON_JOB_CONFIG, checked for this world size before TorchTitan builds anything
    (TorchTitan's later `--section.key` overrides are checked again when the loader is built)."""
    try:
        path = os.environ.get(JOB_CONFIG_ENV)
        if not path:
            raise ConfigError(f"set {JOB_CONFIG_ENV} to a zephon_titan TOML job file, e.g. configs/debug_cpu.toml")
        job = load_job(path)
        job.preflight(int(os.environ.get("WORLD_SIZE", "1")))
        return job.config
    except ZephonError as e:  # TorchTitan would print it with a traceback per rank
        report_once(e)
        sys.exit(EXIT_USER_ERROR)


def llama3_debugmodel() -> ZephonTrainer.Config:
    base = _titan_debugmodel()
    base.hf_assets_path = "demo_out/tokenizer"
    base.training.seq_len = 128
    base.training.local_batch_size = 4
    base.training.global_batch_size = 16
    skip = ("dataloader", "validator")
    values = {f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.init and f.name not in skip}
    values["validator"] = ZephonValidator.Config(freq=base.validator.freq)  # off: the demo holds nothing out
    values["dataloader"] = ZephonDataLoader.Config(
        data=DataConfig(
            num_lanes=8,
            seed=2026,
            sources=[
                SourceConfig(name="code", paths=["demo_out/code/*.parquet"], weight=0.3),
                SourceConfig(name="prose", paths=["demo_out/prose/*.jsonl"], weight=0.7, block_bytes=32768),
            ],
        )
    )
    return ZephonTrainer.Config(**values)
