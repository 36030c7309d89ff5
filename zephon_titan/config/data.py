"""The schema of the `[dataloader]` table itself (DataConfig): the loader's settings, the checks they name,
the rules across fields, and how `[validator.dataloader]` treats each key (eval_rules).

The top of the schema: it holds the sources (sources.py) and the schedule (phases.py), and is what the
engine is built from. Making a DataConfig checks it, so no other layer meets an unchecked one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zephon_titan.config import schema
from zephon_titan.config.phases import PhaseConfig, validate_phases
from zephon_titan.config.schema import Eval, Renamed, check_settings, not_empty, refused, setting, settings, short_repr
from zephon_titan.config.sources import THE_SPLIT, SourceConfig
from zephon_titan.errors import ConfigError
from zephon_titan.urls import refuse_credentials

# Bounds that keep the loader's checkpoint header within its fixed slot (engine/resume.py).
MAX_SOURCES = 200


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


_CACHE = "where a node keeps copies of objects, not what they hold: a copy is keyed by its object's size and mtime"
_THE_TOKENIZER = "the tokenizer component (a digest of the tokenizer's vocabulary, merges and BOS/EOS ids)"
_IN_PROCESS = "the eval set is produced in the training process"
_S3 = "used only for s3:// paths; where the files are is fingerprinted as their locations (resume_allow)"
_HELD_OUT = (
    "the held-out part of the training sources is read with [dataloader]'s split, so that training never reads "
    "an eval document; set it there"
)


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
        rows_note=THE_SPLIT,
        bounds=(0, (1 << 63) - 1, "split keys are 63-bit integers"),
        eval=Eval("training", _HELD_OUT),
    )
    """Key of the train/eval split of sources with an eval_fraction (another key: another eval set)."""

    split: str = setting(
        "train",
        rows=True,
        rows_note=THE_SPLIT,
        choices={"train": "", "eval": ""},
        eval=Eval("training", _HELD_OUT),
    )
    """Which part of sources with an eval_fraction this loader reads: `train` (all documents but the
    held-out ones) or `eval` (only those: the validator's loader)."""

    packing: str = setting(
        "wrap",
        rows=True,
        check=not_empty('use "wrap" or "best_fit"'),
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

    mix_by: str = setting(
        "tokens",
        rows=True,
        choices={
            "tokens": "every source by its tokens",
            "targets": "chat sources by their trained targets (text sources by their tokens)",
        },
    )
    """What the weights share: tokens, or, for chat sources, the targets their masks train (docs/chat.md), so that
    `weight` is the share of the loss's targets rather than of the context."""

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

    homogeneous_rows: bool = setting(
        False, rows=True, rows_note='under packing = "best_fit" only; in the fingerprint only when set'
    )
    """best_fit only: a row holds only conversations (chat sources) or only text documents, never both (a window's
    rows are packed apart; docs/chat.md)."""

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

    pipeline_from_step: int = setting(
        0,
        rows=True,
        rows_note="the pipelines component (each source's keep, repeat and transforms by step)",
        bounds=(0, 1 << 62, "a step number"),
        eval=refused("the eval set's keep applies to every step it reads"),
    )
    """The first step whose rows use the sources' `keep`, `repeat` and `transform` as this config sets them; the
    steps before keep those of the run's checkpoint (in a new run: none). Set it after the checkpoint's step to
    change a threshold, a repeat or a transform from there on (docs/processing.md). 0: from the first step."""

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

    cache_dir: str = setting("", rows=False, rows_note=_CACHE, check=schema.local_path)
    """A node-local folder where a node's ranks share the whole objects they read from object storage (compressed
    JSONL, MDS and LitData shards compressed whole: one block each), downloaded once per node; empty: no cache.
    One that cannot be written: one warning."""

    cache_max_bytes: int = setting(64 << 30, rows=False, rows_note=_CACHE, bounds=(1 << 20, 1 << 50, "a node's disk"))
    """The most bytes cache_dir holds, least recently used evicted first (a larger object is not cached); one log
    line says when evicted objects are fetched again soon after (the working set does not fit)."""

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
    check_settings(config, "[dataloader]")
    validate_phases(config.phases, names)
    if bool(config.exclude) != (config.exclude_from_step > 0):
        raise ConfigError(
            "[dataloader] exclude and exclude_from_step go together: set both (the list, and the first step >= 1 "
            f"that skips its documents) or neither; got exclude = {config.exclude!r}, exclude_from_step = "
            f"{config.exclude_from_step}"
        )
    chat = [s.name for s in config.sources if s.chat]
    if chat and (config.packing != "best_fit" or config.labels != "document"):
        key, value = ("packing", "best_fit") if config.packing != "best_fit" else ("labels", "document")
        raise ConfigError(
            f"[dataloader] {key} = {getattr(config, key)!r} with chat source {chat[0]}: a conversation is trained whole "
            f"in one row, its mask on its own targets; set {key} = {value!r} (docs/chat.md)"
        )
    if config.homogeneous_rows and config.packing != "best_fit":
        raise ConfigError(
            f'[dataloader] homogeneous_rows = true needs packing = "best_fit" (got {config.packing!r}): wrap cuts '
            "documents across rows as they come"
        )
    if chat and config.mix_chunk_tokens:
        raise ConfigError(
            f"[dataloader] mix_chunk_tokens = {config.mix_chunk_tokens} with chat source {chat[0]}: the mixer would "
            "cut a conversation into pieces; leave it 0 (a row) (docs/chat.md)"
        )
    if config.split == "eval":
        empty = [s.name for s in config.sources if s.eval_fraction <= 0.0]
        if empty:
            raise ConfigError(
                f'sources {", ".join(empty)} hold out no documents (eval_fraction = 0), so split = "eval" reads '
                'nothing of them; set their eval_fraction or read them whole (split = "train")'
            )


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
