"""A source's document pipeline: which documents are trained, and how many times (`keep` and `repeat`).

    [dataloader.sources.web]
    keep = "quality >= 0.7 and lang == 'en'"     # a condition over the record's columns (expressions.py)
    repeat = "min(score * 2, 3)"                 # copies per pass: floor(x), and one more with probability frac(x)

Both are evaluated once per block when it is read (vectorized over its documents), and they never move a
document: a lane's shuffle window holds `copies` slots per document (copies = the ceiling of the largest value
`repeat` can take, 1 without it), and slot c of a document is trained in a pass when c < its count there. The
count is keep(d) * (floor(x) + [u < frac(x)]), with u uniform in [0, 1) from a keyed hash of the document's file
name, row and the pass (as split.py keys the eval split), so:
- the documents a filter keeps are in the order they have without it (a stricter filter only leaves some out);
- a repeated document's copies are separate slots placed apart: its first copy among the window's first copies,
  its second among the second copies, each group in a shuffled order of its own (shuffle_windows.CopyMajor);
- everything is a pure function of the files and the config: the same for every W and worker count, and
  `plan` sees it.
A dropped slot is skipped where the lane reads it (source_reader.py), like an excluded document.

Eras. Keep, repeat and transforms may change from a step on (`[dataloader] pipeline_from_step`): the run's
pipelines are a list of eras (PipelineEra: its first step, each source's keep and repeat as text and its transforms
as the fingerprint names them), the checkpoint's up to its step and the config's after
(fingerprint.check_pipelines); an earlier era's transforms are imported by name and must still have their code. A block's decisions are worked out for every era (Source
holds a pipeline per era), a reader counts a window's slots with its era's, and a source's slots per document stay
what they were when the run began, so a window's positions never move.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from zephon_titan.config import DataConfig, SourceConfig
from zephon_titan.config.expressions import (
    ARITHMETIC,
    Apply,
    Column,
    Derived,
    Expression,
    Literal,
    Node,
    copies_of,
    parse,
)
from zephon_titan.engine.shuffle import derive_key
from zephon_titan.engine.split import uniform53
from zephon_titan.errors import DataError, ResumeError

# A document that is not trained: a slot its pass does not train, or one a transform dropped (transforms.py).
# Read as this one object, never encoded, and skipped by the feed (an identity test: an empty document is another
# empty array).
DROPPED = np.empty(0, dtype=np.int32)
DROPPED.flags.writeable = False


@dataclass(frozen=True)
class SourcePipeline:
    source: str
    keep: Expression | None
    repeat: Expression | None
    copies: int
    """Slots per document in a shuffle window: how many times a pass can train it."""

    @property
    def fields(self) -> list[str]:
        """The top-level columns or fields the expressions read (a dotted name reads its first part)."""
        names = [n for e in (self.keep, self.repeat) if e is not None for n in e.columns()]
        return list(dict.fromkeys(name.split(".")[0] for name in names))

    @property
    def derived(self) -> list[str]:
        """The derived values (chars, bytes) the expressions use."""
        return list(dict.fromkeys(n for e in (self.keep, self.repeat) if e is not None for n in e.derived()))

    @property
    def uses_text(self) -> bool:
        return any(e is not None and e.uses_text() for e in (self.keep, self.repeat))

    def describe(self) -> str:
        """The fingerprint's `pipeline.<source>`: what decides the rows (and, as text, what a resume changed)."""
        parts = [f"keep {self.keep.text}" if self.keep else "", f"repeat {self.repeat.text}" if self.repeat else ""]
        return "; ".join(p for p in parts if p) + f" ({self.copies} slot{'s' * (self.copies > 1)} per document)"

    def values(self, table: pa.Table, text: pa.Array | None, where: str) -> tuple[np.ndarray, np.ndarray]:
        """Per document of a block: kept (bool) and its repeat value (float64 in [0, copies]). `table`: the
        block's `fields`; `text`: its texts (when the expressions use chars or bytes)."""
        size = table.num_rows

        def column(node: Node) -> pa.Array:
            if isinstance(node, Derived):
                assert text is not None
                return pc.utf8_length(text) if node.name == "chars" else pc.binary_length(text)
            assert isinstance(node, Column)
            return field_values(table, node.path)

        try:
            keep = np.ones(size, dtype=bool)
            if self.keep is not None:
                kept = evaluate(self.keep, column, size)
                if not (pa.types.is_boolean(kept.type) or pa.types.is_null(kept.type)):  # a field alone: `keep = "n"`
                    raise DataError(
                        f"keep = {self.keep.text!r} gives values of type {kept.type}, expected a condition (true or "
                        f'false); compare them, e.g. keep = "{self.keep.text} > 0"'
                    )
                keep = np.asarray(pc.fill_null(kept, False), dtype=bool)
            if self.repeat is None:
                return keep, np.ones(size)
            repeat = pc.fill_null(evaluate(self.repeat, column, size).cast(pa.float64()), 0.0).to_numpy()
        except DataError as e:
            raise DataError(f"{where} (source {self.source!r}): {e}") from None
        return keep, np.clip(np.nan_to_num(repeat, nan=0.0), 0.0, self.copies)

    def counts(
        self, keep: np.ndarray, repeat: np.ndarray, seed: int, file: str, rows: Sequence[int] | np.ndarray, epoch: int
    ) -> np.ndarray:
        """How many of each document's slots are trained in pass `epoch` (documents of one file, at `rows`)."""
        whole = np.floor(repeat)
        counts = whole.astype(np.int64)
        fraction = repeat - whole
        if fraction.any():
            key = derive_key(seed, "repeat", self.source, posixpath.basename(file), epoch)
            u = uniform53(key, rows)
            counts += (u < fraction * float(1 << 53)).astype(np.int64)
        return np.where(keep, counts, 0)


def field_values(table: pa.Table, path: str) -> pa.Array:
    """A column, or a field of a struct column by dotted name; a dictionary-encoded column as its values."""
    if path in table.column_names:
        array = table.column(path).combine_chunks()
    else:
        first, *rest = path.split(".")
        array = table.column(first).combine_chunks()
        for part in rest:
            if not pa.types.is_struct(array.type) or array.type.get_field_index(part) < 0:
                raise DataError(f"no field {path!r} (column {first!r} has type {table.column(first).type})")
            array = pc.struct_field(array, part)
    if pa.types.is_dictionary(array.type):
        array = array.cast(array.type.value_type)
    return array


def source_pipeline(source: SourceConfig) -> SourcePipeline | None:
    """The source's pipeline from its config; None when it has neither keep nor repeat."""
    return pipeline_of(source.name, source.keep, source.repeat, f"[dataloader.sources.{source.name}]")


def pipeline_of(name: str, keep_text: str, repeat_text: str, where: str) -> SourcePipeline | None:
    if not keep_text and not repeat_text:
        return None
    keep = parse(keep_text, f"{where} keep", "bool") if keep_text else None
    repeat = parse(repeat_text, f"{where} repeat", "number") if repeat_text else None
    copies = copies_of(repeat, f"{where} repeat") if repeat is not None else 1
    return SourcePipeline(name, keep, repeat, copies)


# ---- the pipelines by step ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PipelineEra:
    """From step `start` on, each source's keep and repeat (as text; a source without either is absent) and its
    transforms (as the fingerprint names them: transforms.describe_all; a source without any is absent)."""

    start: int
    expressions: dict[str, tuple[str, str]]
    transforms: dict[str, str] = field(default_factory=dict)
    chats: dict[str, dict[str, str]] = field(default_factory=dict)
    """Each chat source's template and mask rule (chat.ChatSetup.era_record)."""

    def same_pipelines(self, other: PipelineEra) -> bool:
        """Whether the two eras decide alike (their starts aside)."""
        return (self.expressions, self.transforms, self.chats) == (other.expressions, other.transforms, other.chats)

    def changed_sources(self, other: PipelineEra) -> list[str]:
        """The sources whose keep, repeat, transforms or chat template differ between the two eras."""
        parts: list[tuple[dict[str, Any], dict[str, Any]]] = [
            (self.expressions, other.expressions),
            (self.transforms, other.transforms),
            (self.chats, other.chats),
        ]
        names = {n for a, b in parts for n in (*a, *b)}
        return sorted(n for n in names if any(a.get(n) != b.get(n) for a, b in parts))


def config_eras(
    config: DataConfig, transforms: dict[str, str], chats: dict[str, dict[str, str]] | None = None
) -> tuple[PipelineEra, ...]:
    """A new run's pipelines by step: the config's keep, repeat and `transforms` (by source, as the fingerprint
    names them) from pipeline_from_step (none before it); its chat sources' `chats` from the first step (a source
    is a chat source throughout)."""
    current = {s.name: (s.keep, s.repeat) for s in config.sources if s.keep or s.repeat}
    chats = chats or {}
    if config.pipeline_from_step <= 1:
        return (PipelineEra(1, current, transforms, chats),)
    return (PipelineEra(1, {}, {}, chats), PipelineEra(config.pipeline_from_step, current, transforms, chats))


def era_index(eras: Sequence[PipelineEra], step: int) -> int:
    """The index of the era in force at `step` (the first one before its start)."""
    return max([i for i, e in enumerate(eras) if e.start <= step] or [0])


def eras_text(eras: Sequence[PipelineEra], slots: dict[str, int]) -> str:
    """The fingerprint's `pipelines`: every era and each source's slots per document, as JSON (an era's transforms
    only where some era has any, so runs without keep the text they had)."""
    with_chats = any(e.chats for e in eras)
    with_transforms = with_chats or any(e.transforms for e in eras)
    listed = [
        [e.start, e.expressions, *([e.transforms] if with_transforms else []), *([e.chats] if with_chats else [])]
        for e in eras
    ]
    return json.dumps({"eras": listed, "slots": slots}, sort_keys=True)


def read_eras(text: str) -> tuple[tuple[PipelineEra, ...], dict[str, int]]:
    """eras_text's eras and slots (ResumeError if a checkpoint's text is not what eras_text writes). Eras written
    before they held transforms have none (fingerprint.check_pipelines gives them the checkpoint's)."""
    try:
        data = json.loads(text)
        eras = tuple(
            PipelineEra(
                int(era[0]),
                {str(k): (str(v[0]), str(v[1])) for k, v in dict(era[1]).items()},
                {str(k): str(v) for k, v in dict(era[2]).items()} if len(era) > 2 else {},
                {str(k): {str(a): str(b) for a, b in dict(v).items()} for k, v in dict(era[3]).items()}
                if len(era) > 3
                else {},
            )
            for era in data["eras"]
        )
        slots = {str(k): int(v) for k, v in dict(data["slots"]).items()}
    except (ValueError, TypeError, KeyError, IndexError):
        raise ResumeError(
            f"the checkpoint's pipelines component is not readable ({text[:80]!r}); it is damaged"
        ) from None
    return eras, slots


def era_pipelines(name: str, eras: Sequence[PipelineEra]) -> tuple[SourcePipeline | None, ...]:
    """A source's pipeline in each era (None where it has none)."""
    out = []
    for e in eras:
        keep, repeat = e.expressions.get(name, ("", ""))
        where = f"[dataloader.sources.{name}]" + (f" (in force from step {e.start})" if e.start > 1 else "")
        out.append(pipeline_of(name, keep, repeat, where))
    return tuple(out)


def slots_needed(pipelines: Sequence[SourcePipeline | None]) -> int:
    """Slots per document a source's windows need for all its eras: its largest copies (1 without a repeat)."""
    return max([p.copies for p in pipelines if p is not None] or [1])


Values = Callable[[Node], pa.Array]
"""The arrays of a block's documents for a Column or Derived node (one value per document)."""


def evaluate(expression: Expression, values: Values, size: int) -> pa.Array:
    """The expression over a block of `size` documents: one value per document. DataError when the data's types
    do not fit it (a string column compared with a number): the message names the expression; the caller adds
    the file."""
    try:
        out = _evaluate(expression.tree, values)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError) as e:
        first = str(e).splitlines()[0]
        raise DataError(f"{expression.text!r} does not fit the data's types ({first})") from None
    if isinstance(out, pa.Scalar):
        return pa.array([out.as_py()] * size, type=out.type)
    return out


def _evaluate(node: Node, values: Values) -> Any:
    if isinstance(node, Literal):
        return pa.scalar(node.value)
    if isinstance(node, (Column, Derived)):
        return values(node)
    assert isinstance(node, Apply)
    args = [_evaluate(a, values) for a in node.args]
    if any(pa.types.is_null(a.type) for a in args) and node.op not in ("is_null", "is_valid"):
        typed = _typed_nulls(node, args)
        if typed is None:  # a value missing from every document of the block: so is the result
            size = next(len(a) for a in _arrays(node, values) if isinstance(a, pa.Array))
            return pa.nulls(size, _KINDS.get(node.kind, pa.null()))
        args = typed
    if node.op in ARITHMETIC.values() or node.op == "negate":
        args = [a.cast(pa.float64()) for a in args]
    if node.op == "is_in":
        value_set = pa.array(node.values)
        if args[0].type != value_set.type and not pa.types.is_null(args[0].type):
            args[0] = args[0].cast(value_set.type) if _numeric(args[0].type) else args[0]
        # A missing value is in no list and outside none: null, as a comparison with it is (not False, which
        # `not in` would turn into a kept document).
        return pc.if_else(pc.is_valid(args[0]), pc.is_in(args[0], value_set=value_set), pa.scalar(None, pa.bool_()))
    if node.op in ("min_element_wise", "max_element_wise"):
        return getattr(pc, node.op)(*[a.cast(pa.float64()) for a in args], skip_nulls=False)
    if node.op in ("and_kleene", "or_kleene"):
        out = args[0]
        for a in args[1:]:
            out = pc.call_function(node.op, [out, a])
        return out
    if node.op in ("is_null", "is_valid") and isinstance(args[0], pa.Scalar):
        return pa.scalar(args[0].is_valid == (node.op == "is_valid"))
    return pc.call_function(node.op, args)


def _numeric(kind: pa.DataType) -> bool:
    return bool(pa.types.is_integer(kind) or pa.types.is_floating(kind))


_KINDS = {"bool": pa.bool_(), "number": pa.float64(), "string": pa.string()}
_LOGICAL = ("and_kleene", "or_kleene", "invert")


def _typed_nulls(node: Apply, args: list[Any]) -> list[Any] | None:
    """Arguments where a column is null in every document of a block (Arrow's null type, which no kernel
    compares): as nulls of the type the operator needs, or None when the result is null whatever the rest."""
    if node.op in _LOGICAL:
        return [a.cast(pa.bool_()) if pa.types.is_null(a.type) else a for a in args]
    if node.op == "if_else":
        if pa.types.is_null(args[0].type):
            return None
        other = next((a.type for a in args[1:] if not pa.types.is_null(a.type)), None)
        return (
            None if other is None else [args[0], *(a.cast(other) if pa.types.is_null(a.type) else a for a in args[1:])]
        )
    return None


def _arrays(node: Node, values: Values) -> list[Any]:
    """The node's column values (to learn a block's size)."""
    if isinstance(node, (Column, Derived)):
        return [values(node)]
    return [a for child in getattr(node, "args", ()) for a in _arrays(child, values)]
