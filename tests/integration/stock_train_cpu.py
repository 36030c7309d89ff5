"""TorchTitan's own entry point (`torchtitan.train`), unchanged, on CPU: run by torchrun for the override tests.

The CPU adjustments of zephon_titan/cpu.py, applied to the config TorchTitan's ConfigManager parses (a stock
recipe plus `--override.imports`), then `torchtitan.train.main()` as is.
"""

from zephon_titan.cpu import install_cpu_device, prepare_cpu_config

install_cpu_device()

from torchtitan import train  # noqa: E402  (after the device shim, on purpose)
from torchtitan.config import ConfigManager  # noqa: E402

_parse = ConfigManager.parse_args
ConfigManager.parse_args = lambda self, *args, **kwargs: prepare_cpu_config(_parse(self, *args, **kwargs))

if __name__ == "__main__":
    train.main()
