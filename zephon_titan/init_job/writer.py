"""The job TOML `zephon-titan init` writes: every choice with a comment saying why."""

from __future__ import annotations

import json
import math

from zephon_titan.engine.sources.init_sample import SAMPLE_FILES
from zephon_titan.init_job.choices import (
    BYTES_PER_PARAMETER,
    KEEP_CHECKPOINTS,
    VOCAB_MULTIPLE,
    JobChoices,
    checkpoint_interval,
    round_vocab,
)
from zephon_titan.init_job.listing import SourcePlan


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, (str, list)) else str(value)  # a JSON string is a TOML string


def _line(key: str, value, comment: str = "") -> str:
    """`key = value  # comment`; a long value gets its comment on the line above."""
    text = f"{key} = {_toml(value)}"
    if not comment:
        return text
    return f"{text:<37} # {comment}" if len(text) <= 37 else f"# {comment}\n{text}"


def count(n: float, units: tuple[str, ...] = ("", "K", "M", "B")) -> str:
    """1234567 -> 1.2M; 999 -> 999."""
    power = min(len(units) - 1, max(0, int(math.log10(max(n, 1)) // 3)))
    return f"{n / 1000**power:.1f}{units[power]}" if power else f"{n:.0f}{units[0]}"


def size(n: int) -> str:
    return count(n, (" bytes", " KB", " MB", " GB", " TB"))


def columns_text(columns: dict[str, str], most: int = 12) -> str:
    """Columns and their types, one line: `quality (double), lang (string)` (and how many more)."""
    shown = ", ".join(f"{name} ({kind[:40]})" for name, kind in list(columns.items())[:most])
    return shown + (f" and {len(columns) - most} more" if len(columns) > most else "")


def describe(plan: SourcePlan) -> str:
    unit = "dataset" if plan.datasets else "file"
    files = f"{len(plan.files)} {unit}{'s' if len(plan.files) > 1 else ''}"
    if plan.exact:
        counts = f"{count(plan.documents)} documents, {count(plan.tokens)} tokens (every document counted)"
    else:
        counts = f"~{count(plan.documents)} documents, ~{count(plan.tokens)} tokens" + estimated_from(plan)
    return f"{plan.format}, {files}, {size(plan.bytes)}, {counts}"


def estimated_from(plan: SourcePlan) -> str:
    """How many documents a text source's estimate tokenized, and from how many files."""
    if not plan.tokenized:
        return ""
    sampled = min(len(plan.files), SAMPLE_FILES)
    where = f"{sampled} of its {len(plan.files)} files" if sampled < len(plan.files) else "its files"
    return f" (estimated from {plan.tokenized:,} of them, spread over {where})"


def checkpoint_size(c: JobChoices) -> str:
    """What a checkpoint weighs, and so what keep_latest_k keeps on disk."""
    if c.parameters is None:
        return (
            f"a checkpoint is ~{BYTES_PER_PARAMETER} bytes per model parameter (fp32 weights, AdamW's two moments); "
            f"{KEEP_CHECKPOINTS} are kept"
        )
    one = c.parameters * BYTES_PER_PARAMETER
    return (
        f"a checkpoint is ~{size(one)} ({count(c.parameters)} parameters x {BYTES_PER_PARAMETER} bytes: fp32 weights "
        f"and AdamW's two moments); {KEEP_CHECKPOINTS} kept: ~{size(KEEP_CHECKPOINTS * one)} on disk"
    )


def _chat_lines(plan: SourcePlan) -> list[str]:
    keys = list(plan.chat.items())
    return [_line(keys[0][0], keys[0][1], plan.why_field), *(_line(k, v) for k, v in keys[1:])]


def render(c: JobChoices, command: str) -> str:
    """The job TOML, every choice with a comment saying why."""
    gpus = ",".join(map(str, c.layout.gpus))
    tokens_per_step = c.layout.global_batch_size * c.seq_len
    out = [
        f"# Written by: {command if len(command) < 300 else command[:300] + ' ...'}",
        f"# Check:  zephon-titan validate {c.path} --world-sizes {gpus}",
        f"# Train:  zephon-titan run --nproc {c.layout.gpus[0]} {c.path}   (checks the job first, then torchrun;",
        "#         no GPU: add --cpu). Every key: docs/configuration.md.",
        "# Relative paths start from the directory you launch from.",
        _line("hf_assets_path", c.tokenizer, f"the tokenizer (the trainer's and the loader's): {c.vocab_ids:,} ids"),
        _line("dump_folder", c.dump_folder, "this run's own folder: checkpoints, ledger.jsonl"),
        "",
        "[model]",
        _line("module", c.module, "a TorchTitan model package (or an importable recipe module)"),
        _line("config", c.config, "a function of its config_registry: its settings are the defaults"),
    ]
    if c.flavor:
        out.append(_line("flavor", c.flavor, "the model size"))
    out += [
        _line(
            "vocab_size",
            round_vocab(c.vocab_ids),
            f"the tokenizer's {c.vocab_ids:,} ids rounded up to {VOCAB_MULTIPLE}",
        ),
        "",
        "[training]",
        _line("seq_len", c.seq_len),
        _line(
            "global_batch_size",
            c.layout.global_batch_size,
            f"rows per step, fixed for the run: {gpus} GPUs all divide it",
        ),
        _line("local_batch_size", c.layout.local_batch_size, "rows per microbatch; lower it if one does not fit a GPU"),
        _line("steps", c.steps, f"one pass over the data: ~{c.one_pass:,} steps of {tokens_per_step:,} tokens"),
        "",
        "[checkpoint]",
        _line("enable", True),
        f"# {checkpoint_size(c)}",
        _line("interval", checkpoint_interval(c.steps), "steps between saves; the last step is always saved"),
        _line("keep_latest_k", KEEP_CHECKPOINTS, "older checkpoints are deleted (resuming reads the latest)"),
        _line("last_save_model_only", False, "keep the loader state in the last checkpoint (to resume)"),
        "",
        "[dataloader]",
        _line("num_lanes", c.layout.num_lanes, "fixed for the run; a multiple of every GPU count named"),
        _line("seed", c.seed, "every shuffle; another seed is another data order"),
        *(
            [_line("packing", "best_fit", "conversations are trained whole, one row each at most (docs/chat.md)")]
            if any(plan.chat for plan in c.sources)
            else []
        ),
        "# Validation on held-out documents: eval_fraction per source and [validator] (docs/validation.md).",
    ]
    for plan in c.sources:
        share = "as given" if c.weights_given else "its share of the estimated tokens: sources run out together"
        out += [
            "",
            f"[dataloader.sources.{plan.name}]",
            _line("paths", plan.paths, describe(plan)),
            *(
                [_line(key, value, why) for key, (value, why) in plan.token_settings.items()]
                if plan.token_ids
                else _chat_lines(plan)
                if plan.chat
                else [_line("text_field", plan.text_field, plan.why_field or "the text column")]
            ),
            _line("weight", c.weights[plan.name], share),
        ]
        if plan.columns:  # what keep and repeat may read, as a comment (docs/processing.md)
            out.append(f'# keep = "...", repeat = "..." over its columns: {columns_text(plan.columns)}')
    return "\n".join(out) + "\n"
