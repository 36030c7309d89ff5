"""The schema machinery: how a config field is declared (`setting(...)`), what it declares (`Setting`,
`Eval`, `Renamed`), and the one check that enforces type, choices and bounds for every field.

It names no field: sources.py, phases.py and data.py declare the fields with it, and the validator,
the eval rule (titan/job.py), the old-name reader (tables.py) and docs/configuration.md (config_docs.py)
read what they declare. Split from the fields so that adding a field never touches the machinery, and a
change to the machinery is one file.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field
from typing import Any

from zephon_titan.errors import ConfigError

# ---- what a field declares -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Eval:
    """How `[validator.dataloader]` treats a `[dataloader]` key. `rule`:
    "inherited": taken from [dataloader] unless [validator.dataloader] sets it;
    "training": taken from [dataloader]; settable only when the eval set names sources of its own (`why`);
    "own": not taken from [dataloader]: the eval set's own value, else `default` (None: the field's);
    "refused": not an eval set setting (`why`)."""

    rule: str
    why: str = ""
    default: Any = None


INHERITED = Eval("inherited")


@dataclass(frozen=True)
class Renamed:
    """An old name of a setting, still read (with a warning); `convert` maps an old integer value."""

    old: str
    note: str = ""
    convert: Callable[[int], int] = lambda n: n


@dataclass(frozen=True, kw_only=True)
class Setting:
    """What one field declares (through `setting(...)`)."""

    rows: bool
    """True: the rows depend on it, so it is in the checkpoint's fingerprint (a resume refuses a change).
    False: a performance or I/O knob a resume may change."""
    rows_note: str = ""
    """How it reaches the fingerprint when not directly, or in which configurations it matters."""
    bounds: tuple[float, float, str] | None = None
    """(lowest, highest, why the highest). Far above any useful value, they keep memory, start-up time
    and the checkpoint state of a mistyped value bounded."""
    choices: Mapping[str, str] | None = None
    """The valid values, each with what it means ("" when its name says it)."""
    check: Callable[[Any, str], None] | None = None
    """A rule beyond type, choices and bounds: (value, "[table] key") -> None, or a ConfigError."""
    allowed: str = ""
    """The valid values in words, for a setting checked elsewhere (docs/configuration.md)."""
    eval: Eval = INHERITED
    renamed: Renamed | None = None


def setting(default: Any = MISSING, *, factory: Any = MISSING, **declared: Any) -> Any:
    """A dataclass field with its Setting (keyword arguments of Setting; `rows` is required)."""
    return field(default=default, default_factory=factory, metadata={"setting": Setting(**declared)})


def settings(cls: type) -> dict[str, Setting]:
    """The Setting of each field of a config class that declares one."""
    if cls not in _SETTINGS:
        _SETTINGS[cls] = {f.name: f.metadata["setting"] for f in dataclasses.fields(cls) if "setting" in f.metadata}
    return _SETTINGS[cls]


_SETTINGS: dict[type, dict[str, Setting]] = {}


def refused(why: str) -> Eval:
    return Eval("refused", why)


# ---- checking what they declare ------------------------------------------------------------------------


def not_empty(fix: str = "") -> Callable[[Any, str], None]:
    """A `check` for a string field that must be set (`fix`: how, appended to the error)."""

    def check(value: str, what: str) -> None:
        if not value:
            raise ConfigError(f"{what} must not be empty" + (f"; {fix}" if fix else ""))

    return check


def local_path(value: str, what: str) -> None:
    """A `check` for a path that must be on the machine itself (a folder of each node), not a URI."""
    if "://" in value:
        raise ConfigError(f"{what} must be a local path (a folder on each node), got the URI {value!r}")


_KINDS: dict[type, dict[str, tuple[type, bool]]] = {}


def field_kinds(cls: type) -> dict[str, tuple[type, bool]]:
    """field name -> (its scalar type, whether None is allowed), for the fields of one scalar type."""
    if cls not in _KINDS:
        _KINDS[cls] = {}
        for name, hint in typing.get_type_hints(cls).items():
            args = typing.get_args(hint) if isinstance(hint, types.UnionType) else ()
            kind = next((a for a in args if a is not type(None)), hint)
            if kind in (int, float, str, bool):
                _KINDS[cls][name] = (kind, type(None) in args)
    return _KINDS[cls]


def _kind_name(kind: type) -> str:
    return "true or false" if kind is bool else kind.__name__


def check_settings(obj: object, where: str) -> None:
    """Every field's type, check, choices and bounds, as its Setting declares them."""
    kinds = field_kinds(type(obj))
    for name, s in settings(type(obj)).items():
        value, what = getattr(obj, name), f"{where} {name}"
        if name in kinds:
            kind, optional = kinds[name]
            numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not (isinstance(value, kind) and (kind is bool or not isinstance(value, bool))) and not (
                (optional and value is None) or (kind is float and numeric)
            ):
                raise ConfigError(f"{what} must be {_kind_name(kind)}, got {short_repr(value)}")
        if s.check is not None:
            s.check(value, what)
        if s.choices is not None and value not in s.choices:
            raise ConfigError(f"{what} must be one of {_described(s.choices)}, got {short_repr(value)}")
        if s.bounds is not None:
            low, high, why = s.bounds
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{what} must be a finite number in [{low}, {high}], got {value}")
            if value < low:
                raise ConfigError(f"{what} must be >= {low}, got {value}")
            if value > high:
                raise ConfigError(f"{what} must be <= {high}, got {value} ({why})")


def _described(choices: Mapping[str, str]) -> str:
    return ", ".join(f"{value} ({meaning})" if meaning else value for value, meaning in choices.items())


def short_repr(value: Any) -> str:
    """repr() cut to one readable line (an error must not echo a huge value)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
