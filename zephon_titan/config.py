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
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
import warnings
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field
from typing import Any

from zephon_titan.errors import ConfigError
from zephon_titan.urls import refuse_credentials

# Bounds that keep the loader's checkpoint header within its fixed slot (engine/resume.py).
MAX_SOURCES = 200
MAX_SOURCE_NAME = 64
MAX_PHASES = 256
MAX_WEIGHT = 1e6
# The smallest eval_fraction other than 0. engine/split.py holds a document out when the top 53 bits of its
# hash are below eval_fraction * 2**53, so below 2**-53 (1.1e-16) nothing can ever be held out; at 1e-9 a
# corpus of a billion documents is expected to hold out one. Anything smaller is a typo (1e-300), not a plan.
MIN_EVAL_FRACTION = 1e-9


# ---- the schema ----------------------------------------------------------------------------------------


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


# ---- checks named by the schema ------------------------------------------------------------------------


def _not_empty(fix: str = "") -> Callable[[Any, str], None]:
    def check(value: str, what: str) -> None:
        if not value:
            raise ConfigError(f"{what} must not be empty" + (f"; {fix}" if fix else ""))

    return check


def _check_weight(value: float, what: str) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(
            f"{what} must be a finite number > 0, got {value}; remove the source to leave it out of the mixture"
        )


def _check_eval_fraction(value: float, what: str) -> None:
    if 0 < value < MIN_EVAL_FRACTION:
        raise ConfigError(
            f"{what} must be 0 (no eval part) or >= {MIN_EVAL_FRACTION:g}, got {value:g} "
            "(the share of documents held out: this one would hold out none of any real corpus)"
        )


def _check_endpoint(value: str, what: str) -> None:
    refuse_credentials(value, what)  # before any error echoes it
    if value and not value.startswith(("http://", "https://")):
        raise ConfigError(f"{what} must start with http:// or https://, got {value!r}")


# Components a resume may be told to ignore ([dataloader] resume_allow), and why that keeps
# every lane's rows unchanged.
ALLOWED_CHANGES = {
    "mtimes": "files copied or touched: same names, sizes and bytes, new modification times",
    "locations": "data moved or copied to another directory, bucket or prefix: the same file names, in the "
    "same order, with the same sizes and blocks",
}


def _check_resume_allow(allow: Any, what: str) -> None:
    if not (isinstance(allow, list) and all(isinstance(item, str) for item in allow)):
        raise ConfigError(f'{what} must be a list of strings (e.g. ["mtimes"]), got {short_repr(allow)}')
    for item in allow:
        if item not in ALLOWED_CHANGES:
            raise ConfigError(
                f"{what}: {item!r} cannot be allowed (it changes the rows); allowed: "
                + "; ".join(f"{k} ({why})" for k, why in ALLOWED_CHANGES.items())
            )


_THE_TOKENIZER = "the tokenizer component (a digest of the tokenizer's vocabulary, merges and BOS/EOS ids)"
_THE_SPLIT = "the split component, present only when some source has an eval_fraction > 0 (else it selects nothing)"
_IN_PROCESS = "the eval set is produced in the training process"
_S3 = "used only for s3:// paths; where the files are is fingerprinted as their locations (resume_allow)"
_HELD_OUT = (
    "the held-out part of the training sources is read with [dataloader]'s split, so that training never reads "
    "an eval document; set it there"
)


# ---- the configuration ---------------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class SourceConfig:
    """One named source: its files, text field and share of the mixture."""

    name: str = setting(rows=True, rows_note="the fingerprint lists the sources by name")
    """Source name (the key of its `[dataloader.sources.<name>]` table)."""

    paths: list[str] = setting(rows=True, rows_note="the files' names, sizes and blocks (and their locations)")
    """Files or glob patterns (`**` allowed); relative to the job's working directory."""

    weight: float = setting(
        1.0,
        rows=True,
        rows_note="the mixture component (weights normalized over the sources)",
        bounds=(0.0, MAX_WEIGHT, "weights are relative shares (only ratios matter) and must sum to a finite number"),
        check=_check_weight,
    )
    """Share of tokens in the mixture (normalized over all sources)."""

    text_field: str = setting("text", rows=True, check=_not_empty())
    """JSON field or Parquet column holding the document text."""

    token_field: str = setting("", rows=True, rows_note="Parquet and Lance sources only")
    """Parquet only: a column of token ids (lists of ints, from this run's tokenizer) used instead
    of tokenizing text_field; BOS/EOS are still added as configured."""

    format: str = setting(
        "auto",
        rows=True,
        rows_note="the format it resolves to: `auto` and the format it picks are the same rows",
        check=_not_empty('use "auto" or a format name'),
        allowed="`auto` or a registered format (engine/sources/formats.py): jsonl, parquet, lance, megatron, olmo",
    )
    """`jsonl`, `parquet`, `lance`, `megatron`, `olmo`, or `auto` (from the file extension; `.lance` for Lance
    datasets, `.bin` for Megatron indexed datasets: list the `.bin` files, each with its `.idx` beside it;
    `.npy` for OLMo token files)."""

    block_bytes: int = setting(
        1 << 20,
        rows=True,
        rows_note="JSONL and OLMo sources only",
        bounds=(1024, 1 << 30, "a block is read into memory, shuffle_window_blocks of them at a time"),
    )
    """JSONL and OLMo token files: size of the byte ranges dealt to lanes."""

    block_rows: int = setting(
        1024,
        rows=True,
        rows_note="Lance and Megatron sources only",
        bounds=(1, 1 << 20, "a block's rows are read into memory, shuffle_window_blocks of them at a time"),
    )
    """Lance: rows per block (each fragment is cut into blocks of this many rows). Megatron: documents per
    block (each `.bin` is cut into blocks of this many documents)."""

    token_dtype: str = setting(
        "uint16",
        rows=True,
        rows_note="OLMo sources only",
        choices={
            "uint8": "",
            "uint16": "OLMo's choice for vocabularies below 65,536 ids",
            "uint32": "larger vocabularies (dolma2)",
            "uint64": "",
        },
    )
    """OLMo only: the integer type of the token files (a raw memmap has no header that says it)."""

    eos_token_id: int = setting(
        -1,
        rows=True,
        rows_note="OLMo sources only",
        bounds=(-1, (1 << 32) - 1, "a token id"),
    )
    """OLMo only: the id that ends each document in the token files (the EOS of the tokenizer that wrote
    them: 50279 for OLMo's GPT-NeoX tokenizer, 100257 for dolma2); -1, unset, is refused for an OLMo source."""

    eval_fraction: float = setting(
        0.0,
        rows=True,
        rows_note=_THE_SPLIT,
        bounds=(0.0, 0.99, "a source held out whole is an eval source: list it in [validator.dataloader.sources]"),
        check=_check_eval_fraction,
    )
    """Share of this source's documents held out for validation, chosen by a keyed hash of each
    document's file name and row ([dataloader] split_seed): training never reads them, and
    [validator.dataloader] reads them when it names no sources of its own. 0: none held out;
    otherwise in [1e-9, 0.99] (MIN_EVAL_FRACTION)."""

    index: str = setting(
        "",
        rows=False,
        rows_note="a cache of the listing: the files' names, sizes and blocks are fingerprinted however listed",
    )
    """A manifest of the files and their blocks (JSON; local path or URI). Startup reads it instead
    of listing the files and reading Parquet footers. Written by `zephon-titan index <job.toml>`, or
    by the first run that does not find it."""

    def __post_init__(self) -> None:
        validate_source(self)


@dataclass(kw_only=True, slots=True)
class PhaseConfig:
    """One phase of a mixture schedule (`[[dataloader.phases]]`)."""

    start_step: int = setting(rows=True, rows_note="the schedule component")
    """First optimizer step of the phase (the first phase starts at step 1)."""

    weights: dict[str, float] = setting(rows=True, rows_note="the schedule component")
    """Share of tokens per source name in this phase (normalized); a source left out rests (weight 0)."""

    ramp_steps: int = setting(0, rows=True, rows_note="the schedule component")
    """Move linearly from the previous phase's weights to these over the phase's first ramp_steps steps."""

    seq_len: int = setting(
        0,
        rows=True,
        rows_note="the schedule component",
        bounds=(0, 1 << 20, "a row is built in memory"),
        allowed="0 or a length <= [training] seq_len",
    )
    """Rows of this many tokens from this phase's start_step (a sequence-length warm-up, or a long-context stage
    planned from the start); 0: the previous phase's (the first phase's: [training] seq_len, which must be the
    schedule's longest: TorchTitan sizes the RoPE cache by it). Each lane continues where it stopped, as at a resume
    that changes seq_len (docs/changing-a-run.md). The job needs [training] disable_cuda_graphs = true (TorchTitan's
    CUDA graphs refuse inputs of another shape)."""


@dataclass(kw_only=True, slots=True)
class DataConfig:
    """Everything the row streams depend on, except the tokenizer object and seq_len."""

    sources: list[SourceConfig] = setting(
        factory=list,
        rows=True,
        rows_note="every source's settings; adding a source is allowed at a resume, removing one is not",
        eval=Eval("own", "the eval set's own files, else the held-out part (eval_fraction) of the training sources"),
    )
    """The named sources, in sorted-name order (set them in the TOML file)."""

    phases: list[PhaseConfig] = setting(
        factory=list,
        rows=True,
        rows_note="the schedule component; a resume may change phases after the checkpoint's step",
        eval=refused("an eval set has one mixture (set weight on its sources)"),
    )
    """A mixture schedule by optimizer step (`[[dataloader.phases]]` tables); empty: the sources'
    weights for the whole run. With phases, weights come only from them."""

    num_lanes: int = setting(
        8, rows=True, bounds=(1, 1 << 16, "each lane is a row stream with its own state and buffers")
    )
    """Number of lanes L (independent row streams); fixed for a run. The global batch size must be a multiple
    of it; the data-parallel size W may be any divisor of the global batch, more than L too (ranks then share
    lanes: each produces the lanes its rows fall on)."""

    seed: int = setting(
        0, rows=True, bounds=(0, (1 << 63) - 1, "shuffle keys and checkpoint fields are 63-bit integers")
    )
    """Seed of every shuffle."""

    split_seed: int = setting(
        0,
        rows=True,
        rows_note=_THE_SPLIT,
        bounds=(0, (1 << 63) - 1, "split keys are 63-bit integers"),
        eval=Eval("training", _HELD_OUT),
    )
    """Key of the train/eval split of sources with an eval_fraction (another key: another eval set)."""

    split: str = setting(
        "train",
        rows=True,
        rows_note=_THE_SPLIT,
        choices={"train": "", "eval": ""},
        eval=Eval("training", _HELD_OUT),
    )
    """Which part of sources with an eval_fraction this loader reads: `train` (all documents but the
    held-out ones) or `eval` (only those: the validator's loader)."""

    packing: str = setting(
        "wrap",
        rows=True,
        check=_not_empty('use "wrap" or "best_fit"'),
        allowed="a packer of engine/packing.py: wrap, best_fit",
    )
    """`wrap`: documents concatenated and split across rows, no padding.
    `best_fit`: whole documents placed into rows by best fit, padding labels -100."""

    mix_chunk_tokens: int = setting(
        0,
        rows=True,
        rows_note="the value in force: 0 and seq_len are the same rows",
        bounds=(0, 1 << 30, "the mixture error per lane grows with it"),
    )
    """Documents are mixed in pieces of at most this many tokens (0: seq_len), so a long document is
    interleaved with the other sources instead of holding a lane; the per-lane mixture error is at
    most (1 + S * w_s) * mix_chunk_tokens tokens (S sources; docs/how-it-works.md, step 4)."""

    labels: str = setting(
        "document",
        rows=True,
        choices={"document": "shift inside each document, as TorchTitan", "stream": "shift the packed stream"},
    )
    """`document` (TorchTitan's rule): inputs and labels are shifted inside each document, so a
    document's last token never predicts the next document's first; a row is seq_len pairs.
    `stream`: the packed stream is shifted (a row is seq_len + 1 tokens), so every token boundary,
    document boundaries included, is a target."""

    shuffle: bool = setting(True, rows=True)
    """false: no shuffle at all; each lane reads its blocks (lane l: blocks l, l + L, ...) and their
    documents in file order. For debugging and for comparing with other loaders."""

    exhaustion: str = setting(
        "repeat",
        rows=True,
        choices={"repeat": "", "redistribute": ""},
        eval=Eval("own", "an eval set is read once by default", "redistribute"),
    )
    """`repeat`: every source loops with a fresh shuffle per epoch.
    `redistribute`: each source is read once; an exhausted source leaves the lane's
    mixture and the others are renormalized; a lane ends when all are exhausted."""

    shuffle_window_blocks: int = setting(
        4, rows=True, bounds=(1, 1 << 12, "the documents of a window are read into memory together")
    )
    """Documents are shuffled within windows of this many consecutive blocks of a lane."""

    best_fit_window_docs: int = setting(
        256,
        rows=True,
        rows_note='the packing component, under packing = "best_fit" only',
        bounds=(1, 1 << 16, "the window's documents are held in memory and searched per row"),
    )
    """best_fit only: documents considered together when filling rows."""

    best_fit_mixing: str = setting(
        "per_step",
        rows=True,
        rows_note='under packing = "best_fit" only; absent from the fingerprint at "per_window" (runs before it)',
        choices={
            "per_step": "a window's rows in the mixer's order, and no window drawn across a phase start",
            "per_window": "rows as placed, longest first; a phase starts with the next window (earlier runs)",
        },
        eval=Eval(
            "own", "an eval set has no phases, and keeps the rows (and SHA-256) earlier releases gave it", "per_window"
        ),
    )
    """best_fit only: how a window's rows follow the mixture (docs/mixture.md). A resume continues with its
    checkpoint's way; `per_window` re-plans a run started before `per_step` existed from step 1."""

    exclude: str = setting(
        "",
        rows=True,
        rows_note="the exclude component (exclude_from_step and the list's SHA-256), present only when set; a "
        "resume may set or change it only after the checkpoint's step",
        eval=refused("the eval set is never trained on"),
    )
    """A list of documents to skip from step `exclude_from_step` on, one a line: `<source> <file> <row>` or
    `sha256:<hex of the text>` (docs/changing-a-run.md). Empty: none."""

    exclude_from_step: int = setting(
        0,
        rows=True,
        rows_note="the exclude component",
        bounds=(0, 1 << 62, "a step number"),
        eval=refused("the eval set is never trained on"),
    )
    """The first step whose rows skip the `exclude` list's documents (>= 1 with `exclude`; earlier steps are
    unchanged)."""

    tokenizer_path: str = setting(
        "", rows=True, rows_note=f"{_THE_TOKENIZER}: the same tokenizer read from elsewhere is the same rows"
    )
    """Directory holding tokenizer.json (or the file itself); empty: the trainer's tokenizer."""

    add_bos: bool | None = setting(
        None, rows=True, rows_note=f"{_THE_TOKENIZER}: unset and the value it resolves to are the same rows"
    )
    """Prepend the tokenizer's BOS token to each document. Unset: as the tokenizer says (its
    post-processor, else `add_bos_token` in tokenizer_config.json, else yes); see docs/how-it-works.md."""

    add_eos: bool | None = setting(
        None, rows=True, rows_note=f"{_THE_TOKENIZER}: unset and the value it resolves to are the same rows"
    )
    """Append the tokenizer's EOS token to each document. Unset: as the tokenizer says (its
    post-processor, else `add_eos_token` in tokenizer_config.json, else yes); see docs/how-it-works.md."""

    tokenizer_backend: str = setting(
        "auto",
        rows=False,
        rows_note="every backend computes the same ids (checked on a probe set and the first documents)",
        choices={"auto": "", "tokenizers": "", "fastokens": ""},
    )
    """Which code computes the token ids (a speed knob: the ids are the same). `auto`: fastokens when
    installed (`.[fast]`) and it matches `tokenizers` on a probe set and on the first documents, else
    `tokenizers` (one log line says why). `fastokens`: the same, but an error instead of a fallback."""

    num_workers: int = setting(
        0,
        rows=False,
        bounds=(0, 1024, "one process each"),
        eval=refused(_IN_PROCESS),
        renamed=Renamed("workers", "where 1 meant 0", lambda n: 0 if n == 1 else n),  # 1: the training process
    )
    """Worker processes producing this rank's lanes (0: inside the training process), as in PyTorch's
    DataLoader. A performance knob: rows do not depend on it. (Old name: `workers`, where 1 meant 0.)"""

    prefetch_factor: int = setting(
        2,
        rows=False,
        bounds=(1, 1024, "each step ahead is held in memory"),
        eval=refused(_IN_PROCESS),
        renamed=Renamed("prefetch_steps"),
    )
    """Steps produced ahead of the trainer (bounded memory): by each worker process, or with
    num_workers = 0 by a thread of the training process. (Old name: `prefetch_steps`.)"""

    max_document_chars: int = setting(
        64 << 20,
        rows=False,
        rows_note="a longer document is an error, never cut or skipped: no row changes",
        bounds=(1, 1 << 31, "a document is tokenized at once, ~10x its size in memory"),
    )
    """A longer document is an error naming its file and row (tokenizing it at once would need
    ~10x its size in memory); raise the limit if you mean it."""

    s3_endpoint_url: str = setting("", rows=False, rows_note=_S3, check=_check_endpoint)
    """S3-compatible endpoint for s3:// paths (default: AWS_ENDPOINT_URL, else AWS). Credentials come
    from the environment (AWS_ACCESS_KEY_ID, AWS_PROFILE, ~/.aws, instance roles), never the config."""

    s3_region: str = setting("", rows=False, rows_note=_S3)
    """Region for s3:// paths (default: AWS_REGION / AWS_DEFAULT_REGION)."""

    s3_anonymous: bool = setting(False, rows=False, rows_note=_S3)
    """Read s3:// paths without credentials (public buckets)."""

    resume_allow: list[str] = setting(
        factory=list,
        rows=False,
        rows_note="what a resume accepts, not what it reads",
        check=_check_resume_allow,
        allowed=", ".join(ALLOWED_CHANGES),
        eval=refused("the eval set has no checkpoint state"),
    )
    """Fingerprint changes a resume accepts: "mtimes" (data copied: same files, sizes and bytes, new
    modification times) and "locations" (the same files read from another directory, bucket or
    prefix, e.g. moved from local disk to S3); everything else changes the rows and is refused."""

    def __post_init__(self) -> None:
        validate(self)

    def source_names(self) -> list[str]:
        return [s.name for s in self.sources]


# [dataloader] keys of the TorchTitan loader, not of the data (titan/dataloader.py's loader_config):
# key -> (default, what it does, why [validator.dataloader] refuses it).
LOADER_KEYS = {
    "ledger": (
        True,
        "Write each step's global-batch SHA-256 to ledger.jsonl beside the checkpoints.",
        "every validation is recorded in validation.jsonl beside the checkpoints",
    )
}


# ---- the validator -------------------------------------------------------------------------------------


_KINDS: dict[type, dict[str, tuple[type, bool]]] = {}


def _kinds(cls: type) -> dict[str, tuple[type, bool]]:
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


def _check_settings(obj: SourceConfig | DataConfig, where: str) -> None:
    """Every field's type, check, choices and bounds, as its Setting declares them."""
    kinds = _kinds(type(obj))
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


def validate_source(source: SourceConfig) -> None:
    """Check one source's values (run once, when the SourceConfig is made)."""
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
    paths = source.paths
    if not (isinstance(paths, list) and paths and all(isinstance(p, str) and p for p in paths)):
        raise ConfigError(f"{where} paths must be a non-empty list of strings, got {short_repr(paths)}")
    _check_settings(source, where)


NO_SOURCES = "[dataloader] has no sources; add a [dataloader.sources.<name>] table with `paths`"


def require_sources(config: DataConfig) -> None:
    """A DataConfig without sources is the unset default (TorchTitan's config tree); nothing can read it."""
    if not config.sources:
        raise ConfigError(NO_SOURCES)


def validate(config: DataConfig) -> None:
    """Check values that do not need the files; raises ConfigError naming the key. Run once, when the
    DataConfig is made (its sources were checked when they were made); an empty source list is the unset
    default, refused by require_sources where data is read."""
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
    _check_settings(config, "[dataloader]")
    validate_phases(config.phases, names)
    if bool(config.exclude) != (config.exclude_from_step > 0):
        raise ConfigError(
            "[dataloader] exclude and exclude_from_step go together: set both (the list, and the first step >= 1 "
            f"that skips its documents) or neither; got exclude = {config.exclude!r}, exclude_from_step = "
            f"{config.exclude_from_step}"
        )
    if config.split == "eval":
        empty = [s.name for s in config.sources if s.eval_fraction <= 0.0]
        if empty:
            raise ConfigError(
                f'sources {", ".join(empty)} hold out no documents (eval_fraction = 0), so split = "eval" reads '
                'nothing of them; set their eval_fraction or read them whole (split = "train")'
            )


def validate_phases(phases: list[PhaseConfig], names: list[str]) -> None:
    """A schedule starts at step 1, its phases in increasing order, each ramp done before the next phase,
    every weight finite and >= 0 over known sources, every phase with some weight. A source may rest in
    every phase: declared now, it can be given a weight in a later phase when the run is resumed."""
    if not phases:
        return
    if len(phases) > MAX_PHASES:  # the schedule is kept in the checkpoint header (engine/resume.py)
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
                math.isfinite(weight) and 0 <= weight <= MAX_WEIGHT
            ):
                raise ConfigError(f"{where}: weight of {name!r} must be a finite number >= 0, got {weight!r}")
        if not any(w > 0 for w in phase.weights.values()):
            raise ConfigError(f"{where}: no source has a weight > 0; every phase must read something")
        if not 0 <= phase.seq_len <= 1 << 20:
            raise ConfigError(
                f"{where}: seq_len must be 0 (the previous phase's) or in [1, {1 << 20}], got {phase.seq_len}"
            )


# ---- the TOML table -> dataclass -----------------------------------------------------------------------


def _check_keys(table: dict[str, Any], allowed: list[str], where: str) -> None:
    for key in table:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(allowed)}"
            raise ConfigError(f"unknown key {key!r} in {where}; {hint}")


def _from_toml(cls: type, name: str, value: Any) -> Any:
    """A TOML value for a field (an integer for a float field becomes a float; the validator checks types)."""
    kind = _kinds(cls).get(name, (None, False))[0]
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


def eval_rules() -> dict[str, Eval]:
    """How [validator.dataloader] treats each [dataloader] key: the fields' (under old names too) and the
    TorchTitan loader's own keys (refused)."""
    rules: dict[str, Eval] = {}
    for name, s in settings(DataConfig).items():
        rules[name] = s.eval
        if s.renamed is not None:
            rules[s.renamed.old] = s.eval
    rules.update({key: refused(why) for key, (_, _, why) in LOADER_KEYS.items()})
    return rules
