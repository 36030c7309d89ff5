"""Train on CPU (no GPU needed): the CPU debug job, a first try with your own data, the demo.

    torchrun --standalone --nproc_per_node 2 -m zephon_titan.train_cpu --job.config_file configs/debug_cpu.toml

`zephon_titan.train` with the CPU adjustments of zephon_titan/cpu.py (device "cpu" with gloo,
SDPA attention, replicate-only data parallelism). The data path is the GPU path's: same rows,
same checkpoints, same ledger.
"""

from zephon_titan.cpu import install_cpu_device, prepare_cpu_config

install_cpu_device()

from zephon_titan.train import main  # noqa: E402  (after the device shim, on purpose)

if __name__ == "__main__":
    main(prepare=prepare_cpu_config)
