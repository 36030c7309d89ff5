"""A job file read without torch or TorchTitan: the first pass of every command that reads a job.

`read_job_file` reads the TOML (`[job] extends` chains, toml_file.py), checks `[model]`'s keys, converts
`[dataloader]` and `[validator.dataloader]` into DataConfigs (config/) and keeps what the file states of
the trainer's settings the loader reads. It imports neither torch nor TorchTitan (~1 s), so a missing file,
a TOML error or a `[dataloader]` mistake is one line before TorchTitan's ~15-60 s of imports, with the very
message TorchTitan's reader (titan/job.py, which starts from this pass) gives. What needs the recipe
(its defaults, the model, unknown keys of TorchTitan's tables) is checked there.

The job tables' names are TorchTitan's (`[training] global_batch_size`, ...): TITAN_TERMS puts the engine's
batch layout errors in those words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeGuard

from zephon_titan.config import INHERITED, DataConfig, config_from_dict, eval_rules, short_repr
from zephon_titan.engine import LayoutError
from zephon_titan.engine.lanes import MAX_GLOBAL_BATCH_SIZE
from zephon_titan.engine.packing import packer_class
from zephon_titan.errors import ConfigError
from zephon_titan.toml_file import load_toml

MODEL_KEYS = ("module", "config", "flavor", "vocab_size")
MAX_VOCAB_SIZE = 1 << 24
# [dataloader] keys that belong elsewhere in the job, and where.
MISPLACED = {
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
# TorchTitan's Validator.Config.steps default (the recipe's is not kept: ours counts eval steps, not microbatches).
DEFAULT_EVAL_STEPS = -1

# The batch layout's terms as TorchTitan's config names them (its trainer's `training` fields and the parallelism
# degrees behind the data-parallel size): the engine's LayoutErrors get them here, once.
TITAN_TERMS = {
    "global_batch": "training.global_batch_size",
    "global_batch_key": "[training] global_batch_size",
    "global_batch_short": "global_batch_size",
    "local_batch": "training.local_batch_size",
    "local_batch_short": "local_batch_size",
    "dp_size": "data_parallel_replicate_degree x data_parallel_shard_degree",
    "unset_why": ". TorchTitan's default (-1) means local_batch_size x data-parallel size, which changes with the "
    "number of GPUs and so would change the data of every step",
}


def titan_layout_message(error: ConfigError, terms: dict[str, str] | None = None) -> str:
    """A batch layout error in TorchTitan's words (`terms` overriding some, e.g. the eval set's keys)."""
    if isinstance(error, LayoutError):
        return error.in_terms({**TITAN_TERMS, **(terms or {})})
    return str(error)


def check_eval_data(data: DataConfig) -> None:
    if not data.sources:
        raise ConfigError(
            "[validator] enable = true, but there is no eval data: set eval_fraction on a [dataloader.sources.<name>] "
            "(documents held out of training) or add [validator.dataloader.sources.<name>] tables with eval files"
        )


def eval_message(error: ConfigError) -> str:
    """A [dataloader] (or batch layout) error raised for the eval set, naming the table it came from."""
    eval_batch = "[validator.dataloader] global_batch_size"
    text = titan_layout_message(error, {"global_batch": eval_batch, "global_batch_key": eval_batch})
    if "[dataloader" in text:
        return text.replace("[dataloader", "[validator.dataloader")
    return text if "[validator.dataloader" in text else f"[validator.dataloader]: {text}"


def loader_settings(table: Any) -> tuple[DataConfig, bool]:
    """The [dataloader] table: the data settings (config/) and the TorchTitan loader's own `ledger`."""
    if not isinstance(table, dict):
        raise ConfigError(f"[dataloader] must be a table, got {short_repr(table)}")
    table = dict(table)
    ledger = table.pop("ledger", True)
    if not isinstance(ledger, bool):
        raise ConfigError(f"[dataloader] ledger must be true or false, got {short_repr(ledger)}")
    return config_from_dict(table), ledger


@dataclass(frozen=True)
class EvalSettings:
    """[validator.dataloader] read: the eval set's data (None: no eval data) and rows per eval step (0: training's)."""

    data: DataConfig | None
    global_batch_size: int


def eval_settings(
    eval_table: Any, train_table: dict, train_data: DataConfig, enable: bool | None, steps: int
) -> EvalSettings:
    """[validator.dataloader]: the [dataloader] settings, overridden by its own; with no sources of its
    own, the held-out part (eval_fraction) of the training sources. `enable` None: not known yet (the
    recipe's), its check is left to TorchTitan's reader."""
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
            if enable:
                check_eval_data(DataConfig())
            return EvalSettings(None, batch)  # no eval data: validation stays off
        merged.update(sources=held, split="eval")
    try:
        data = config_from_dict(merged)
        if "packing" in eval_table:  # config/ cannot see the engine's packer registry ([dataloader]'s: at build)
            packer_class(data.packing)
    except ConfigError as e:
        raise ConfigError(eval_message(e)) from None
    if steps == -1 and data.exhaustion == "repeat":
        raise ConfigError(
            "[validator] steps = -1 reads the eval set once, which never ends under [validator.dataloader] exhaustion = "
            '"repeat"; set [validator] steps or exhaustion = "redistribute"'
        )
    return EvalSettings(data, batch)


def check_validator_values(table: dict, path: str) -> None:
    """[validator] steps and freq, as TorchTitan's reader checks them once set (titan/job.py)."""
    steps, freq = table.get("steps"), table.get("freq")
    if _is_int(steps) and steps < 1 and steps != -1:
        raise ConfigError(f"{path}: [validator] steps must be >= 1 (eval steps) or -1 (the whole eval set once)")
    if _is_int(freq) and freq < 1:
        raise ConfigError(f"{path}: [validator] freq must be >= 1 (validate every freq steps)")


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class JobFile:
    """A job file after the first pass: its tables, the loader's settings converted and checked."""

    path: str
    """As given (messages name it so)."""
    document: dict[str, Any]
    """The merged TOML without [job], [model], [dataloader] and [validator]: TorchTitan's own tables."""
    model: dict[str, Any]
    dataloader: dict[str, Any]
    validator: dict[str, Any]
    data: DataConfig
    ledger: bool
    eval: EvalSettings

    def stated(self, table: str | None, key: str, kind: type) -> Any:
        """The value the file gives `key` (in `[table]`; None: the top level) if it is a `kind`, else None
        (absent: the recipe's; of another type: TorchTitan's reader names the mistake)."""
        where = self.document if table is None else self.document.get(table, {})
        value = where.get(key) if isinstance(where, dict) else None
        if kind is int:
            return value if _is_int(value) else None
        return value if isinstance(value, kind) else None

    def stated_validator(self, key: str, kind: type) -> Any:
        value = self.validator.get(key)
        return value if isinstance(value, kind) and (kind is bool or not isinstance(value, bool)) else None


def read_job_file(path: str) -> JobFile:
    """The first pass: every check of the job that needs neither torch nor TorchTitan, in the order TorchTitan's
    reader (titan/job.py `read_job_config`, which starts here) makes them."""
    document = load_toml(path)
    document.pop("job", None)  # free-form description of the run
    if "model" not in document:
        raise ConfigError(f"{path} has no [model] table (module, config, optional flavor)")
    if "dataloader" not in document:
        raise ConfigError(f"{path} has no [dataloader] table")
    model = document.pop("model")
    check_model(model, path)
    table = document.pop("dataloader")
    for key, fix in MISPLACED.items():
        if isinstance(table, dict) and key in table:
            raise ConfigError(f"{path}: [dataloader] {key} is not a loader setting; {fix}")
    try:
        data, ledger = loader_settings(table)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    validator = document.pop("validator", {})
    if not isinstance(validator, dict):
        raise ConfigError(
            f"{path}: validator must be a table ([validator] with enable, freq, steps), got {short_repr(validator)}"
        )
    check_validator_values(validator, path)
    enable, steps = validator.get("enable"), validator.get("steps")
    try:
        settings = eval_settings(
            validator.get("dataloader", {}),
            table,
            data,
            enable if isinstance(enable, bool) else None,
            steps if _is_int(steps) else DEFAULT_EVAL_STEPS,
        )
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    for name in ("training", "parallelism"):  # the tables the loader's settings come from
        if name in document and not isinstance(document[name], dict):
            raise ConfigError(
                f"{path}: {name} must be a table ([{name}] with its settings), got {short_repr(document[name])}"
            )
    return JobFile(path, document, model, table, validator, data, ledger, settings)


def check_model(model: Any, path: str) -> None:
    """[model]: its keys, the two it needs and vocab_size's bounds (whether the recipe exists: TorchTitan's)."""
    if not isinstance(model, dict):
        raise ConfigError(
            f"{path}: model must be a table ([model] with module, config, optional flavor), got {short_repr(model)}"
        )
    for key in model:
        if key not in MODEL_KEYS:
            raise ConfigError(f"{path}: unknown key {key!r} in [model]; valid keys: {', '.join(MODEL_KEYS)}")
    if "module" not in model or "config" not in model:
        raise ConfigError(f'{path}: [model] needs `module` (e.g. "llama3") and `config` (e.g. "llama3_debugmodel")')
    vocab = model.get("vocab_size", 1)
    if not _is_int(vocab) or not 1 <= vocab <= MAX_VOCAB_SIZE:
        raise ConfigError(f"{path}: [model] vocab_size must be an integer in [1, {MAX_VOCAB_SIZE}], got {vocab!r}")
