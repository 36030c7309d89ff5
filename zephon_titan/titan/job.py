"""A job resolved through TorchTitan 0.3: `load_job` gives the trainer, `validate` and `run` the same `Job`: TorchTitan's
config (recipe defaults + TOML + command-line overrides), the tokenizer as the trainer builds it, the batch layout.

It starts from job_file.py's torch-free first pass (the TOML, `[model]`'s keys, `[dataloader]`, the eval set); what
is TorchTitan's is here: the recipe, its model and parallelism, the other tables' keys. `[model]` picks the recipe:
`module` is what TorchTitan's `--module` takes, `config` a function of its config_registry whose settings are the
defaults, `flavor` optionally another model size, `vocab_size` a resized vocabulary. Every other table overrides
the field of the same name (`[training] steps = 10` is `--training.steps 10`); `[dataloader]` configures this
loader. Commands that need only the loader's values (plan, inspect, where) read them from the file when it states
them (job_view.py), with the same values.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import importlib
import logging
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from torchtitan.components.checkpoint import DATALOADER
from torchtitan.distributed.parallel_dims import ParallelDims
from torchtitan.trainer import Trainer

from zephon_titan.config import DataConfig, short_repr
from zephon_titan.errors import ConfigError
from zephon_titan.job_file import check_model, eval_settings, read_job_file
from zephon_titan.job_view import LoaderJob
from zephon_titan.titan.dataloader import ZephonDataLoader
from zephon_titan.titan.tokenizer import load_hf_tokenizer
from zephon_titan.titan.trainer import ZephonTrainer
from zephon_titan.titan.validator import ZephonEvalLoader, ZephonValidator


@dataclass(eq=False)
class Job(LoaderJob):
    """A job file resolved into TorchTitan's config, plus what every entry point derives from it (job_view.py:
    what the loader's commands need, which a job file stating it answers without TorchTitan)."""

    path: str
    config: ZephonTrainer.Config

    @property
    def data(self) -> DataConfig:
        return self.config.dataloader.data

    @property
    def seq_len(self) -> int:
        return self.config.training.seq_len

    @property
    def global_batch_size(self) -> int:
        return self.config.training.global_batch_size

    @property
    def local_batch_size(self) -> int:
        parallelism = self.config.parallelism
        if parallelism.pipeline_parallel_degree > 1:
            return parallelism.pipeline_parallel_microbatch_size
        return self.config.training.local_batch_size

    @property
    def hf_assets_path(self) -> str:
        return self.config.hf_assets_path

    @property
    def training_steps(self) -> int:
        return self.config.training.steps

    @property
    def eval_data(self) -> DataConfig:
        return self.config.validator.dataloader.data

    @property
    def eval_global_batch_size(self) -> int:
        return self.config.validator.dataloader.global_batch_size

    @property
    def eval_steps(self) -> int:
        return self.config.validator.steps

    def trainer_tokenizer(self) -> Any:
        """The tokenizer object TorchTitan's trainer builds (`[tokenizer]` config, from hf_assets_path)."""
        return load_hf_tokenizer(self.config.hf_assets_path, "hf_assets_path", self.config.tokenizer)

    @property
    def model_vocab_size(self) -> int | None:
        return getattr(self.config.model_spec.model, "vocab_size", None) if self.config.model_spec else None

    @property
    def model_max_seq_len(self) -> int | None:
        model = self.config.model_spec.model if self.config.model_spec else None
        try:
            most = getattr(model, "max_seq_len", None)
        except ValueError:  # a decoder without RoPE
            return None
        return most if isinstance(most, int) and not isinstance(most, bool) else None

    @property
    def cuda_graphs(self) -> bool:
        return not self.config.training.disable_cuda_graphs

    @property
    def seq_len_divisor(self) -> int:
        p = self.config.parallelism
        return (p.tensor_parallel_degree if p.enable_sequence_parallel else 1) * (
            2 * p.context_parallel_degree if p.context_parallel_degree > 1 else 1
        )

    @property
    def eval_enabled(self) -> bool:
        return self.config.validator.enable

    @property
    def eval_freq(self) -> int:
        return self.config.validator.freq

    def dp_world_size(self, world_size: int) -> int:
        """Data-parallel size (dp_replicate x dp_shard, TorchTitan's "batch" degree) of a run on `world_size`
        processes, resolved by TorchTitan's own ParallelDims (dp_shard = -1: the rest); a ConfigError naming the
        degrees when TorchTitan refuses them."""
        p = self.config.parallelism
        try:
            dims = ParallelDims.from_config(p, world_size)  # validates; builds no mesh, needs no process group
            fits = dims.dp_replicate * dims.dp_shard * dims.non_data_parallel_size == world_size  # also under -O
        except (AssertionError, ValueError, ZeroDivisionError):
            fits = False
        if not fits:
            raise ConfigError(
                f"{self.path}: [parallelism] degrees do not fit {world_size} processes: data_parallel_replicate_degree "
                f"{p.data_parallel_replicate_degree} x data_parallel_shard_degree {p.data_parallel_shard_degree} x "
                f"context {p.context_parallel_degree} x tensor {p.tensor_parallel_degree} x pipeline "
                f"{p.pipeline_parallel_degree} must equal {world_size}"
            )
        return dims.dp_replicate * dims.dp_shard

    def checkpoint_to_resume(self) -> str | None:
        """The local DCP folder whose loader state TorchTitan's CheckpointManager.load will restore, found by its
        rule: the step-N folder of `checkpoint.load_step` (-1: the latest with a `.metadata` or an HF
        `model.safetensors.index.json`) under dump_folder/checkpoint.folder, else `initial_load_path` unless it loads
        the model only; None when the run starts fresh, the loader is not restored, or the checkpoint is remote
        (checked when loaded). A step folder that does not exist is returned as is: TorchTitan refuses it, and so
        does train.check_resume. Pinned against CheckpointManager.load by tests/unit/test_titan_rules.py."""
        ck = self.config.checkpoint
        if not ck.enable or DATALOADER in ck.exclude_from_loading:
            return None
        folder = os.path.join(self.config.dump_folder, ck.folder)
        if "://" in folder:
            return None
        step = ck.load_step if ck.load_step != -1 else _latest_step(folder)
        if step == -1:
            if ck.initial_load_path and not ck.initial_load_model_only and not ck.initial_load_in_hf:
                return None if "://" in ck.initial_load_path else ck.initial_load_path
            return None
        path = os.path.join(folder, f"step-{step}")
        if step == 0 and os.path.isdir(path):  # TorchTitan loads the model only from step 0
            return None
        return path

    def preflight(self, world_size: int) -> None:
        """Every check that can fail before training, in the order a user would fix them."""
        self.check_layout(self.dp_world_size(world_size))
        self.check_eval_layout(self.dp_world_size(world_size))
        if self.data.tokenizer_path:
            self.trainer_tokenizer()  # TorchTitan builds it from hf_assets_path in any case
        self.check_model_vocab()  # loads the loader's tokenizer: a wrong path is named here
        self.check_model_seq_len()
        self.check_seq_len_schedule()


_STEP_FOLDER = re.compile(r"step-(\d+)")
# What makes a step folder a checkpoint for TorchTitan's CheckpointManager._find_load_step (a DCP or an HF save).
_CHECKPOINT_FILES = (".metadata", "model.safetensors.index.json")


def _latest_step(folder: str) -> int:
    """The step CheckpointManager._find_load_step finds (its regex, searched; -1: none)."""
    names = os.listdir(folder) if os.path.isdir(folder) else []
    steps = [
        int(m.group(1))
        for name in names
        if (m := _STEP_FOLDER.search(name))
        and any(os.path.isfile(os.path.join(folder, name, f)) for f in _CHECKPOINT_FILES)
    ]
    return max(steps, default=-1)


def validator_config(
    table: Any, train_table: dict, train_data: DataConfig, recipe: Any, path: str
) -> ZephonValidator.Config:
    """The [validator] table (TorchTitan's enable, freq, steps) and its [validator.dataloader] eval set."""
    if not isinstance(table, dict):
        raise ConfigError(
            f"{path}: validator must be a table ([validator] with enable, freq, steps), got {short_repr(table)}"
        )
    table = dict(table)
    eval_table = table.pop("dataloader", {})
    # The recipe's freq and enable are kept; its steps count microbatches of one rank, ours eval steps.
    config = ZephonValidator.Config(enable=recipe.enable, freq=recipe.freq)
    _apply(config, table, "[validator]", path)
    if config.steps < 1 and config.steps != -1:
        raise ConfigError(f"{path}: [validator] steps must be >= 1 (eval steps) or -1 (the whole eval set once)")
    if config.freq < 1:
        raise ConfigError(f"{path}: [validator] freq must be >= 1 (validate every freq steps)")
    try:
        settings = eval_settings(eval_table, train_table, train_data, config.enable, config.steps)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    batch, data = settings.global_batch_size, settings.data
    eval_loader = ZephonEvalLoader.Config(global_batch_size=batch)  # no eval data: validation stays off
    if data is not None:
        eval_loader = ZephonEvalLoader.Config(data=data, global_batch_size=batch)
    config.dataloader = eval_loader
    return config


def _import_recipe_module(name: str, path: str):
    from torchtitan.models import _supported_models

    candidates = [f"torchtitan.models.{name}"] if name in _supported_models else []
    candidates.append(name)
    causes = []
    for candidate in candidates:
        try:
            return importlib.import_module(candidate)
        except ImportError as e:  # keep the cause: the module may exist and fail to import something else
            causes.append(f"{candidate}: {e}")
    raise ConfigError(
        f"{path} [model] module = {name!r} cannot be imported ({'; '.join(causes)}); use one of "
        f"{sorted(_supported_models)} or an importable module path"
    )


def base_config(model: dict, path: str) -> Trainer.Config:
    """The recipe named by `[model]`, with its model swapped for `flavor` if given."""
    check_model(model, path)
    package = _import_recipe_module(model["module"], path)
    registry = (
        importlib.import_module(f"{package.__name__}.config_registry") if hasattr(package, "__path__") else package
    )
    recipe = getattr(registry, model["config"], None)
    if not callable(recipe):
        choices = [
            n for n in dir(registry) if not n.startswith("_") and n[0].islower() and callable(getattr(registry, n))
        ]
        raise ConfigError(
            f"{path}: [model] config = {model['config']!r} is not in {registry.__name__}; choices: {choices}"
        )
    config = recipe()
    if "flavor" in model and model["flavor"] != config.model_spec.flavor:
        config.model_spec = package.model_registry(model["flavor"])
        _set_vocab_size(config, config.model_spec.model.vocab_size, path)
    if "vocab_size" in model:  # its bounds: check_model
        _set_vocab_size(config, model["vocab_size"], path)
    return config


def _set_vocab_size(config: Trainer.Config, vocab: int, path: str) -> None:
    """Resize the model's embeddings, output layer and loss to `vocab` ids."""
    model = config.model_spec.model
    if not hasattr(model, "vocab_size"):
        raise ConfigError(f"{path}: [model] vocab_size: this model's config has no vocab_size to set")
    model.vocab_size = vocab
    for part, attr in (("tok_embeddings", "num_embeddings"), ("lm_head", "out_features")):
        if hasattr(getattr(model, part, None), attr):
            setattr(getattr(model, part), attr, vocab)
    for _, loss, _, _ in config.loss.traverse(object, recurse=True):
        if hasattr(loss, "global_vocab_size"):
            loss.global_vocab_size = vocab


def _apply(target: Any, table: dict, where: str, path: str) -> None:
    """Set `table`'s values on the dataclass `target`, recursing into nested configs."""
    names = [f.name for f in dataclasses.fields(target) if not f.name.startswith("_")]
    for key, value in table.items():
        if key not in names or key == "model_spec":
            close = difflib.get_close_matches(key, names, n=1)
            hint = f"did you mean {close[0]!r}?" if close else "see TorchTitan's Trainer.Config for the valid keys"
            raise ConfigError(f"{path}: unknown key {key!r} in {where}; {hint}")
        current = getattr(target, key)
        table_name = f"[{where.strip('[]')}.{key}]" if where != "the top level" else f"[{key}]"
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(
                    f"{path}: {table_name[1:-1]} must be a table ({table_name} with its settings), "
                    f"got {short_repr(value)}"
                )
            _apply(current, value, table_name, path)
            continue
        if isinstance(value, dict) and current is not None and not isinstance(current, dict):
            raise ConfigError(f"{path}: {where} {key} is a setting, not a table; write {key} = <value> in {where}")
        if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        ok_types = (type(current),) if current is not None else (object,)
        if isinstance(current, bool) != isinstance(value, bool) or not isinstance(value, ok_types):
            raise ConfigError(
                f"{path}: {where} {key} must be {type(current).__name__} (like {short_repr(current)}), got {short_repr(value)}"
            )
        setattr(target, key, value)


def load_job(path: str, overrides: Sequence[str] = (), prepare: Callable | None = None) -> Job:
    """Read the job TOML (+ `extends`), then `prepare` (the CPU shims), then command-line overrides
    (`--section.key value`, as TorchTitan takes them)."""
    with without_inapplicable_warnings():
        config = read_job_config(path)
        if prepare is not None:
            config = prepare(config)
        if overrides:
            import tyro
            from torchtitan.config import ConfigManager
            from torchtitan.config.manager import custom_registry

            ConfigManager.register_tyro_rules(custom_registry)
            config = tyro.cli(type(config), args=list(overrides), default=config, registry=custom_registry)
    return Job(os.path.abspath(path), config)


# TorchTitan warns with this each time a checkpoint config is built with its own default
# (initial_load_model_only = True) and no initial_load_path: on every job, every rank, several times, as
# the first line of every run and every failing one. It says that a default does nothing; we drop it.
_NO_INITIAL_LOAD_PATH = "initial_load_model_only=True has no effect without an initial_load_path"
# And this when hf_assets_path (often a tokenizer-only folder) has no safetensors index: it says how an HF-format
# save would be sharded, which matters only to a job that saves or loads in HF format.
_NO_SAFETENSORS_INDEX = "model.safetensors.index.json not found at hf_assets_path"


@contextlib.contextmanager
def without_inapplicable_warnings(config: Any = None) -> Iterator[None]:
    """Drop those warnings from the root logger (TorchTitan's) while a config or the trainer is built; the
    safetensors one only when `config` (a trainer config) neither saves nor loads in HF format."""
    checkpoint = getattr(config, "checkpoint", None)
    hf = checkpoint is None or checkpoint.last_save_in_hf or checkpoint.initial_load_in_hf
    dropped = (_NO_INITIAL_LOAD_PATH,) if hf else (_NO_INITIAL_LOAD_PATH, _NO_SAFETENSORS_INDEX)

    def keep(record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(dropped)

    root = logging.getLogger()
    root.addFilter(keep)
    try:
        yield
    finally:
        root.removeFilter(keep)


def read_job_config(path: str) -> ZephonTrainer.Config:
    """The TorchTitan config of a job TOML (no command-line overrides), from the first pass's reading."""
    file = read_job_file(path)  # the file, [model]'s keys, [dataloader] and the eval set: no TorchTitan yet
    base = base_config(file.model, path)
    loader = ZephonDataLoader.Config(data=file.data, ledger=file.ledger)
    validator = validator_config(file.validator, file.dataloader, file.data, base.validator, path)
    document = dict(file.document)
    fault_tolerance = document.pop("fault_tolerance", None)  # TorchTitan's FT trainer's table, not the recipe's
    _apply(base, document, "the top level", path)
    values = {f.name: getattr(base, f.name) for f in dataclasses.fields(Trainer.Config) if f.init}
    values["dataloader"] = loader
    values["validator"] = validator
    try:
        config = ZephonTrainer.Config(**values)
    except (ValueError, AssertionError) as e:
        raise ConfigError(f"{path}: {e}") from None
    if fault_tolerance is None:
        return config
    if not isinstance(fault_tolerance, dict):
        raise ConfigError(f"{path}: fault_tolerance must be a table ([fault_tolerance] with its settings)")
    from zephon_titan.titan.ft_trainer import ZephonFtTrainer  # imports TorchTitan's torchft integration

    try:
        return ZephonFtTrainer.Config.of(config, fault_tolerance)  # type: ignore[return-value]
    except (ConfigError, ValueError, TypeError) as e:
        raise ConfigError(f"{path}: {e}") from None
