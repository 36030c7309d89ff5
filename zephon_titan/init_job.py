"""`zephon-titan init`: a starter job from your files and a tokenizer.

    zephon-titan init web=data/web code=data/code --tokenizer assets/my_tokenizer --gpus 8,16 -o my_job.toml

Each data argument is a source: a directory (every Parquet / JSONL / Megatron / OLMo file under it, one source
per format), a
file, or a quoted glob; `NAME=PATH` names it (else the directory's name). Files the shell expanded from one
directory (`data/code/*.parquet` unquoted) are one source again. For each source it samples a few documents
from a few files (spread over its list) to pick the text column and to estimate documents and tokens with
the job's own tokenizer (token files are counted from their indexes and sizes instead: their ids are the
documents); then it chooses the batch layout for the GPU counts named, writes a commented job
TOML and resolves it as the trainer does (so `zephon-titan validate` accepts it).
"""

from __future__ import annotations

import glob
import json
import math
import os
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from zephon_titan.engine.lanes import MAX_GLOBAL_BATCH_SIZE, divisors
from zephon_titan.engine.sources import formats, storage
from zephon_titan.engine.sources.base import expand_paths
from zephon_titan.engine.sources.columns import is_text_type
from zephon_titan.engine.sources.storage import FileStat
from zephon_titan.errors import ConfigError

SAMPLE_FILES = 8  # files read per source, spread over its sorted file list
SAMPLE_ROWS = 64  # documents read per sampled file
SAMPLE_BYTES = 1 << 20  # bytes of JSONL parsed per sampled file
COUNT_BYTES = 16 << 20  # bytes of a JSONL file (compressed) whose lines are counted; the rest is scaled from them
VOCAB_MULTIPLE = 64  # the model's vocabulary is rounded up to this (as `validate` suggests)
MAX_LANES = 64  # num_lanes proposed at most, unless the GPU counts need more
MAX_LOCAL_TOKENS = 16384  # the proposed local batch holds at most this many tokens (8 rows of 2048)
MAX_LOCAL_ROWS = 8
FILE_FORMATS = ("parquet", "jsonl", "megatron", "olmo")  # Lance datasets are directories, named by their .lance path
TOKEN_FORMATS = ("megatron", "olmo")  # token ids: no text column, counted from the files, not sampled texts


@dataclass
class Sample:
    """What one sampled file showed: its string fields' values, and how many documents it holds."""

    texts: dict[str, list[str]]  # field -> its values in the sampled documents (string fields only)
    other_fields: dict[str, str]  # field -> type, for fields that are not strings
    documents: int  # documents read
    file_documents: float  # documents in the whole file (exact, or estimated from the bytes read)


@dataclass
class SourcePlan:
    name: str
    paths: list[str]
    format: str
    files: list[FileStat]
    samples: list[Sample] = field(default_factory=list)
    text_field: str = ""
    why_field: str = ""
    documents: float = 0.0
    tokens: float = 0.0
    token_settings: dict[str, tuple[Any, str]] = field(default_factory=dict)
    """Token formats: the source's keys that say how to read the ids (value, why)."""

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)


# ---- which sources -------------------------------------------------------------------------------------


def plan_sources(arguments: list[str]) -> list[SourcePlan]:
    """One SourcePlan per data argument (a directory may give one per format), files listed."""
    plans: list[SourcePlan] = []
    loose: dict[tuple[str, str], list[str]] = {}  # (directory, format) -> plain files named one by one
    for argument in arguments:
        name, _, path = argument.partition("=") if _named(argument) else ("", "", argument)
        if _format_name(path.rstrip("/")) == "lance":
            plans.append(_lance_source(name or _name_of(path), path))
        elif os.path.isdir(path):
            plans += _directory_sources(name, path)
        elif not name and os.path.isfile(path):
            loose.setdefault((os.path.dirname(path), _format(path, path)), []).append(path)
        else:
            plans.append(_source(name or _name_of(path), [path]))
    for (directory, _), paths in loose.items():
        plans.append(_source(_name_of(directory or "."), _as_glob(directory, paths)))
    _deduplicate_names(plans)
    return plans


def _as_glob(directory: str, paths: list[str]) -> list[str]:
    """Files named one by one (a glob the shell expanded): `directory/*<ending>` when that is all of them."""
    endings = {"." + os.path.basename(p).split(".", 1)[1] for p in paths if "." in os.path.basename(p)}
    if len(endings) == 1:
        pattern = os.path.join(directory, "*" + endings.pop())
        if sorted(map(os.path.normpath, glob.glob(pattern))) == sorted(map(os.path.normpath, paths)):
            return [pattern]
    return paths


def _named(argument: str) -> bool:
    name, sep, _ = argument.partition("=")
    return bool(sep) and name.replace("_", "").replace("-", "").isalnum()


def _format_name(path: str) -> str | None:
    """The registered format whose file endings `path` has (None: no format's)."""
    return next((n for n in formats.format_names() if path.endswith(formats.get_format(n, "").extensions)), None)


def _format(path: str, argument: str) -> str:
    name = _format_name(path)
    if name not in FILE_FORMATS:
        raise ConfigError(
            f"{argument}: {path} is not a Parquet, JSONL (.jsonl, .jsonl.gz, .jsonl.zst), Megatron (.bin) or OLMo (.npy) "
            "file (nor a .lance dataset); "
            "leave it out, or name only the data files"
        )
    return name


def _directory_sources(name: str, directory: str) -> list[SourcePlan]:
    """Every data file (Parquet, JSONL, Megatron .bin, OLMo .npy) under `directory`: one source per format, one
    glob per file ending."""
    endings: dict[str, set[str]] = {}
    for _, _, files in os.walk(directory):
        for file in files:
            fmt = _format_name(file)
            if fmt in FILE_FORMATS:
                extensions = formats.get_format(fmt, "").extensions
                endings.setdefault(fmt, set()).add(max((e for e in extensions if file.endswith(e)), key=len))
    if not endings:
        raise ConfigError(
            f"{directory}: no data file (.parquet, .jsonl, .jsonl.gz, .jsonl.zst, .bin, .npy) under it; "
            "name the folder that holds your data files"
        )
    base = name or _name_of(directory)
    return [
        _source(
            base if len(endings) == 1 else f"{base}_{fmt}",
            [os.path.join(directory, "**", f"*{e}") for e in sorted(ends)],
        )
        for fmt, ends in sorted(endings.items())
    ]


def _lance_source(name: str, pattern: str) -> SourcePlan:
    from zephon_titan.engine.sources.lance import expand_datasets

    datasets = expand_datasets(name, [pattern])
    sizes = [sum(os.path.getsize(os.path.join(r, f)) for r, _, files in os.walk(d) for f in files) for d in datasets]
    return SourcePlan(name, [pattern], "lance", [FileStat(d, size, 0) for d, size in zip(datasets, sizes)])


def _source(name: str, paths: list[str]) -> SourcePlan:
    for pattern in paths:
        if not storage.expand(pattern):
            raise ConfigError(
                f"{pattern}: matches no file (from {os.getcwd()}); fix the path, and quote a glob so that init "
                "reads it (not the shell)"
            )
    files = expand_paths(name, paths)  # the loader's own listing, sorted
    found = {_format(f.path, ", ".join(paths)) for f in files}
    if len(found) > 1:
        raise ConfigError(
            f"{', '.join(paths)}: mixes {' and '.join(sorted(found))} files; give each format its own argument "
            "(a source reads one format)"
        )
    return SourcePlan(name, paths, found.pop(), files)


def _name_of(path: str) -> str:
    """A source name from a path: the last folder before any wildcard, else the file's name."""
    parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]
    plain = [p for p in parts if not any(c in p for c in "*?[")]
    if len(plain) == len(parts) and plain and _format_name(plain[-1]):
        plain[-1] = plain[-1].split(".", 1)[0]  # a file or dataset: its name without extensions
    chosen = plain[-1] if plain else "data"
    cleaned = "".join(c if c.isalnum() or c in "_-" else "_" for c in chosen).strip("_-")
    return (cleaned or "data")[:48]


def _deduplicate_names(plans: list[SourcePlan]) -> None:
    seen: set[str] = set()
    for plan in plans:
        name, n = plan.name, 2
        while plan.name in seen:
            plan.name, n = f"{name}_{n}", n + 1
        seen.add(plan.name)


# ---- what the files hold -------------------------------------------------------------------------------


def spread(files: list[FileStat], count: int = SAMPLE_FILES) -> list[FileStat]:
    """Up to `count` files evenly spread over the list (first and last included)."""
    if len(files) <= count:
        return files
    return [files[round(i * (len(files) - 1) / (count - 1))] for i in range(count)]


def sample_file(fmt: str, file: FileStat) -> Sample:
    if fmt == "lance":
        return _sample_lance(file.path)
    # A handle of its own: the sample reads it as a stream and closes it (a shared, cached one would be left
    # closed, or at another position, for the next reader in this process).
    with storage.open_own_file(file.path) as handle:
        return _sample_parquet(handle) if fmt == "parquet" else _sample_jsonl(handle, file)


def _string_columns(schema: pa.Schema) -> tuple[list[str], dict[str, str]]:
    """(the string columns, {other column: its type})."""
    strings = [f.name for f in schema if is_text_type(f.type)]
    return strings, {f.name: str(f.type) for f in schema if f.name not in strings}


def _columns_sample(first_rows: pa.Table | pa.RecordBatch, others: dict[str, str], total: int) -> Sample:
    texts = {
        name: [v for v in first_rows.column(name).to_pylist() if v is not None] for name in first_rows.schema.names
    }
    return Sample(texts, others, min(total, SAMPLE_ROWS), total)


def _sample_parquet(handle: pa.NativeFile) -> Sample:
    parquet = pq.ParquetFile(handle)
    strings, others = _string_columns(parquet.schema_arrow)
    rows = parquet.metadata.num_rows
    first = next(parquet.iter_batches(batch_size=SAMPLE_ROWS, columns=strings)) if strings and rows else pa.table({})
    return _columns_sample(first, others, rows)


def _sample_lance(path: str) -> Sample:
    try:
        import lance
    except ImportError:
        raise ConfigError(f"{path}: a Lance dataset needs pylance: pip install 'zephon-titan[lance]'") from None
    dataset = lance.dataset(path)
    strings, others = _string_columns(dataset.schema)
    first = dataset.to_table(columns=strings, limit=SAMPLE_ROWS) if strings else pa.table({})
    return _columns_sample(first, others, dataset.count_rows())


def _sample_jsonl(handle: pa.NativeFile, file: FileStat) -> Sample:
    """The first lines (SAMPLE_BYTES, or up to the end of the first line) parsed; the file's lines counted."""
    codec = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}.get(os.path.splitext(file.path)[1])
    stream = pa.CompressedInputStream(handle, codec) if codec else handle
    data, whole = b"", False
    while not whole and (len(data) < SAMPLE_BYTES or b"\n" not in data) and len(data) < 64 * SAMPLE_BYTES:
        chunk = stream.read(SAMPLE_BYTES)
        data, whole = data + chunk, not chunk
    lines = data.split(b"\n")
    if not whole:
        lines.pop()  # the line the last read cut off
    records = [_record(line, file.path, n) for n, line in enumerate(lines, 1) if line.strip()]
    documents = len(records) if whole else _count_lines(stream, handle, data.count(b"\n"), file.size)
    texts: dict[str, list[str]] = {}
    others: dict[str, str] = {}
    for record in records[:SAMPLE_ROWS]:
        for key, value in record.items():
            if isinstance(value, str):
                texts.setdefault(key, []).append(value)
            else:
                others.setdefault(key, type(value).__name__)
    read = min(len(records), SAMPLE_ROWS)
    others.update({k: "not a string in every line" for k, v in texts.items() if len(v) < read})
    return Sample({k: v for k, v in texts.items() if len(v) == read}, others, read, documents)


def _count_lines(stream: pa.NativeFile, handle: pa.NativeFile, seen: int, size: int) -> float:
    """The lines of a file `seen` of which were read: counted to its end within COUNT_BYTES of `handle` (the
    file's own bytes, compressed or not), else scaled from the bytes read."""
    last = b"\n"
    while handle.tell() < COUNT_BYTES:
        chunk = stream.read(SAMPLE_BYTES)
        if not chunk:
            return seen + (last != b"\n")  # a last line without a newline is a line too
        seen, last = seen + chunk.count(b"\n"), chunk[-1:]
    return seen * size / handle.tell()


def _record(line: bytes, path: str, number: int) -> dict:
    try:
        record = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path} line {number}: not valid JSON ({e}); fix the line or leave the file out") from None
    if not isinstance(record, dict):
        raise ConfigError(f"{path} line {number}: a JSON {type(record).__name__}, expected an object per line")
    return record


def choose_text_field(plan: SourcePlan) -> None:
    """`text` if every sampled file has it as a string, else the string field with the longest average values."""
    samples = [s for s in plan.samples if s.documents]  # an empty file has no say
    common = set.intersection(*(set(s.texts) for s in samples))
    if not common:
        found = ", ".join(f"{k} ({t})" for k, t in samples[0].other_fields.items()) or "none"
        raise ConfigError(
            f"{plan.files[0].path}: no string column in every sampled document of source {plan.name!r} (columns: "
            f"{found}); init needs a column of text (pre-tokenized ids: set token_field by hand, docs/configuration.md)"
        )
    mean = {
        k: sum(len(t) for s in samples for t in s.texts[k]) / max(1, sum(len(s.texts[k]) for s in samples))
        for k in common
    }
    ranked = sorted(common, key=lambda k: (-mean[k], k))
    if "text" in common:
        plan.text_field, plan.why_field = "text", ""
        return
    plan.text_field = ranked[0]
    others = ", ".join(f"{k} {mean[k]:,.0f}" for k in ranked[1:4])
    plan.why_field = (
        f'no "text" column; {ranked[0]!r} has the longest texts (mean {mean[ranked[0]]:,.0f} characters'
        + (f"; others: {others})" if others else ")")
    )


def estimate(plan: SourcePlan, tokenizer) -> None:
    """Documents from the sampled files' counts scaled by bytes; tokens from the sample tokenized."""
    read = sum(s.file_documents for s in plan.samples)
    plan.documents = read * plan.bytes / max(1, sum(f.size for f in spread(plan.files)))
    texts = [t for s in plan.samples for t in s.texts.get(plan.text_field, [])]  # an empty file has none
    ids = tokenizer.encode(texts) if texts else []
    plan.tokens = plan.documents * (sum(len(i) for i in ids) / max(1, len(ids)))


def count_token_files(plan: SourcePlan, tokenizer) -> None:
    """A token source's documents and tokens: Megatron's from its indexes (exact), OLMo's tokens from the
    file sizes and documents from the mean length of the documents in the sampled files' first blocks."""
    from zephon_titan.config import SourceConfig
    from zephon_titan.engine.sources import open_source

    specials = (tokenizer.bos_id is not None) + (tokenizer.eos_id is not None)
    if plan.format == "olmo":
        if tokenizer.eos_id is None:
            raise ConfigError(
                f"{', '.join(plan.paths)}: OLMo token files end each document with the tokenizer's EOS, and this "
                "tokenizer adds none; write the job by hand with eos_token_id (docs/configuration.md)"
            )
        dtype = "uint16" if tokenizer.vocab_size <= 1 << 16 else "uint32"
        plan.token_settings = {
            "eos_token_id": (tokenizer.eos_id, "the tokenizer's EOS: each document of the files ends with it"),
            "token_dtype": (dtype, f"as OLMo-core picks it for a vocabulary of {tokenizer.vocab_size:,} ids"),
        }
    config = SourceConfig(
        name=plan.name, paths=plan.paths, format=plan.format, **{k: v for k, (v, _) in plan.token_settings.items()}
    )
    source = open_source(config)
    plan.tokens = source.token_count()  # type: ignore[attr-defined]  # MegatronSource, OlmoSource
    if plan.format == "megatron":
        plan.documents = sum(f.block_rows[0] for f in source.files)
    else:
        starts = list(accumulate(f.num_blocks for f in source.files))  # each file's first block, + its blocks
        firsts = [start - f.num_blocks for start, f in zip(starts, source.files) if f.num_blocks]
        sampled = firsts[:: max(1, len(firsts) // SAMPLE_FILES)][:SAMPLE_FILES]
        lengths = [len(t) for block in map(source.read_block, sampled) for t in block.texts]
        plan.documents = plan.tokens / max(1.0, sum(lengths) / max(1, len(lengths)))
    plan.tokens += plan.documents * specials  # BOS/EOS added (a document's own are not doubled: a bound)
    plan.why_field = "token ids: no tokenization"


def inspect_sources(arguments: list[str], tokenizer) -> list[SourcePlan]:
    plans = plan_sources(arguments)
    for plan in plans:
        if plan.format in TOKEN_FORMATS:
            count_token_files(plan, tokenizer)
            continue
        plan.samples = [sample_file(plan.format, f) for f in spread(plan.files)]
        if not any(s.documents for s in plan.samples):
            raise ConfigError(f"{', '.join(plan.paths)}: the sampled files hold no document; check the files")
        choose_text_field(plan)
        estimate(plan, tokenizer)
    return plans


# ---- the batch layout ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    gpus: tuple[int, ...]
    global_batch_size: int
    local_batch_size: int
    num_lanes: int

    def why(self) -> list[str]:
        lcm = math.lcm(*self.gpus)
        per_gpu = ", ".join(f"{self.global_batch_size // w} on {w}" for w in self.gpus)
        return [
            f"global_batch_size {self.global_batch_size}, local_batch_size {self.local_batch_size}: a multiple of "
            f"{self.local_batch_size} x {lcm} (the least common multiple of the GPU counts), so every count divides "
            f"it and each GPU's rows are whole microbatches (rows per GPU: {per_gpu})",
            f"num_lanes {self.num_lanes}: a multiple of {lcm} dividing the global batch (each GPU makes whole lanes), "
            f"at most {max(MAX_LANES, lcm)}",
        ]


def propose_layout(gpus: list[int], seq_len: int, local: int | None, global_: int | None) -> Layout:
    if not gpus or min(gpus) < 1:
        raise ConfigError(f"--gpus {','.join(map(str, gpus))}: name positive GPU counts, e.g. --gpus 8,16,32")
    lcm = math.lcm(*gpus)
    local = local or max(1, min(MAX_LOCAL_ROWS, MAX_LOCAL_TOKENS // seq_len))
    unit = lcm * local  # every GPU count divides a multiple of it, and local divides the rows per GPU
    size = global_ or unit
    if size % unit:
        raise ConfigError(
            f"--global-batch-size {size}: must be a multiple of {unit} (local_batch_size {local} x {lcm}, the least "
            f"common multiple of --gpus {','.join(map(str, gpus))}), e.g. {unit * max(1, round(size / unit))}"
        )
    if size > MAX_GLOBAL_BATCH_SIZE:
        raise ConfigError(
            f"--gpus {','.join(map(str, gpus))} with local batch {local} need {size:,} rows per step, above the "
            f"bound of {MAX_GLOBAL_BATCH_SIZE:,}; name fewer or rounder GPU counts (e.g. powers of 2)"
        )
    lanes = max(lcm * k for k in divisors(size // lcm, limit=1 << 12) if lcm * k <= max(MAX_LANES, lcm))
    return Layout(tuple(sorted(set(gpus))), size, local, lanes)


# ---- the job file --------------------------------------------------------------------------------------


def round_vocab(ids: int) -> int:
    return -(-ids // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def weights_of(plans: list[SourcePlan], given: dict[str, float]) -> dict[str, float]:
    """The given weights (every source named), else each source's share of the estimated tokens."""
    names = [p.name for p in plans]
    if given:
        if sorted(given) != sorted(names):
            raise ConfigError(
                f"--weights names {', '.join(sorted(given))}, the sources are {', '.join(names)}; give one "
                "weight per source (NAME=W,...) or leave --weights out (weights from the sizes)"
            )
        return {n: given[n] for n in names}
    total = sum(p.tokens for p in plans) or 1.0
    return {p.name: max(round(p.tokens / total, 4), 0.0001) for p in plans}


def distinct_dump_folder(job_path: str) -> str:
    """outputs/<job name>, or outputs/<job name>-N when that folder exists (another run's checkpoints)."""
    stem = os.path.splitext(os.path.basename(job_path))[0] or "job"
    folder, n = os.path.join("outputs", stem), 2
    while os.path.exists(folder):
        folder, n = os.path.join("outputs", f"{stem}-{n}"), n + 1
    return folder


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


def _count(n: float, units: tuple[str, ...] = ("", "K", "M", "B")) -> str:
    """1234567 -> 1.2M; 999 -> 999."""
    power = min(len(units) - 1, max(0, int(math.log10(max(n, 1)) // 3)))
    return f"{n / 1000**power:.1f}{units[power]}" if power else f"{n:.0f}{units[0]}"


def _bytes(n: int) -> str:
    return _count(n, (" bytes", " KB", " MB", " GB", " TB"))


def describe(plan: SourcePlan) -> str:
    unit = "dataset" if plan.format == "lance" else "file"
    files = f"{len(plan.files)} {unit}{'s' if len(plan.files) > 1 else ''}"
    return f"{plan.format}, {files}, {_bytes(plan.bytes)}, ~{_count(plan.documents)} documents, ~{_count(plan.tokens)} tokens"


@dataclass
class JobChoices:
    path: str
    tokenizer: str
    vocab_ids: int
    module: str
    config: str
    flavor: str
    seq_len: int
    layout: Layout
    steps: int
    one_pass: int  # steps to read every source once, by the estimates
    seed: int
    dump_folder: str
    weights: dict[str, float]
    weights_given: bool
    sources: list[SourcePlan]


def render(c: JobChoices, command: str) -> str:
    """The job TOML, every choice with a comment saying why."""
    gpus = ",".join(map(str, c.layout.gpus))
    tokens_per_step = c.layout.global_batch_size * c.seq_len
    out = [
        f"# Written by: {command if len(command) < 300 else command[:300] + ' ...'}",
        f"# Check:  zephon-titan validate {c.path} --world-sizes {gpus}",
        f"# Train:  torchrun --nproc_per_node {c.layout.gpus[0]} -m zephon_titan.train --job.config_file {c.path}",
        "#         (no GPU: -m zephon_titan.train_cpu). Every key: docs/configuration.md.",
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
        _line("interval", max(1, min(500, c.steps // 10)), "steps between checkpoints (a resume may use any count)"),
        _line("last_save_model_only", False, "keep the loader state in the last checkpoint (to resume)"),
        "",
        "[dataloader]",
        _line("num_lanes", c.layout.num_lanes, "fixed for the run; a multiple of every GPU count named"),
        _line("seed", c.seed, "every shuffle; another seed is another data order"),
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
                if plan.format in TOKEN_FORMATS
                else [_line("text_field", plan.text_field, plan.why_field or "the text column")]
            ),
            _line("weight", c.weights[plan.name], share),
        ]
    return "\n".join(out) + "\n"


# ---- the command ---------------------------------------------------------------------------------------


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
            "(huggingface-cli download <model> tokenizer.json tokenizer_config.json --local-dir DIR)"
        )


def parse_weights(text: str) -> dict[str, float]:
    weights = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        try:
            weights[name.strip()] = float(value)
        except ValueError:
            raise ConfigError(f"--weights {text}: expected NAME=WEIGHT,... (e.g. web=0.7,code=0.3)") from None
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
    print(f"sources (sampled up to {SAMPLE_FILES} files x {SAMPLE_ROWS} documents each, tokenized with {c.tokenizer}):")
    for plan in c.sources:
        field = plan.why_field if plan.format in TOKEN_FORMATS else f"text_field {plan.text_field!r}"
        print(
            f"  {plan.name}: {describe(plan)}; {field}"
            + (f" ({plan.why_field})" if plan.why_field and plan.format not in TOKEN_FORMATS else "")
        )
    how = "as given" if c.weights_given else "each source's share of the tokens, so all run out at the same step"
    print("weights: " + ", ".join(f"{n} {w:g}" for n, w in c.weights.items()) + f" ({how})")
    print(f"vocab_size {round_vocab(c.vocab_ids)}: the tokenizer's {c.vocab_ids:,} ids rounded up to {VOCAB_MULTIPLE}")
    for line in c.layout.why():
        print(line)
    print(
        f"steps {c.steps} (one pass over ~{_count(sum(p.tokens for p in c.sources))} tokens is ~{c.one_pass:,}); "
        f"dump_folder {c.dump_folder}"
    )
    gpus = ",".join(map(str, c.layout.gpus))
    print(
        f"wrote {c.path} (it resolves as the trainer reads it); next: zephon-titan validate {c.path} --world-sizes {gpus}"
    )
