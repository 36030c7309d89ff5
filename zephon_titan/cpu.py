"""Run TorchTitan's trainer on CPU with gloo (`zephon_titan.train_cpu`); the GPU path never imports this.

Three adjustments: device detection answers "cpu" and the
CPU device module gets the few calls the trainer and memory monitor make; attention
uses SDPA (FlexAttention has no CPU backward); data parallelism is replicate-only
(FSDP's PREMUL_SUM reduce is not implemented by gloo).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import types
import warnings


def install_cpu_device() -> None:
    """Must run before torchtitan.trainer is imported (it reads the device type at import)."""
    if "torchtitan.tools.utils" in sys.modules:
        raise RuntimeError("install_cpu_device() must run before torchtitan is imported")
    import torch
    import torch._utils

    torch._utils._get_available_device_type = lambda: "cpu"
    cpu = torch.cpu
    defaults = {
        "set_device": lambda device: None,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "memory_stats": lambda device=None: {},
        "reset_peak_memory_stats": lambda device=None: None,
        "empty_cache": lambda: None,
        "get_device_name": lambda device=None: "cpu",
        "get_device_properties": lambda device=None: types.SimpleNamespace(
            name="cpu", total_memory=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        ),
    }
    for name, fn in defaults.items():
        if not hasattr(cpu, name):
            setattr(cpu, name, fn)
    # torch.cpu.current_device() answers "cpu"; TorchTitan passes it as a barrier device id.
    # TorchTitan needs an int here, where torch's stub says str.
    cpu.current_device = lambda: 0  # type: ignore[assignment,return-value]
    quiet_gpu_notes()


# Lines a CPU run prints on every start about GPUs it does not have: DTensor's CPU-mesh notes, TorchTitan's
# lspci probe and A100 peak-flops fallback (and the MFU it computes from it), its NCCL setting, the GPU memory of
# the model (-0.00GiB on a CPU), CUDA graphs. Nothing a CPU user can act on; our lines drown.
_GPU_NOTES = (
    "Error running lspci",
    "Peak flops undefined for: cpu",
    "ENV[TORCH_NCCL_ASYNC_ERROR_HANDLING]",
    "Peak FLOPS used for computing MFU",
    "CPU memory usage for model",
    "CUDA graph capture is only supported on NVIDIA CUDA",
)
# The step line's GPU figures (TorchTitan's metrics.py: memory, tflops, mfu, each after its color code): on a CPU
# they are the A100 fallback's and a GPU memory of -0.00GiB. The metrics it records keep them.
_GPU_FIGURES = re.compile(r"(?:\x1b\[[0-9;]*m)?(?:memory|tflops|mfu): [^\s\x1b]*\s*")


def _cpu_console(record: logging.LogRecord) -> bool:
    """Drop the GPU notes; the step line without its GPU figures."""
    message = record.getMessage()
    if message.startswith(_GPU_NOTES):
        return False
    if "step:" in message and "mfu:" in message:
        record.msg, record.args = _GPU_FIGURES.sub("", message).rstrip(), ()
    return True


def quiet_gpu_notes() -> None:
    warnings.filterwarnings("ignore", message=r"DTensor .* may not have complete support on cpu device mesh")
    logging.getLogger().addFilter(_cpu_console)


def use_sdpa_attention(config):
    """Swap the model's Flex attention for SDPA (Flex needs a GPU compiler)."""
    from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention

    for _, _, parent, attr in list(config.model_spec.model.traverse(FlexAttention.Config)):
        if isinstance(parent, list):
            parent[attr] = ScaledDotProductAttention.Config()
        elif parent is not None:
            setattr(parent, attr, ScaledDotProductAttention.Config())
    return config


def prepare_cpu_config(config):
    """SDPA attention and replicate-only data parallelism over all ranks."""
    use_sdpa_attention(config)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    config.parallelism.data_parallel_replicate_degree = world
    config.parallelism.data_parallel_shard_degree = 1
    return config
