"""TOML job configs for TorchTitan 0.3, which configures runs with Python functions only.

The file mirrors TorchTitan's config tree. `[model]` picks the recipe: `module` is
what TorchTitan's `--module` takes, `config` a function of its config_registry whose
settings are the defaults, `flavor` optionally swaps in another model size. Every
other table overrides the field of the same name (`[training] steps = 10` is
`--training.steps 10`); `[dataloader]` configures this loader.

    [model]
    module = "llama3"
    config = "llama3_debugmodel"
    flavor = "debugmodel"

    [training]
    seq_len = 128
    local_batch_size = 4
    global_batch_size = 16
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from typing import Any

from torchtitan.trainer import Trainer

from zephon_titan.config import config_from_dict, load_toml
from zephon_titan.errors import ConfigError
from zephon_titan.titan.dataloader import ZephonDataLoader
from zephon_titan.titan.trainer import ZephonTrainer

_MODEL_KEYS = ("module", "config", "flavor")


def _import_recipe_module(name: str, path: str):
    from torchtitan.models import _supported_models

    candidates = [f"torchtitan.models.{name}"] if name in _supported_models else []
    candidates.append(name)
    for candidate in candidates:
        try:
            return importlib.import_module(candidate)
        except ImportError:
            continue
    raise ConfigError(
        f"{path} [model] module = {name!r} cannot be imported; use one of {sorted(_supported_models)} "
        "or an importable module path"
    )


def base_config(model: dict, path: str) -> Trainer.Config:
    """The recipe named by `[model]`, with its model swapped for `flavor` if given."""
    for key in model:
        if key not in _MODEL_KEYS:
            raise ConfigError(f"{path}: unknown key {key!r} in [model]; valid keys: {', '.join(_MODEL_KEYS)}")
    if "module" not in model or "config" not in model:
        raise ConfigError(f"{path}: [model] needs `module` (e.g. \"llama3\") and `config` (e.g. \"llama3_debugmodel\")")
    package = _import_recipe_module(model["module"], path)
    registry = importlib.import_module(f"{package.__name__}.config_registry") if hasattr(
        package, "__path__") else package
    recipe = getattr(registry, model["config"], None)
    if not callable(recipe):
        choices = [n for n in dir(registry) if not n.startswith("_") and n[0].islower() and callable(getattr(registry, n))]
        raise ConfigError(f"{path}: [model] config = {model['config']!r} is not in {registry.__name__}; choices: {choices}")
    config = recipe()
    if "flavor" in model and model["flavor"] != config.model_spec.flavor:
        model_spec = package.model_registry(model["flavor"])
        config.model_spec = model_spec
        vocab = model_spec.model.vocab_size
        for _, loss, _, _ in config.loss.traverse(object, recurse=True):
            if hasattr(loss, "global_vocab_size"):
                loss.global_vocab_size = vocab
    return config


def _apply(target: Any, table: dict, where: str, path: str) -> None:
    """Set `table`'s values on the dataclass `target`, recursing into nested configs."""
    names = [f.name for f in dataclasses.fields(target) if not f.name.startswith("_")]
    for key, value in table.items():
        if key not in names or key == "model_spec":
            close = difflib.get_close_matches(key, names, n=1)
            hint = f"did you mean {close[0]!r}?" if close else "see TorchTitan's Trainer.Config for the valid keys"
            raise ConfigError(f"{path}: unknown key {key!r} in {where}; {hint}")
        current = getattr(target, key)
        if dataclasses.is_dataclass(current) and isinstance(value, dict):
            _apply(current, value, f"[{where.strip('[]')}.{key}]" if where != "the top level" else f"[{key}]", path)
            continue
        if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        ok_types = (type(current),) if current is not None else (object,)
        if isinstance(current, bool) != isinstance(value, bool) or not isinstance(value, ok_types):
            raise ConfigError(
                f"{path}: {where} {key} must be {type(current).__name__} (like {current!r}), got {value!r}"
            )
        setattr(target, key, value)


def load_job_config(path: str) -> ZephonTrainer.Config:
    document = load_toml(path)
    document.pop("job", None)  # free-form description of the run
    if "model" not in document:
        raise ConfigError(f"{path} has no [model] table (module, config, optional flavor)")
    if "dataloader" not in document:
        raise ConfigError(f"{path} has no [dataloader] table")
    base = base_config(document.pop("model"), path)
    try:
        loader = config_from_dict(document.pop("dataloader"), cls=ZephonDataLoader.Config)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    _apply(base, document, "the top level", path)
    values = {f.name: getattr(base, f.name) for f in dataclasses.fields(Trainer.Config) if f.init}
    values["dataloader"] = loader
    try:
        return ZephonTrainer.Config(**values)
    except (ValueError, AssertionError) as e:
        raise ConfigError(f"{path}: {e}") from None
