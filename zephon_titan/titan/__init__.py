"""TorchTitan 0.3 integration: the loader, the trainer subclass, TOML job configs."""
