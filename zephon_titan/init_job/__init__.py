"""`zephon-titan init`: a starter job from your files and a tokenizer.

    zephon-titan init web=data/web code=data/code --tokenizer assets/my_tokenizer --gpus 8,16 -o my_job.toml

Each data argument is a source: a directory (every data file under it, one source per format), a file, a
dataset directory, or a quoted glob; `NAME=PATH` names it (else the directory's name). Files the shell expanded
from one directory (`data/code/*.parquet` unquoted) are one source again. Each source's format says how init
reads it (its `Format.init` hook, engine/sources/init_sample.py): a text format's files (up to 8, spread over
its list) show their first documents, to pick the text column; then documents spread over each of those files
(estimate.py; a small file read whole) are tokenized with the job's own tokenizer to estimate its documents and
tokens; a token format counts its ids from the files (its ids are the documents). Then
init chooses the batch layout for the GPU counts named, writes a commented job TOML and resolves it as the
trainer does (so `zephon-titan validate` accepts it).

    listing.py   which sources the arguments name, their files listed
    sampling.py  what the files hold, asked of each format's hook
    estimate.py  documents and tokens from documents spread over each file (a small file counted whole)
    choices.py   the batch layout, weights, vocabulary size, run folder
    writer.py    the job TOML with a comment for each choice
"""

from __future__ import annotations

import math
import os

from zephon_titan.engine.sources.init_sample import SAMPLE_FILES
from zephon_titan.errors import ConfigError
from zephon_titan.init_job.choices import (
    KEEP_CHECKPOINTS,
    VOCAB_MULTIPLE,
    JobChoices,
    Layout,
    checkpoint_interval,
    distinct_dump_folder,
    model_parameters,
    propose_layout,
    round_vocab,
    weights_of,
)
from zephon_titan.init_job.estimate import file_budget
from zephon_titan.init_job.sampling import inspect_sources
from zephon_titan.init_job.writer import checkpoint_size, columns_text, count, describe, render, size


def check_tokenizer_dir(path: str) -> None:
    if not os.path.isdir(path):
        what = "is a file" if os.path.isfile(path) else "does not exist"
        raise ConfigError(
            f"--tokenizer {path} {what}; name the directory holding tokenizer.json and tokenizer_config.json "
            "(e.g. a Hugging Face model download)"
        )
    if not os.path.isfile(os.path.join(path, "tokenizer.json")):
        raise ConfigError(
            f"--tokenizer {path} holds no tokenizer.json; download it with the model's tokenizer_config.json "
            "(hf download <model> tokenizer.json tokenizer_config.json --local-dir DIR)"
        )


def parse_weights(text: str) -> dict[str, float]:
    weights = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        try:
            weights[name.strip()] = float(value)
        except ValueError:
            raise ConfigError(f"--weights {text}: expected NAME=WEIGHT,... (e.g. web=0.7,code=0.3)") from None
        if not 0 < weights[name.strip()] < math.inf:  # said now, not as a key of the job it would write
            raise ConfigError(f"--weights {text}: {name.strip()}'s weight must be a finite number > 0, got {value}")
    return weights


def parse_recipe(text: str) -> tuple[str, str]:
    module, _, config = text.partition(":")
    if not module or not config:
        raise ConfigError(
            f"--recipe {text}: expected MODULE:CONFIG, e.g. llama3:llama3_8b (TorchTitan's --module and --config)"
        )
    return module, config


def run(args, command: str) -> int:
    from zephon_titan.titan.tokenizer import load_tokenizer

    if os.path.exists(args.output) and not args.force:
        raise ConfigError(f"{args.output} exists; pass --force to replace it, or -o another file")
    folder = os.path.dirname(os.path.abspath(args.output))
    if os.path.isdir(args.output):  # found now, not after the files are read
        raise ConfigError(
            f"-o {args.output} is a folder; name a file in it (-o {os.path.join(args.output, 'job.toml')})"
        )
    if not os.path.isdir(folder):
        raise ConfigError(f"-o {args.output}: the folder {folder} does not exist; create it or name a file elsewhere")
    check_tokenizer_dir(args.tokenizer)
    module, config = parse_recipe(args.recipe)
    given = parse_weights(args.weights or "")
    layout = propose_layout(args.gpus, args.seq_len, args.local_batch_size, args.global_batch_size)
    tokenizer = load_tokenizer(args.tokenizer, key="--tokenizer", backend="tokenizers")  # ids to count only
    plans = inspect_sources(args.data, tokenizer)
    total = sum(p.tokens for p in plans)
    one_pass = max(1, math.ceil(total / (layout.global_batch_size * args.seq_len)))
    choices = JobChoices(
        path=args.output,
        tokenizer=args.tokenizer,
        vocab_ids=tokenizer.vocab_size,
        module=module,
        config=config,
        flavor=args.flavor or "",
        seq_len=args.seq_len,
        layout=layout,
        steps=args.steps or one_pass,
        one_pass=one_pass,
        seed=args.seed,
        dump_folder=distinct_dump_folder(args.output),
        weights=weights_of(plans, given),
        weights_given=bool(given),
        sources=plans,
        parameters=model_parameters(module, config, args.flavor or "", round_vocab(tokenizer.vocab_size)),
    )
    with open(args.output, "w", encoding="utf-8") as f:
        f.write(render(choices, command))
    try:
        check_written(args.output, layout)
    except ConfigError:
        os.remove(args.output)
        raise
    report(choices)
    return 0


def check_written(path: str, layout: Layout) -> None:
    """The written job resolves as the trainer reads it (recipe, keys, vocabulary) at every GPU count."""
    from zephon_titan.titan.job import load_job

    job = load_job(path)
    for w in layout.gpus:
        job.check_layout(w)
    job.check_model_vocab()


def report(c: JobChoices) -> None:
    print(
        f"sources (documents spread over up to {SAMPLE_FILES} files of each, up to {size(file_budget(1))} a "
        f"source, a smaller file counted whole; tokenized with {c.tokenizer}):"
    )
    for plan in c.sources:
        if plan.token_ids or plan.chat:
            field = plan.why_field
        else:
            field = f"text_field {plan.text_field!r}" + (f" ({plan.why_field})" if plan.why_field else "")
        print(f"  {plan.name}: {describe(plan)}; {field}")
        if plan.columns:
            print(f"    columns for keep and repeat: {columns_text(plan.columns)}")
    how = "as given" if c.weights_given else "each source's share of the tokens, so all run out at the same step"
    print("weights: " + ", ".join(f"{n} {w:g}" for n, w in c.weights.items()) + f" ({how})")
    print(f"vocab_size {round_vocab(c.vocab_ids)}: the tokenizer's {c.vocab_ids:,} ids rounded up to {VOCAB_MULTIPLE}")
    for line in c.layout.why():
        print(line)
    print(
        f"steps {c.steps} (one pass over ~{count(sum(p.tokens for p in c.sources))} tokens is ~{c.one_pass:,}); "
        f"dump_folder {c.dump_folder}"
    )
    print(f"checkpoint interval {checkpoint_interval(c.steps)}, keep_latest_k {KEEP_CHECKPOINTS}: {checkpoint_size(c)}")
    gpus = ",".join(map(str, c.layout.gpus))
    print(
        f"wrote {c.path} (it resolves as the trainer reads it); next: zephon-titan validate {c.path} --world-sizes {gpus}"
    )
