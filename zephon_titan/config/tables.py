"""A parsed TOML `[dataloader]` table -> DataConfig: unknown keys refused with a suggestion, old names
renamed (with a warning), integers widened for float fields, the sources in sorted-name order.

Apart from the schema because it is about the file's shape (tables, key spellings), not the values:
everything it builds is checked by the dataclasses themselves when made. Reading the TOML file is
toml_file.py's job.
"""

from __future__ import annotations

import difflib
import warnings
from typing import Any

from zephon_titan.config.data import NO_SOURCES, DataConfig
from zephon_titan.config.phases import PhaseConfig
from zephon_titan.config.schema import field_kinds, settings, short_repr
from zephon_titan.config.sources import SourceConfig
from zephon_titan.errors import ConfigError


def _check_keys(table: dict[str, Any], allowed: list[str], where: str) -> None:
    for key in table:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(allowed)}"
            raise ConfigError(f"unknown key {key!r} in {where}; {hint}")


def _from_toml(cls: type, name: str, value: Any) -> Any:
    """A TOML value for a field (an integer for a float field becomes a float; the validator checks types)."""
    kind = field_kinds(cls).get(name, (None, False))[0]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _source_from_table(name: str, table: Any) -> SourceConfig:
    where = f"[dataloader.sources.{name}]"
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table with at least `paths`, got {table!r}")
    _check_keys(table, [key for key in settings(SourceConfig) if key != "name"], where)
    if "paths" not in table:
        raise ConfigError(f"{where} needs `paths`, a list of files or glob patterns")
    kwargs = {key: _from_toml(SourceConfig, key, value) for key, value in table.items()}
    if isinstance(kwargs["paths"], str):
        kwargs["paths"] = [kwargs["paths"]]
    return SourceConfig(name=name, **kwargs)


def _phase_from_table(i: int, table: Any) -> PhaseConfig:
    where = f"[[dataloader.phases]] #{i + 1}"
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table with start_step and weights, got {short_repr(table)}")
    _check_keys(table, list(settings(PhaseConfig)), where)
    if "start_step" not in table or "weights" not in table:
        raise ConfigError(f"{where} needs start_step (an optimizer step) and weights (a table: source = weight)")
    weights = table["weights"]
    if not isinstance(weights, dict):
        raise ConfigError(
            f"{where} weights must be a table (e.g. {{ code = 0.3, web = 0.7 }}), got {short_repr(weights)}"
        )
    phase = PhaseConfig(
        start_step=table["start_step"],
        weights={str(k): v for k, v in weights.items()},
        ramp_steps=table.get("ramp_steps", 0),
        seq_len=table.get("seq_len", 0),
    )
    for key in ("start_step", "ramp_steps", "seq_len"):
        if not isinstance(getattr(phase, key), int) or isinstance(getattr(phase, key), bool):
            raise ConfigError(f"{where} {key} must be int, got {short_repr(getattr(phase, key))}")
    return phase


def config_from_dict(table: object) -> DataConfig:
    """Build a DataConfig from the `[dataloader]` table (already parsed TOML); it is checked when made."""
    if not isinstance(table, dict):
        raise ConfigError(f"[dataloader] must be a table, got {table!r}")
    table = _renamed(table)
    _check_keys(table, list(settings(DataConfig)), "[dataloader]")
    raw_sources = table.get("sources")
    if not isinstance(raw_sources, dict) or not raw_sources:
        raise ConfigError(NO_SOURCES)
    kwargs: dict[str, Any] = {k: _from_toml(DataConfig, k, v) for k, v in table.items() if k != "phases"}
    kwargs["sources"] = [_source_from_table(name, raw_sources[name]) for name in sorted(raw_sources)]
    if "phases" in table:
        raw_phases = table["phases"]
        if not isinstance(raw_phases, list):
            raise ConfigError("[dataloader] phases must be [[dataloader.phases]] tables (start_step, weights)")
        kwargs["phases"] = [_phase_from_table(i, p) for i, p in enumerate(raw_phases)]
        weighted = [
            name
            for name in sorted(raw_sources)
            if isinstance(raw_sources[name], dict) and "weight" in raw_sources[name]
        ]
        if weighted and kwargs["phases"]:
            raise ConfigError(
                f"[dataloader.sources.{weighted[0]}] weight: with [[dataloader.phases]] the weights come from the "
                "phases; remove the source's weight"
            )
    return DataConfig(**kwargs)


def _renamed(table: dict[str, Any]) -> dict[str, Any]:
    """The table with old names renamed (a warning each); both names at once is an error."""
    out = dict(table)
    for new, s in settings(DataConfig).items():
        if s.renamed is None or s.renamed.old not in out:
            continue
        old = s.renamed.old
        if new in out:
            raise ConfigError(f"[dataloader] sets both {old} (its old name) and {new}; keep {new}")
        value = out.pop(old)
        out[new] = s.renamed.convert(value) if isinstance(value, int) and not isinstance(value, bool) else value
        warnings.warn(
            f"[dataloader] {old} is deprecated: use {new} = {out[new]!r} (the same setting)",
            DeprecationWarning,
            stacklevel=3,
        )
    return out
