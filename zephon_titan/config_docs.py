"""docs/configuration.md, written from the config schema (config/): `python -m zephon_titan.config_docs`.

Each key's type, default, bounds or choices, whether it shapes the rows and how the eval set treats it
come from its `setting(...)`; its text is the field's docstring in the module that declares the class
(config/data.py, sources.py, phases.py; read with `ast`). Imports nothing but config/ (no torch).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import sys
from typing import Any

from zephon_titan import config
from zephon_titan.config import LOADER_KEYS, DataConfig, Eval, PhaseConfig, Setting, SourceConfig, settings

COMMAND = "python -m zephon_titan.config_docs > docs/configuration.md"
_TYPES = {
    "int": "integer",
    "float": "number",
    "str": "string",
    "bool": "true or false",
    "bool | None": "true or false, or unset",
    "list[str]": "list of strings",
    "dict[str, float]": "table: source name = weight",
    "list[SourceConfig]": "`[dataloader.sources.<name>]` tables (below)",
    "list[PhaseConfig]": "`[[dataloader.phases]]` tables (below)",
}


def docstrings(cls: type) -> dict[str, str]:
    """The docstring under each field of a class of config/ (read from the module that declares it)."""
    tree = ast.parse(inspect.getsource(sys.modules[cls.__module__]))
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__).body
    out = {}
    for node, after in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            out[node.target.id] = inspect.cleandoc(after.value.value)
    return out


def _toml(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return _toml(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return _toml(f.default_factory())
    return "required"


def _values(s: Setting) -> str:
    if s.choices is not None:
        return "one of " + ", ".join(
            f"`{v}`" + (f" ({meaning})" if meaning else "") for v, meaning in s.choices.items()
        )
    if s.bounds is not None:
        low, high, why = s.bounds
        return f"{low} to {high} ({why})"
    return s.allowed


def _eval(rule: Eval) -> str:
    if rule.rule == "inherited":
        return "inherited from `[dataloader]`; `[validator.dataloader]` may set its own"
    if rule.rule == "training":
        return f"taken from `[dataloader]`; settable in `[validator.dataloader]` only with eval sources of its own ({rule.why})"
    if rule.rule == "own":
        default = f"; default `{rule.default}`" if rule.default is not None else ""
        return f"not inherited: {rule.why}{default}"
    return f"refused in `[validator.dataloader]`: {rule.why}"


def _section(cls: type, heading: str, intro: str, with_eval: bool) -> list[str]:
    docs, declared = docstrings(cls), settings(cls)
    lines = [f"## {heading}", "", intro, ""]
    for f in dataclasses.fields(cls):
        if cls is SourceConfig and f.name == "name":
            continue  # the table's own name
        s = declared[f.name]
        facts = [f"{_TYPES.get(str(f.type), str(f.type))}", f"default {_default(f)}"]
        if _values(s):
            facts.append(_values(s))
        rows = "**shapes the rows** (in the checkpoint's fingerprint)" if s.rows else "does not shape the rows"
        facts.append(rows + (f": {s.rows_note}" if s.rows_note else ""))
        if with_eval:
            facts.append("eval set: " + _eval(s.eval))
        if s.renamed is not None:
            facts.append(f"old name `{s.renamed.old}`" + (f" ({s.renamed.note})" if s.renamed.note else ""))
        lines += [f"### `{f.name}`", "", "- " + "\n- ".join(facts), "", docs.get(f.name, ""), ""]
    return lines


def render() -> str:
    lines = [
        "# Configuration",
        "",
        f"<!-- Generated from zephon_titan/config/ by `{COMMAND}`; edit config/, not this file. -->",
        "",
        "Every key of the `[dataloader]` table of a job TOML, its sources and phases, and of the eval set's",
        "`[validator.dataloader]`. A key that **shapes the rows** is in the checkpoint's fingerprint: a resume",
        "with another value is refused (naming it); the others may change at a resume.",
        "",
    ]
    lines += _section(DataConfig, "`[dataloader]`", "The loader's settings.", with_eval=True)
    for key, (default, doc, why) in LOADER_KEYS.items():
        lines += [
            f"### `{key}`",
            "",
            f"- {_TYPES[type(default).__name__]}\n- default {_toml(default)}\n- does not shape the rows"
            f"\n- eval set: {_eval(Eval('refused', why))}",
            "",
            doc,
            "",
        ]
    lines += _section(
        SourceConfig,
        "`[dataloader.sources.<name>]`",
        "One table per source; `<name>` is the source's name (1 to "
        f"{config.MAX_SOURCE_NAME} characters, no comma; at most {config.MAX_SOURCES} sources). "
        "`[validator.dataloader.sources.<name>]` tables take the same keys.",
        with_eval=False,
    )
    lines += _section(
        PhaseConfig,
        "`[[dataloader.phases]]`",
        f"A mixture schedule: at most {config.MAX_PHASES} phases, the first at step 1, in increasing start_step "
        "order. With phases, the sources take no `weight`.",
        with_eval=False,
    )
    refused = [f"- `{k}`: {rule.why}" for k, rule in config.eval_rules().items() if rule.rule == "refused"]
    lines += [
        "## `[validator.dataloader]`",
        "",
        "The eval set: the `[dataloader]` keys above, each as its *eval set* line says (inherited unless set "
        "here), plus `global_batch_size` (rows per eval step; 0: `[training]` global_batch_size). With no "
        "`[validator.dataloader.sources.<name>]` of its own, it reads the held-out part (`eval_fraction`) of "
        'the training sources, with `split = "eval"`. Refused here (old names included):',
        "",
        *refused,
    ]
    return "\n".join(lines).rstrip("\n") + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
