"""`zephon_titan.train` on CPU (tests, demo): torchrun ... -m zephon_titan.testing.cpu_train --job.config_file X."""

from zephon_titan.testing.cpu import install_cpu_device, prepare_cpu_config

install_cpu_device()

from zephon_titan.train import main  # noqa: E402  (after the device shim, on purpose)

if __name__ == "__main__":
    main(prepare=prepare_cpu_config)
