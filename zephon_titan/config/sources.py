"""The schema of one source: `[dataloader.sources.<name>]` (SourceConfig), its bounds and its checks.

Its own module because a source is a table of its own: `[validator.dataloader.sources.<name>]` takes the
same keys, the engine's readers (engine/sources/) take a SourceConfig alone, and a source is checked
whole when it is made, before the DataConfig that lists it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from zephon_titan.config.expressions import check_keep, check_repeat
from zephon_titan.config.schema import check_settings, not_empty, setting, short_repr
from zephon_titan.errors import ConfigError

# Bounds that keep the loader's checkpoint header within its fixed slot (engine/resume.py).
MAX_SOURCE_NAME = 64
MAX_WEIGHT = 1e6
# The smallest eval_fraction other than 0. engine/split.py holds a document out when the top 53 bits of its
# hash are below eval_fraction * 2**53, so below 2**-53 (1.1e-16) nothing can ever be held out; at 1e-9 a
# corpus of a billion documents is expected to hold out one. Anything smaller is a typo (1e-300), not a plan.
MIN_EVAL_FRACTION = 1e-9

# How the split reaches the fingerprint (sources' eval_fraction; [dataloader] split_seed and split).
THE_SPLIT = "the split component, present only when some source has an eval_fraction > 0 (else it selects nothing)"


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


_REFERENCE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")


def _check_transforms(value: list[str], what: str) -> None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f'{what} must be a list of "module:function" strings, got {short_repr(value)}')
    for reference in value:
        if not _REFERENCE.fullmatch(reference):
            raise ConfigError(
                f'{what}: {reference!r} is not module:function (e.g. "my_cleanup.text:strip_boilerplate")'
            )


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

    text_field: str = setting("text", rows=True, check=not_empty())
    """JSON field or Parquet column holding the document text."""

    token_field: str = setting("", rows=True, rows_note="Parquet, Lance, MDS and LitData sources only")
    """Parquet, Lance, MDS, LitData: a column of token ids (lists of ints, from this run's tokenizer) used instead
    of tokenizing text_field; BOS/EOS are still added as configured."""

    format: str = setting(
        "auto",
        rows=True,
        rows_note="the format it resolves to: `auto` and the format it picks are the same rows",
        check=not_empty('use "auto" or a format name'),
        allowed="`auto` or a registered format (engine/sources/formats.py): jsonl, parquet, lance, megatron, olmo, mds, litdata",
    )
    """`jsonl`, `parquet`, `lance`, `megatron`, `olmo`, `mds`, `litdata`, or `auto` (from the file extension; `.lance`
    for Lance datasets, `.bin` for Megatron indexed datasets: list the `.bin` files, each with its `.idx` beside it;
    `.npy` for OLMo token files; a dataset's `index.json` for Mosaic Streaming (MDS) and LitData datasets, told
    apart by its first bytes)."""

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
        rows_note="Lance, Megatron, MDS and LitData sources only",
        bounds=(1, 1 << 20, "a block's rows are read into memory, shuffle_window_blocks of them at a time"),
    )
    """Lance: rows per block (each fragment is cut into blocks of this many rows). Megatron: documents per
    block (each `.bin` is cut into blocks of this many documents). MDS and LitData: samples per block (each
    uncompressed shard, or LitData chunk with zstd inside, is cut into blocks of this many samples; a shard
    compressed whole is one block)."""

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
        rows_note=THE_SPLIT,
        bounds=(0.0, 0.99, "a source held out whole is an eval source: list it in [validator.dataloader.sources]"),
        check=_check_eval_fraction,
    )
    """Share of this source's documents held out for validation, chosen by a keyed hash of each
    document's file name and row ([dataloader] split_seed): training never reads them, and
    [validator.dataloader] reads them when it names no sources of its own. 0: none held out;
    otherwise in [1e-9, 0.99] (MIN_EVAL_FRACTION)."""

    keep: str = setting(
        "",
        rows=True,
        rows_note="the pipeline component of the source, present only with keep or repeat",
        check=check_keep,
        allowed="a condition over the record's columns (docs/processing.md), e.g. `quality >= 0.7 and lang == 'en'`",
    )
    """Train only the documents for which this condition over the record's columns (Parquet, Lance) or fields
    (JSON Lines) is true, e.g. `quality >= 0.7 and lang == 'en' and chars > 200`; a missing value is never
    true. Not for token files. The grammar: docs/processing.md."""

    repeat: str = setting(
        "",
        rows=True,
        rows_note="the pipeline component of the source, present only with keep or repeat",
        check=check_repeat,
        allowed="a number or a bounded numeric expression (docs/processing.md), e.g. `0.3` or `min(score * 2, 3)`",
    )
    """How many times a pass trains each document: floor(x), and once more with probability frac(x) (a keyed
    hash of the document and the pass), e.g. `0.3` (30 % of the source each pass) or `min(score * 2, 3)`. The
    expression must be bounded (at most 16); the copies are shuffled apart. Empty: once."""

    transform: list[str] = setting(
        factory=list,
        rows=True,
        rows_note="the transform component of the source: each function's module, name and code digest (or version)",
        check=_check_transforms,
        allowed="a list of `module:function` names (docs/processing.md)",
    )
    """Your own functions, applied in order to each document this source trains: `module:function`, importable
    by every process of the job. Each takes the record (a dict of its columns, the text included) and returns the
    new text, a new record, or None to drop the document. Checked for determinism when the job starts."""

    chat: bool = setting(False, rows=True, rows_note="the chat component of the source (its template's digest)")
    """The documents are conversations (docs/chat.md): rendered by a chat template and trained on the loss mask
    `loss_on` chooses, each whole in one row (best_fit packing)."""

    messages_field: str = setting("messages", rows=True, rows_note="chat sources only", check=not_empty())
    """Chat sources: the field or column holding each conversation, a list of {role, content} messages (roles
    system, user, assistant, tool); in JSON Lines a JSON list (or a string holding one)."""

    prompt_field: str = setting("", rows=True, rows_note="chat sources only")
    """Chat sources: instead of messages_field, the field of a single user turn (with response_field), e.g.
    GSM8K's `question`."""

    response_field: str = setting("", rows=True, rows_note="chat sources only")
    """Chat sources: the field of the single assistant turn that answers prompt_field, e.g. GSM8K's `answer`."""

    chat_template: str = setting("", rows=True, rows_note="the chat component: the template's SHA-256, not its path")
    """Chat sources: a Jinja template file; empty: the tokenizer's (chat_template.jinja beside tokenizer.json, or
    chat_template in tokenizer_config.json), as TorchTitan's tokenizer finds it."""

    loss_on: str = setting(
        "assistant",
        rows=True,
        rows_note="chat sources only",
        choices={
            "assistant": "every assistant message (its end-of-turn tokens included)",
            "last_assistant": "the last assistant message only",
            "all": "every token of the conversation",
        },
    )
    """Chat sources: which targets are trained; the others get label -100."""

    too_long: str = setting(
        "drop",
        rows=True,
        rows_note="chat sources only",
        choices={
            "drop": "left out and counted (TorchTitan's rule)",
            "truncate": "cut to the row, its mask cut with it",
            "error": "the run stops, naming the file and row",
        },
    )
    """Chat sources: a conversation longer than a row."""

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
        # Names are written and read as lists separated by commas: the messages and log lines that list
        # sources (the fingerprint's `sources` in a resume's changes and in `inspect`, "sources: a, b" hints,
        # the eval set's errors) and `zephon-titan init --weights NAME=W,...`. A comma in a name would make
        # those lists ambiguous; a control character would break the one-line messages. (The checkpoint
        # keeps the names as a list since header version 3, engine/resume.py.)
        raise ConfigError(
            f"[dataloader.sources.{source.name!r}]: a source name may not contain {', '.join(map(repr, bad))} "
            "(source names are listed separated by commas, in messages and in init --weights); rename the source, e.g. "
            f"{''.join('_' if c in bad else c for c in source.name)!r}"
        )
    paths = source.paths
    if not (isinstance(paths, list) and paths and all(isinstance(p, str) and p for p in paths)):
        raise ConfigError(f"{where} paths must be a non-empty list of strings, got {short_repr(paths)}")
    check_settings(source, where)
    if bool(source.prompt_field) != bool(source.response_field):
        raise ConfigError(f"{where} prompt_field and response_field go together (one user turn, one assistant turn)")
    chat_only = [k for k in ("prompt_field", "chat_template") if getattr(source, k)]
    chat_only += [k for k, default in (("loss_on", "assistant"), ("too_long", "drop"), ("messages_field", "messages"))
                  if getattr(source, k) != default]  # fmt: skip
    if chat_only and not source.chat:
        raise ConfigError(f"{where} {chat_only[0]} is for chat sources; set chat = true (docs/chat.md) or remove it")
    if source.chat and (source.token_field or source.transform):
        key = "token_field" if source.token_field else "transform"
        raise ConfigError(f"{where} is a chat source: its documents are conversations, not {key}; remove {key}")
