"""A job, resolved once: every entry point reads its TOML through `load_job`.

The trainer (`zephon_titan.train`, `zephon_titan.recipes`), the data-only runner,
`plan`, `inspect`, `validate` and `index` all get the same `Job`: the same TorchTitan
config (recipe defaults + TOML + command-line overrides), the same tokenizer (built as
the trainer builds it, special tokens included), the same batch layout. There is no
second reader, so `plan` cannot disagree with the run.

TorchTitan 0.3 configures runs with Python functions only; a job TOML mirrors its config tree.

The file mirrors TorchTitan's config tree. `[model]` picks the recipe: `module` is
what TorchTitan's `--module` takes, `config` a function of its config_registry whose
settings are the defaults, `flavor` optionally swaps in another model size. Every
other table overrides the field of the same name (`[training] steps = 10` is
`--training.steps 10`); `[dataloader]` configures this loader.

    [model]
    module = "llama3"
    config = "llama3_debugmodel"
    flavor = "debugmodel"
    vocab_size = 50304        # optional: resize the model's vocabulary (e.g. for a real tokenizer)

    [training]
    seq_len = 128
    local_batch_size = 4
    global_batch_size = 16
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
from functools import cached_property
from typing import Any

from torchtitan.components.checkpoint import DATALOADER
from torchtitan.distributed.parallel_dims import ParallelDims
from torchtitan.trainer import Trainer

from zephon_titan.config import INHERITED, DataConfig, config_from_dict, eval_rules, short_repr
from zephon_titan.engine import DocumentTokenizer, EngineSpec, build_engine, validate_batch_layout
from zephon_titan.engine.lanes import MAX_GLOBAL_BATCH_SIZE
from zephon_titan.engine.packing import packer_class
from zephon_titan.errors import ConfigError
from zephon_titan.titan.dataloader import loader_config, titan_layout_message
from zephon_titan.titan.tokenizer import load_hf_tokenizer, loader_tokenizer
from zephon_titan.titan.trainer import ZephonTrainer
from zephon_titan.titan.validator import ZephonEvalLoader, ZephonValidator, check_eval_data, eval_message
from zephon_titan.toml_file import load_toml

_MODEL_KEYS = ("module", "config", "flavor", "vocab_size")
# [dataloader] keys that belong elsewhere in the job, and where.
_MISPLACED = {
    "global_batch_size": "set [training] global_batch_size instead (the loader takes it from there)",
    "dataset": "zephon_titan reads [dataloader.sources.<name>] tables, not a dataset name",
    "dataset_path": "zephon_titan reads [dataloader.sources.<name>] paths, not dataset_path",
    # TorchTitan's Hugging Face loader settings (README, "Train on your own files", has the whole mapping).
    "infinite": 'set exhaustion = "repeat" (every source loops, reshuffled: infinite = true) or "redistribute" '
    "(each source read once: the run stops when a lane has read its share)",
    "stopping_strategy": 'set exhaustion = "repeat" (sources loop and the mixture holds) or "redistribute" (each '
    "source read once, an exhausted one leaves the mixture)",
    "pin_memory": "remove it: not needed, a microbatch is a few hundred KB of token ids (the data wait is ~0.4 % "
    "of a GPU step, docs/performance.md)",
    "persistent_workers": "remove it: not needed, num_workers worker processes live for the whole run (lanes are "
    "endless streams, there are no epochs)",
}


@dataclass(eq=False)
class Job:
    """A job file resolved into TorchTitan's config, plus what every entry point derives from it."""

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
        """Rows per microbatch as the trainer passes it to the loader (the PP microbatch size under PP)."""
        parallelism = self.config.parallelism
        if parallelism.pipeline_parallel_degree > 1:
            return parallelism.pipeline_parallel_microbatch_size
        return self.config.training.local_batch_size

    @property
    def tokenizer_setting(self) -> tuple[str, str]:
        """(key, path) of the tokenizer directory: [dataloader] tokenizer_path, else hf_assets_path."""
        if self.data.tokenizer_path:
            return "[dataloader] tokenizer_path", self.data.tokenizer_path
        return "hf_assets_path", self.config.hf_assets_path

    def trainer_tokenizer(self) -> Any:
        """The tokenizer object TorchTitan's trainer builds (`[tokenizer]` config, from hf_assets_path)."""
        return load_hf_tokenizer(self.config.hf_assets_path, "hf_assets_path", self.config.tokenizer)

    @cached_property
    def tokenizer(self) -> DocumentTokenizer:
        """The loader's tokenizer, as ZephonDataLoader builds it from the trainer's (titan/tokenizer.py)."""
        return loader_tokenizer(self.data, self.trainer_tokenizer)

    @cached_property
    def spec(self) -> EngineSpec:
        """The engine spec (opens every source: file sizes, Parquet footers; reads no document)."""
        return build_engine(self.data, self.seq_len, self.tokenizer)

    @property
    def model_vocab_size(self) -> int | None:
        return getattr(self.config.model_spec.model, "vocab_size", None) if self.config.model_spec else None

    @property
    def model_max_seq_len(self) -> int | None:
        """The model's longest sequence (TorchTitan's Decoder.Config.max_seq_len: its RoPE cache), if it says."""
        model = self.config.model_spec.model if self.config.model_spec else None
        try:
            most = getattr(model, "max_seq_len", None)
        except ValueError:  # a decoder without RoPE
            return None
        return most if isinstance(most, int) and not isinstance(most, bool) else None

    def check_model_seq_len(self) -> None:
        """A seq_len above the model's maximum fails when TorchTitan builds the model (after the resume checks);
        say it first, in one line. A resume may change seq_len (docs/changing-a-run.md), up to this bound."""
        most = self.model_max_seq_len
        if most is not None and self.seq_len > most:
            raise ConfigError(
                f"{self.path}: [training] seq_len = {self.seq_len} is above the model's maximum sequence length "
                f"{most} (its RoPE max_seq_len); use seq_len <= {most} or a model configured for longer sequences"
            )

    def check_seq_len_schedule(self) -> None:
        """`[[dataloader.phases]] seq_len` (engine/spec.py checks each against training.seq_len): TorchTitan's CUDA
        graphs (on by default on NVIDIA GPUs) refuse an input of another shape, and context or sequence parallelism
        needs every length divisible as it checks training.seq_len."""
        eras = self.spec.job_eras
        if not eras:
            return
        lengths = ", ".join(f"{e.seq_len} from step {e.start}" for e in eras)
        if not self.config.training.disable_cuda_graphs:
            raise ConfigError(
                f"{self.path}: [[dataloader.phases]] seq_len ({lengths}) needs [training] disable_cuda_graphs = true: "
                "TorchTitan's CUDA graphs refuse inputs of another shape"
            )
        p = self.config.parallelism
        divisor = (p.tensor_parallel_degree if p.enable_sequence_parallel else 1) * (
            2 * p.context_parallel_degree if p.context_parallel_degree > 1 else 1
        )
        odd = [e for e in eras if e.seq_len % divisor]
        if odd:
            raise ConfigError(
                f"{self.path}: [[dataloader.phases]] seq_len {odd[0].seq_len} (from step {odd[0].start}) is not "
                f"divisible by {divisor}, as the context/sequence parallelism needs (TorchTitan checks training.seq_len)"
            )

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

    def check_layout(self, dp_world_size: int) -> int:
        """The batch layout at this data-parallel size; returns rows per lane per step."""
        try:
            return validate_batch_layout(
                self.data.num_lanes, self.global_batch_size, dp_world_size, self.local_batch_size
            )
        except ConfigError as e:
            raise ConfigError(f"{self.path}: {titan_layout_message(e)}") from None

    def check_eval_layout(self, dp_world_size: int) -> None:
        """The eval set's batch layout at this data-parallel size (when validation is on)."""
        validator = self.config.validator
        if not validator.enable:
            return
        data = validator.dataloader.data
        check_eval_data(data)
        try:
            validate_batch_layout(
                data.num_lanes, validator.dataloader.global_batch_size, dp_world_size, self.local_batch_size
            )
        except ConfigError as e:
            raise ConfigError(f"{self.path}: {eval_message(e)}") from None

    def check_model_vocab(self) -> None:
        """A model with fewer embeddings than the tokenizer has ids fails at step 1 with an IndexError."""
        model, ids = self.model_vocab_size, self.tokenizer.vocab_size
        if model is not None and model < ids:
            key, path = self.tokenizer_setting
            raise ConfigError(
                f"{self.path}: the model's vocabulary ({model} embeddings) is smaller than the tokenizer's ({ids} ids, "
                f"{key} = {path!r}); set [model] vocab_size = {_round_up(ids, 64)} or use the model's own tokenizer"
            )

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


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


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
        config.dataloader = _eval_loader_config(eval_table, train_table, train_data, config)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    return config


def _eval_loader_config(
    eval_table: Any, train_table: dict, train_data: DataConfig, validator: ZephonValidator.Config
) -> ZephonEvalLoader.Config:
    """[validator.dataloader]: the [dataloader] settings, overridden by its own; with no sources of its
    own, the held-out part (eval_fraction) of the training sources."""
    if not isinstance(eval_table, dict):
        raise ConfigError(f"validator.dataloader must be a table, got {short_repr(eval_table)}")
    eval_table = dict(eval_table)
    batch = eval_table.pop("global_batch_size", 0)
    if not isinstance(batch, int) or isinstance(batch, bool) or not 0 <= batch <= MAX_GLOBAL_BATCH_SIZE:
        raise ConfigError(
            f"[validator.dataloader] global_batch_size must be an integer in [0, {MAX_GLOBAL_BATCH_SIZE}] (0: "
            f"training's; rows per eval step, held in memory together), got {short_repr(batch)}"
        )
    # How each [dataloader] key reaches the eval set: the schema's Eval rules (config/data.py).
    rules = eval_rules()
    for key in eval_table:
        if rules.get(key, INHERITED).rule == "refused":
            raise ConfigError(f"[validator.dataloader] {key} is not an eval set setting: {rules[key].why}")
    inherited = {k: v for k, v in train_table.items() if rules.get(k, INHERITED).rule in ("inherited", "training")}
    own = {k: rule.default for k, rule in rules.items() if rule.rule == "own" and rule.default is not None}
    merged = {**inherited, **own, **eval_table}
    if "sources" not in eval_table:
        for key in eval_table:
            if rules.get(key, INHERITED).rule == "training":
                raise ConfigError(f"[validator.dataloader] {key}: {rules[key].why}")
        held = {s.name: train_table["sources"][s.name] for s in train_data.sources if s.eval_fraction > 0}
        if not held:
            if validator.enable:
                check_eval_data(DataConfig())
            return ZephonEvalLoader.Config(global_batch_size=batch)  # no eval data: validation stays off
        merged.update(sources=held, split="eval")
    try:
        data = config_from_dict(merged)
        if "packing" in eval_table:  # config/ cannot see the engine's packer registry ([dataloader]'s: at build)
            packer_class(data.packing)
    except ConfigError as e:
        raise ConfigError(eval_message(e)) from None
    if validator.steps == -1 and data.exhaustion == "repeat":
        raise ConfigError(
            "[validator] steps = -1 reads the eval set once, which never ends under [validator.dataloader] exhaustion = "
            '"repeat"; set [validator] steps or exhaustion = "redistribute"'
        )
    return ZephonEvalLoader.Config(data=data, global_batch_size=batch)


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
    for key in model:
        if key not in _MODEL_KEYS:
            raise ConfigError(f"{path}: unknown key {key!r} in [model]; valid keys: {', '.join(_MODEL_KEYS)}")
    if "module" not in model or "config" not in model:
        raise ConfigError(f'{path}: [model] needs `module` (e.g. "llama3") and `config` (e.g. "llama3_debugmodel")')
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
    if "vocab_size" in model:
        vocab = model["vocab_size"]
        if not isinstance(vocab, int) or isinstance(vocab, bool) or not 1 <= vocab <= 1 << 24:
            raise ConfigError(f"{path}: [model] vocab_size must be an integer in [1, 16777216], got {vocab!r}")
        _set_vocab_size(config, vocab, path)
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
    with without_default_load_warning():
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


@contextlib.contextmanager
def without_default_load_warning() -> Iterator[None]:
    """Drop that warning from the root logger (TorchTitan's) while a config or the trainer is built."""

    def keep(record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(_NO_INITIAL_LOAD_PATH)

    root = logging.getLogger()
    root.addFilter(keep)
    try:
        yield
    finally:
        root.removeFilter(keep)


def read_job_config(path: str) -> ZephonTrainer.Config:
    """The TorchTitan config of a job TOML (no command-line overrides)."""
    document = load_toml(path)
    document.pop("job", None)  # free-form description of the run
    if "model" not in document:
        raise ConfigError(f"{path} has no [model] table (module, config, optional flavor)")
    if "dataloader" not in document:
        raise ConfigError(f"{path} has no [dataloader] table")
    if not isinstance(document["model"], dict):
        raise ConfigError(
            f"{path}: model must be a table ([model] with module, config, optional flavor), "
            f"got {short_repr(document['model'])}"
        )
    base = base_config(document.pop("model"), path)
    table = document.pop("dataloader")
    for key, fix in _MISPLACED.items():
        if isinstance(table, dict) and key in table:
            raise ConfigError(f"{path}: [dataloader] {key} is not a loader setting; {fix}")
    try:
        loader = loader_config(table)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    validator = validator_config(document.pop("validator", {}), table, loader.data, base.validator, path)
    _apply(base, document, "the top level", path)
    values = {f.name: getattr(base, f.name) for f in dataclasses.fields(Trainer.Config) if f.init}
    values["dataloader"] = loader
    values["validator"] = validator
    try:
        return ZephonTrainer.Config(**values)
    except (ValueError, AssertionError) as e:
        raise ConfigError(f"{path}: {e}") from None
