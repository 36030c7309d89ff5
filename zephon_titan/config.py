"""The `[dataloader]` table of a job: plain dataclasses (the core's types), table <-> dataclass, validation.

Imports nothing of the engine or of TorchTitan; reading TOML files is toml_file.py's job.

    [dataloader]
    num_lanes = 8              # fixed for the life of a run; W must divide it
    seed = 1234
    packing = "wrap"           # or "best_fit"

    [dataloader.sources.code]
    paths = ["data/code/*.parquet"]
    weight = 0.3

Sources are keyed by name and always processed in sorted-name order, so reordering
tables in the file changes nothing. Relative paths are resolved against the
working directory of the job (as TorchTitan does for its dataset paths).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from zephon_titan.errors import ConfigError
from zephon_titan.urls import refuse_credentials

EXHAUSTION_POLICIES = ("repeat", "redistribute")
LABEL_RULES = ("document", "stream")
SPLITS = ("train", "eval")
TOKENIZER_BACKENDS = ("auto", "tokenizers", "fastokens")
# Bounds that keep the loader's checkpoint header within its fixed slot (titan/state_codec.py).
MAX_SOURCES = 200
MAX_SOURCE_NAME = 64
# Bounds of the numeric settings: (lowest, highest, why the highest). Far above any useful value,
# they keep memory, start-up time and the checkpoint state of a mistyped value bounded.
BOUNDS = {
    "num_lanes": (1, 1 << 16, "each lane is a row stream with its own state and buffers"),
    "seed": (0, (1 << 63) - 1, "shuffle keys and checkpoint fields are 63-bit integers"),
    "split_seed": (0, (1 << 63) - 1, "split keys are 63-bit integers"),
    "shuffle_window_blocks": (1, 1 << 12, "the documents of a window are read into memory together"),
    "best_fit_window_docs": (1, 1 << 16, "the window's documents are held in memory and searched per row"),
    "num_workers": (0, 1024, "one process each"),
    "prefetch_factor": (1, 1024, "each step ahead is held in memory"),
    "max_document_chars": (1, 1 << 31, "a document is tokenized at once, ~10x its size in memory"),
    "mix_chunk_tokens": (0, 1 << 30, "the mixture error per lane grows with it"),
}
SOURCE_BOUNDS = {
    "weight": (0.0, 1e6, "weights are relative shares (only ratios matter) and must sum to a finite number"),
    "block_bytes": (1024, 1 << 30, "a block is read into memory, shuffle_window_blocks of them at a time"),
    "block_rows": (1, 1 << 20, "a block's rows are read into memory, shuffle_window_blocks of them at a time"),
    "eval_fraction": (
        0.0,
        0.99,
        "a source held out whole is an eval source: list it in [validator.dataloader.sources]",
    ),
}
# The smallest eval_fraction other than 0. engine/split.py holds a document out when the top 53 bits of its
# hash are below eval_fraction * 2**53, so below 2**-53 (1.1e-16) nothing can ever be held out; at 1e-9 a
# corpus of a billion documents is expected to hold out one. Anything smaller is a typo (1e-300), not a plan.
MIN_EVAL_FRACTION = 1e-9
# Settings whose default (None) means "decided elsewhere"; the TOML value has this type.
_OPTIONAL_TYPES = {"add_bos": bool, "add_eos": bool}


@dataclass(kw_only=True, slots=True)
class SourceConfig:
    """One named source: its files, text field and share of the mixture."""

    name: str
    """Source name (the key of its `[dataloader.sources.<name>]` table)."""

    paths: list[str]
    """Files or glob patterns (`**` allowed); relative to the job's working directory."""

    weight: float = 1.0
    """Share of tokens in the mixture (normalized over all sources)."""

    text_field: str = "text"
    """JSON field or Parquet column holding the document text."""

    token_field: str = ""
    """Parquet only: a column of token ids (lists of ints, from this run's tokenizer) used instead
    of tokenizing text_field; BOS/EOS are still added as configured."""

    format: str = "auto"
    """`jsonl`, `parquet`, `lance`, or `auto` (from the file extension; `.lance` for Lance datasets)."""

    block_bytes: int = 1 << 20
    """JSONL only: size of the byte ranges dealt to lanes."""

    block_rows: int = 1024
    """Lance only: rows per block (each fragment is cut into blocks of this many rows)."""

    eval_fraction: float = 0.0
    """Share of this source's documents held out for validation, chosen by a keyed hash of each
    document's file name and row ([dataloader] split_seed): training never reads them, and
    [validator.dataloader] reads them when it names no sources of its own. 0: none held out;
    otherwise in [1e-9, 0.99] (MIN_EVAL_FRACTION)."""

    index: str = ""
    """A manifest of the files and their blocks (JSON; local path or URI). Startup reads it instead
    of listing the files and reading Parquet footers. Written by `zephon-titan index <job.toml>`, or
    by the first run that does not find it."""


@dataclass(kw_only=True, slots=True)
class PhaseConfig:
    """One phase of a mixture schedule (`[[dataloader.phases]]`)."""

    start_step: int
    """First optimizer step of the phase (the first phase starts at step 1)."""

    weights: dict[str, float]
    """Share of tokens per source name in this phase (normalized); a source left out rests (weight 0)."""

    ramp_steps: int = 0
    """Move linearly from the previous phase's weights to these over the phase's first ramp_steps steps."""


@dataclass(kw_only=True, slots=True)
class DataConfig:
    """Everything the row streams depend on, except the tokenizer object and seq_len."""

    sources: list[SourceConfig] = field(default_factory=list)
    """The named sources, in sorted-name order (set them in the TOML file)."""

    phases: list[PhaseConfig] = field(default_factory=list)
    """A mixture schedule by optimizer step (`[[dataloader.phases]]` tables); empty: the sources'
    weights for the whole run. With phases, weights come only from them."""

    num_lanes: int = 8
    """Number of lanes L; fixed for a run. Data-parallel sizes must divide it."""

    seed: int = 0
    """Seed of every shuffle."""

    split_seed: int = 0
    """Key of the train/eval split of sources with an eval_fraction (another key: another eval set)."""

    split: str = "train"
    """Which part of sources with an eval_fraction this loader reads: `train` (all documents but the
    held-out ones) or `eval` (only those: the validator's loader)."""

    packing: str = "wrap"
    """`wrap`: documents concatenated and split across rows, no padding.
    `best_fit`: whole documents placed into rows by best fit, padding labels -100."""

    mix_chunk_tokens: int = 0
    """Documents are mixed in pieces of at most this many tokens (0: seq_len), so a long document is
    interleaved with the other sources instead of holding a lane; the per-lane mixture error is at
    most (1 + S * w_s) * mix_chunk_tokens tokens (S sources; README "Mental model")."""

    labels: str = "document"
    """`document` (TorchTitan's rule): inputs and labels are shifted inside each document, so a
    document's last token never predicts the next document's first; a row is seq_len pairs.
    `stream`: the packed stream is shifted (a row is seq_len + 1 tokens), so every token boundary,
    document boundaries included, is a target."""

    shuffle: bool = True
    """false: no shuffle at all; each lane reads its blocks (lane l: blocks l, l + L, ...) and their
    documents in file order. For debugging and for comparing with other loaders."""

    exhaustion: str = "repeat"
    """`repeat`: every source loops with a fresh shuffle per epoch.
    `redistribute`: each source is read once; an exhausted source leaves the lane's
    mixture and the others are renormalized; a lane ends when all are exhausted."""

    shuffle_window_blocks: int = 4
    """Documents are shuffled within windows of this many consecutive blocks of a lane."""

    best_fit_window_docs: int = 256
    """best_fit only: documents considered together when filling rows."""

    tokenizer_path: str = ""
    """Directory holding tokenizer.json (or the file itself); empty: the trainer's tokenizer."""

    add_bos: bool | None = None
    """Prepend the tokenizer's BOS token to each document. Unset: as the tokenizer says (its
    post-processor, else `add_bos_token` in tokenizer_config.json, else yes); see README."""

    add_eos: bool | None = None
    """Append the tokenizer's EOS token to each document. Unset: as the tokenizer says (its
    post-processor, else `add_eos_token` in tokenizer_config.json, else yes); see README."""

    tokenizer_backend: str = "auto"
    """Which code computes the token ids (a speed knob: the ids are the same). `auto`: fastokens when
    installed (`.[fast]`) and it matches `tokenizers` on a probe set and on the first documents, else
    `tokenizers` (one log line says why). `fastokens`: the same, but an error instead of a fallback."""

    num_workers: int = 0
    """Worker processes producing this rank's lanes (0: inside the training process), as in PyTorch's
    DataLoader. A performance knob: rows do not depend on it. (Old name: `workers`, where 1 meant 0.)"""

    prefetch_factor: int = 2
    """Steps produced ahead of the trainer (bounded memory): by each worker process, or with
    num_workers = 0 by a thread of the training process. (Old name: `prefetch_steps`.)"""

    max_document_chars: int = 64 << 20
    """A longer document is an error naming its file and row (tokenizing it at once would need
    ~10x its size in memory); raise the limit if you mean it."""

    s3_endpoint_url: str = ""
    """S3-compatible endpoint for s3:// paths (default: AWS_ENDPOINT_URL, else AWS). Credentials come
    from the environment (AWS_ACCESS_KEY_ID, AWS_PROFILE, ~/.aws, instance roles), never the config."""

    s3_region: str = ""
    """Region for s3:// paths (default: AWS_REGION / AWS_DEFAULT_REGION)."""

    s3_anonymous: bool = False
    """Read s3:// paths without credentials (public buckets)."""

    resume_allow: list[str] = field(default_factory=list)
    """Fingerprint changes a resume accepts: "mtimes" (data copied: same files, sizes and bytes, new
    modification times) and "locations" (the same files read from another directory, bucket or
    prefix, e.g. moved from local disk to S3); everything else changes the rows and is refused."""

    def source_names(self) -> list[str]:
        return [s.name for s in self.sources]


def _check_keys(table: dict[str, Any], allowed: list[str], where: str) -> None:
    for key in table:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(allowed)}"
            raise ConfigError(f"unknown key {key!r} in {where}; {hint}")


def _typed(value: Any, kind: type, key: str, where: str) -> Any:
    ok = isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not ok:
        raise ConfigError(f"{where} {key} must be {kind.__name__}, got {value!r}")
    return value


def _source_from_table(name: str, table: Any) -> SourceConfig:
    where = f"[dataloader.sources.{name}]"
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table with at least `paths`, got {table!r}")
    allowed = [f.name for f in dataclasses.fields(SourceConfig) if f.name != "name"]
    _check_keys(table, allowed, where)
    if "paths" not in table:
        raise ConfigError(f"{where} needs `paths`, a list of files or glob patterns")
    paths = table["paths"]
    if isinstance(paths, str):
        paths = [paths]
    if not (isinstance(paths, list) and paths and all(isinstance(p, str) and p for p in paths)):
        raise ConfigError(f"{where} paths must be a non-empty list of strings, got {short_repr(paths)}")
    kwargs: dict[str, Any] = {"name": name, "paths": paths}
    defaults = SourceConfig(name=name, paths=paths)
    for key in allowed:  # every field of SourceConfig: a new option cannot be silently ignored
        if key != "paths" and key in table:
            kwargs[key] = _typed(table[key], type(getattr(defaults, key)), key, where)
    source = SourceConfig(**kwargs)
    validate_source(source)
    return source


def short_repr(value: Any) -> str:
    """repr() cut to one readable line (an error must not echo a huge value)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_bounds(obj: Any, bounds: Mapping[str, tuple[float, float, str]], where: str) -> None:
    for key, (low, high, why) in bounds.items():
        value = getattr(obj, key)
        if value < low:
            raise ConfigError(f"{where} {key} must be >= {low}, got {value}")
        if value > high:
            raise ConfigError(f"{where} {key} must be <= {high}, got {value} ({why})")


def validate_source(source: SourceConfig) -> None:
    where = f"[dataloader.sources.{source.name}]"
    if not source.name or len(source.name) > MAX_SOURCE_NAME:
        raise ConfigError(
            f"{where}: a source name must have 1 to {MAX_SOURCE_NAME} characters, got "
            f"{len(source.name)}; use a shorter name (it is only a label)"
        )
    bad = sorted({c for c in source.name if c == "," or not c.isprintable()})
    if bad:
        # The checkpoint's fingerprint lists the sources joined by commas: such a name would train, then
        # fail every resume. Refused here, before anything is written.
        raise ConfigError(
            f"[dataloader.sources.{source.name!r}]: a source name may not contain {', '.join(map(repr, bad))} "
            "(the checkpoint lists source names separated by commas); rename the source, e.g. "
            f"{''.join('_' if c in bad else c for c in source.name)!r}"
        )
    if not (math.isfinite(source.weight) and source.weight > 0):
        raise ConfigError(
            f"{where} weight must be a finite number > 0, got {source.weight}; "
            "remove the source to leave it out of the mixture"
        )
    _check_bounds(source, SOURCE_BOUNDS, where)
    if not math.isfinite(source.eval_fraction):
        raise ConfigError(f"{where} eval_fraction must be a share in [0, 0.99], got {source.eval_fraction}")
    if 0 < source.eval_fraction < MIN_EVAL_FRACTION:
        raise ConfigError(
            f"{where} eval_fraction must be 0 (no eval part) or >= {MIN_EVAL_FRACTION:g}, got {source.eval_fraction:g} "
            "(the share of documents held out: this one would hold out none of any real corpus)"
        )
    if not source.format:  # the names are the engine's format registry (engine/sources/formats.py)
        raise ConfigError(f'{where} format must not be empty; use "auto" or a format name')
    if not source.text_field:
        raise ConfigError(f"{where} text_field must not be empty")


def validate(config: DataConfig) -> None:
    """Check values that do not need the files; raises ConfigError naming the key."""
    if not config.sources:
        raise ConfigError("[dataloader] has no sources; add a [dataloader.sources.<name>] table with `paths`")
    names = config.source_names()
    if len(names) > MAX_SOURCES:
        raise ConfigError(
            f"[dataloader] has {len(names)} sources, at most {MAX_SOURCES} are supported; "
            "merge sources that share a weight (a source may list many paths)"
        )
    if len(set(names)) != len(names):
        raise ConfigError(f"[dataloader] source names must be unique, got {names}")
    if names != sorted(names):
        raise ConfigError(f"[dataloader] sources must be in sorted-name order, got {names}")
    for source in config.sources:
        validate_source(source)
    _check_bounds(config, BOUNDS, "[dataloader]")
    validate_phases(config.phases, names)
    if not config.packing:  # the names are the engine's packing registry (engine/packing.py)
        raise ConfigError('[dataloader] packing must not be empty; use "wrap" or "best_fit"')
    if config.labels not in LABEL_RULES:
        raise ConfigError(
            f'[dataloader] labels must be "document" (shift inside each document, as TorchTitan) or "stream" '
            f"(shift the packed stream), got {config.labels!r}"
        )
    if config.split not in SPLITS:
        raise ConfigError(f'[dataloader] split must be "train" or "eval", got {config.split!r}')
    if config.split == "eval":
        empty = [s.name for s in config.sources if s.eval_fraction <= 0.0]
        if empty:
            raise ConfigError(
                f'sources {", ".join(empty)} hold out no documents (eval_fraction = 0), so split = "eval" reads '
                'nothing of them; set their eval_fraction or read them whole (split = "train")'
            )
    if config.tokenizer_backend not in TOKENIZER_BACKENDS:
        raise ConfigError(
            f"[dataloader] tokenizer_backend must be one of {', '.join(TOKENIZER_BACKENDS)}, "
            f"got {config.tokenizer_backend!r}"
        )
    if not isinstance(config.shuffle, bool):
        raise ConfigError(f"[dataloader] shuffle must be true or false, got {config.shuffle!r}")
    if config.exhaustion not in EXHAUSTION_POLICIES:
        raise ConfigError(
            f"[dataloader] exhaustion must be one of {', '.join(EXHAUSTION_POLICIES)}, got {config.exhaustion!r}"
        )
    refuse_credentials(config.s3_endpoint_url, "[dataloader] s3_endpoint_url")  # before any error echoes it
    if config.s3_endpoint_url and not config.s3_endpoint_url.startswith(("http://", "https://")):
        raise ConfigError(
            f"[dataloader] s3_endpoint_url must start with http:// or https://, got {config.s3_endpoint_url!r}"
        )
    validate_resume_allow(config.resume_allow)


MAX_PHASES = 256  # the schedule is kept in the checkpoint header (titan/state_codec.py)


def validate_phases(phases: list[PhaseConfig], names: list[str]) -> None:
    """A schedule starts at step 1, its phases in increasing order, each ramp done before the next phase,
    every weight finite and >= 0 over known sources, every phase with some weight. A source may rest in
    every phase: declared now, it can be given a weight in a later phase when the run is resumed."""
    if not phases:
        return
    if len(phases) > MAX_PHASES:
        raise ConfigError(f"[[dataloader.phases]]: {len(phases)} phases, at most {MAX_PHASES} are supported")
    for i, phase in enumerate(phases):
        where = f"[[dataloader.phases]] #{i + 1} (start_step {phase.start_step})"
        if i == 0 and phase.start_step != 1:
            raise ConfigError(f"{where}: the first phase must start at step 1")
        if i and phase.start_step <= phases[i - 1].start_step:
            raise ConfigError(
                f"{where}: phases must be in increasing start_step order (after {phases[i - 1].start_step})"
            )
        if phase.ramp_steps < 0 or (i == 0 and phase.ramp_steps):
            raise ConfigError(f"{where}: ramp_steps must be >= 0, and 0 in the first phase (nothing to ramp from)")
        if i and phases[i - 1].start_step + phases[i - 1].ramp_steps > phase.start_step:
            raise ConfigError(
                f"{where}: the previous phase's ramp of {phases[i - 1].ramp_steps} steps runs into this phase"
            )
        for name, weight in phase.weights.items():
            if name not in names:
                close = difflib.get_close_matches(name, names, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"sources: {', '.join(names)}"
                raise ConfigError(f"{where}: weights name an unknown source {name!r}; {hint}")
            if not (isinstance(weight, (int, float)) and not isinstance(weight, bool)) or not (
                math.isfinite(weight) and 0 <= weight <= SOURCE_BOUNDS["weight"][1]
            ):
                raise ConfigError(f"{where}: weight of {name!r} must be a finite number >= 0, got {weight!r}")
        if not any(w > 0 for w in phase.weights.values()):
            raise ConfigError(f"{where}: no source has a weight > 0; every phase must read something")


def _phase_from_table(i: int, table: Any) -> PhaseConfig:
    where = f"[[dataloader.phases]] #{i + 1}"
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table with start_step and weights, got {short_repr(table)}")
    _check_keys(table, ["start_step", "weights", "ramp_steps"], where)
    if "start_step" not in table or "weights" not in table:
        raise ConfigError(f"{where} needs start_step (an optimizer step) and weights (a table: source = weight)")
    weights = table["weights"]
    if not isinstance(weights, dict):
        raise ConfigError(
            f"{where} weights must be a table (e.g. {{ code = 0.3, web = 0.7 }}), got {short_repr(weights)}"
        )
    return PhaseConfig(
        start_step=_typed(table["start_step"], int, "start_step", where),
        weights={str(k): v for k, v in weights.items()},
        ramp_steps=_typed(table.get("ramp_steps", 0), int, "ramp_steps", where),
    )


# Components a resume may be told to ignore ([dataloader] resume_allow), and why that keeps
# every lane's rows unchanged.
ALLOWED_CHANGES = {
    "mtimes": "files copied or touched: same names, sizes and bytes, new modification times",
    "locations": "data moved or copied to another directory, bucket or prefix: the same file names, in the "
    "same order, with the same sizes and blocks",
}


def validate_resume_allow(allow: list[str]) -> None:
    if not (isinstance(allow, list) and all(isinstance(item, str) for item in allow)):
        raise ConfigError(
            f'[dataloader] resume_allow must be a list of strings (e.g. ["mtimes"]), got {short_repr(allow)}'
        )
    for item in allow:
        if item not in ALLOWED_CHANGES:
            raise ConfigError(
                f"[dataloader] resume_allow: {item!r} cannot be allowed (it changes the rows); allowed: "
                + "; ".join(f"{k} ({why})" for k, why in ALLOWED_CHANGES.items())
            )


def config_from_dict(table: object) -> DataConfig:
    """Build a DataConfig from the `[dataloader]` table (already parsed TOML)."""
    if not isinstance(table, dict):
        raise ConfigError(f"[dataloader] must be a table, got {table!r}")
    table = _renamed(table)
    allowed = [f.name for f in dataclasses.fields(DataConfig)]
    _check_keys(table, allowed, "[dataloader]")
    raw_sources = table.get("sources")
    if not isinstance(raw_sources, dict) or not raw_sources:
        raise ConfigError("[dataloader] has no sources; add a [dataloader.sources.<name>] table with `paths`")
    sources = [_source_from_table(name, raw_sources[name]) for name in sorted(raw_sources)]
    defaults = DataConfig(sources=sources)
    kwargs: dict[str, Any] = {"sources": sources}
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
    for name in allowed:
        if name not in ("sources", "phases") and name in table:
            kind = _OPTIONAL_TYPES.get(name) or type(getattr(defaults, name))
            kwargs[name] = _typed(table[name], kind, name, "[dataloader]")
    config = DataConfig(**kwargs)
    validate(config)
    return config


# Old names, still read for one release: (new name, how an old value maps to the new meaning).
DEPRECATED_KEYS: dict[str, tuple[str, Callable[[int], int]]] = {
    "workers": ("num_workers", lambda n: 0 if n == 1 else n),  # workers = 1 meant "in the training process"
    "prefetch_steps": ("prefetch_factor", lambda n: n),
}


def _renamed(table: dict[str, Any]) -> dict[str, Any]:
    """The table with deprecated keys renamed (a warning each); both names at once is an error."""
    import warnings

    out = dict(table)
    for old, (new, convert) in DEPRECATED_KEYS.items():
        if old not in out:
            continue
        if new in out:
            raise ConfigError(f"[dataloader] sets both {old} (its old name) and {new}; keep {new}")
        value = out.pop(old)
        out[new] = convert(value) if isinstance(value, int) and not isinstance(value, bool) else value
        warnings.warn(
            f"[dataloader] {old} is deprecated: use {new} = {out[new]!r} (the same setting)",
            DeprecationWarning,
            stacklevel=3,
        )
    return out


def config_to_dict(config: DataConfig) -> dict[str, Any]:
    """The inverse of config_from_dict (JSON/TOML friendly)."""
    names = [f.name for f in dataclasses.fields(config) if f.name != "sources"]
    table = {name: getattr(config, name) for name in names if getattr(config, name) is not None}  # TOML has no null
    table["sources"] = {
        s.name: {f.name: getattr(s, f.name) for f in dataclasses.fields(SourceConfig) if f.name != "name"}
        for s in config.sources
    }
    if config.phases:
        for source in table["sources"].values():
            source.pop("weight")  # the phases hold the weights
        table["phases"] = [dataclasses.asdict(p) for p in config.phases]
    else:
        table.pop("phases")
    return table
