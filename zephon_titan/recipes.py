"""zephon_titan recipes for TorchTitan's own registry:

    torchrun ... -m torchtitan.train --module zephon_titan.recipes --config job_from_env
    ZEPHON_JOB_CONFIG=configs/llama3_1b/16gpu.toml   (the TOML job file to load)

`job_from_env` loads the TOML named by ZEPHON_JOB_CONFIG, so stock `torchtitan.train`
(and its `--section.key value` overrides) runs any zephon_titan job config.
`llama3_debugmodel` is the CPU debug job, read from configs/debug_cpu.toml (over the demo corpus
in ./demo_out).
"""

from __future__ import annotations

import os
import sys

from zephon_titan.errors import EXIT_USER_ERROR, ConfigError, ZephonError, report_once
from zephon_titan.titan.job import load_job
from zephon_titan.titan.trainer import ZephonTrainer

JOB_CONFIG_ENV = "ZEPHON_JOB_CONFIG"
DEBUG_JOB = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "debug_cpu.toml")


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
    """The demo's CPU debug job, defined once: this repository's configs/debug_cpu.toml."""
    return load_job(DEBUG_JOB).config
