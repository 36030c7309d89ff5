"""The `[dataloader]` table of a job: plain dataclasses (the core's types), one schema, table -> dataclass.

Imports nothing of the engine or of TorchTitan; reading TOML files is toml_file.py's job.

    [dataloader]
    num_lanes = 8              # fixed for the life of a run; any W dividing the global batch works
    seed = 1234
    packing = "wrap"           # or "best_fit"

    [dataloader.sources.code]
    paths = ["data/code/*.parquet"]
    weight = 0.3

Sources are keyed by name and always processed in sorted-name order, so reordering
tables in the file changes nothing. Relative paths are resolved against the
working directory of the job (as TorchTitan does for its dataset paths).

The schema: every field says, in its `setting(...)`, its bounds or choices (and why), whether it
shapes the rows (`rows`: in the checkpoint's fingerprint, or a knob a resume may change), how the
eval set (`[validator.dataloader]`) treats it, and its old name. The validator, the eval rule
(titan/job.py), the old-name reader and docs/configuration.md (config_docs.py) read it; the field's
docstring is its documentation. A DataConfig or SourceConfig is checked once, when it is made.

The modules, each with one job (imports go down this list, never up):
    schema.py   how a field is declared and checked (Setting, setting(...), the type/choices/bounds check)
    sources.py  [dataloader.sources.<name>]: SourceConfig and its checks
    phases.py   [[dataloader.phases]]: PhaseConfig and the rules a schedule keeps
    data.py     [dataloader]: DataConfig, the rules across its fields, the eval set's rule per key
    tables.py   a parsed TOML table -> DataConfig (unknown keys, old names)
Everything the rest of the package uses is imported from here, `zephon_titan.config`.
"""

from zephon_titan.config.data import (
    ALLOWED_CHANGES,
    LOADER_KEYS,
    MAX_SOURCES,
    NO_SOURCES,
    DataConfig,
    eval_rules,
    require_sources,
    validate,
)
from zephon_titan.config.phases import MAX_PHASES, PhaseConfig, validate_phases
from zephon_titan.config.schema import INHERITED, Eval, Renamed, Setting, refused, setting, settings, short_repr
from zephon_titan.config.sources import MAX_SOURCE_NAME, MAX_WEIGHT, MIN_EVAL_FRACTION, SourceConfig, validate_source
from zephon_titan.config.tables import config_from_dict

__all__ = [
    "ALLOWED_CHANGES",
    "INHERITED",
    "LOADER_KEYS",
    "MAX_PHASES",
    "MAX_SOURCES",
    "MAX_SOURCE_NAME",
    "MAX_WEIGHT",
    "MIN_EVAL_FRACTION",
    "NO_SOURCES",
    "DataConfig",
    "Eval",
    "PhaseConfig",
    "Renamed",
    "Setting",
    "SourceConfig",
    "config_from_dict",
    "eval_rules",
    "refused",
    "require_sources",
    "setting",
    "settings",
    "short_repr",
    "validate",
    "validate_phases",
    "validate_source",
]
