"""`validate`: resolve a job as the trainer does, read every document, and say what a run would meet.

Each section is worked out here into validate_report.py's dataclasses and printed as soon as it is found, so
that a long count shows what came before it, and an error (a bad row, an eval set that cannot be built) comes
after the sections it did not stop.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from zephon_titan.cli.check_tokenizer import check_tokenizer
from zephon_titan.cli.validate_report import (
    FINGERPRINT,
    SOURCES,
    Counts,
    Draw,
    EvalSource,
    Exclusion,
    JobSummary,
    Missing,
    Phase,
    RunDraws,
    Schedule,
    SourceSummary,
    Special,
    Stage,
    ValidateReport,
    Validation,
    WorldSize,
    WorldSizes,
)
from zephon_titan.errors import ConfigError, ZephonError

if TYPE_CHECKING:
    from zephon_titan.job_view import LoaderJob

# Sources with this many files (and no index) get a hint to add one.
INDEX_HINT_FILES = 1000


def _show(lines: Iterable[str]) -> None:
    """A section's lines on standard output, as soon as it is found (progress.py: what comes next, on stderr)."""
    for line in lines:
        print(line)


def cmd_validate(args) -> int:
    from zephon_titan import progress
    from zephon_titan.engine import fingerprint
    from zephon_titan.engine.fingerprint import component_text
    from zephon_titan.engine.spec import weight_notes
    from zephon_titan.job_file import read_job_file
    from zephon_titan.job_record import resolved_job

    if args.plot and args.no_count:
        raise ZephonError("validate --plot draws the counted tokens of each source: drop --no-count")
    progress.doing(f"reading {args.config}")
    file = read_job_file(args.config)  # the first pass: the file, [model]'s keys, [dataloader], the eval set (no torch)
    # Resolves the job as the trainer does (unknown or mistyped TorchTitan keys, the recipe's model), or as it
    # did last time (job_record.py); then the tokenizer, the model's vocabulary, the batch layout, every file.
    job = resolved_job(args.config, file)
    report = ValidateReport(job=job_summary(job))
    _show(report.job.lines())
    job.tokenizer.select_backend(announce=False)  # may refuse tokenizer_backend = "fastokens": after the above
    report.backend = job.tokenizer.backend_reason
    _show(report.backend_lines())
    if args.check_tokenizer:
        return check_tokenizer(job.spec)
    print(FINGERPRINT)
    report.fingerprint = {name: component_text(value) for name, value in fingerprint(job.spec).items()}
    _show(report.fingerprint_lines())
    print(SOURCES)
    report.weight_notes = list(weight_notes(job.data))
    _show(report.notes_lines())
    for index in range(len(job.spec.sources)):
        report.sources.append(source_summary(job, index, count=not args.no_count))
        _show(report.sources[-1].lines())
    report.draws = run_draws(job, report.sources)
    if report.draws is not None:
        _show(report.draws.lines())
        if args.plot:
            write_draws_picture(report.draws, job.path, args.plot)
    report.schedule = schedule(job)
    if report.schedule is not None:
        _show(report.schedule.lines())
    report.exclusion = exclusion(job)
    if report.exclusion is not None:
        _show(report.exclusion.lines())
    report.validation = validation(job, count=not args.no_count)
    _show(report.validation.lines())
    _show(report.refusal_lines())
    report.world_sizes = world_sizes(job, args.world_sizes)
    _show(report.world_sizes.lines())
    return report.status


def job_summary(job: LoaderJob) -> JobSummary:
    """Checks the layout, the tokenizer against the model and the seq_len stages."""
    rows_per_lane = job.check_layout(1)
    key, path = job.tokenizer_setting
    tokenizer = job.tokenizer
    job.check_model_vocab()
    job.check_model_seq_len()
    job.check_seq_len_schedule()
    spec = job.spec  # opens every source's files
    specials = []
    for name, choice in (("bos", tokenizer.bos), ("eos", tokenizer.eos)):
        token = tokenizer.tokenizer.id_to_token(choice.token_id) if choice.token_id is not None else None
        specials.append(Special(name, token, choice.token_id, choice.reason))
    return JobSummary(
        path=str(job.path),
        lanes=spec.num_lanes,
        global_batch=job.global_batch_size,
        seq_len=spec.seq_len,
        rows_per_lane=rows_per_lane,
        tokenizer_key=key,
        tokenizer_path=os.path.abspath(path),
        vocab_size=tokenizer.vocab_size,
        model_vocab=job.model_vocab_size,
        specials=specials,
    )


def source_summary(job: LoaderJob, index: int, count: bool) -> SourceSummary:
    """A source's files, and with `count` its documents and tokens, read as a lane reads them."""
    spec = job.spec
    source, config = spec.sources[index], job.data.sources[index]
    return SourceSummary(
        name=source.name,
        weight=spec.weights[index],
        files=len(source.files),
        bytes=sum(f.size for f in source.files),
        blocks=source.num_blocks,
        eval_fraction=config.eval_fraction,
        counts=_count(job, index) if count else None,
        excluded_from=spec.exclusion.from_step if spec.exclusion is not None else None,
        index=config.index,
        index_hint=len(source.files) >= INDEX_HINT_FILES,
        pipeline=source.pipeline.describe() if source.pipeline is not None else "",
        transforms="; ".join(t.describe() for t in source.transforms),
        chat=source.chat.describe() if source.chat is not None else "",
        chat_origin=source.chat.template.origin if source.chat is not None else "",
        too_long=config.too_long,
    )


def _count(job: LoaderJob, index: int) -> Counts:
    """Reads every block: surfaces bad lines or rows and ids outside the vocabulary, with file and position."""
    import numpy as np

    from zephon_titan import progress
    from zephon_titan.engine.source_reader import check_token_ids
    from zephon_titan.engine.split import held_out
    from zephon_titan.engine.tokenize import DocumentProblem

    spec = job.spec
    source, config = spec.sources[index], job.data.sources[index]
    counts = Counts(documents=0, tokens=0, excluded=0, held_out=0)
    files = f"{len(source.files):,} file{'s' if len(source.files) > 1 else ''}"
    progress.doing(f"reading every document of {source.name} ({files})", source.num_blocks, "block")
    for block in range(source.num_blocks):
        before = counts.tokens
        documents = source.read_block(block)
        started = time.process_time()
        texts: list[str | np.ndarray] = list(documents.texts)  # bad lines/rows named (and the transforms run)
        dropped: list[bool] = []
        if source.transforms:
            counts.transform_seconds += time.process_time() - started
            texts, dropped = _transformed(source, documents, texts, counts)
        if source.specials_in_tokens or source.token_field:  # ids outside the vocabulary, as a lane names them
            for ids, row in zip(texts, documents.rows):
                check_token_ids(source, np.asarray(ids), documents.file, row, spec.tokenizer.vocab_size)
        if spec.exclusion is not None:
            counts.excluded += _excluded_in(spec.exclusion, index, documents)
        counts.documents += len(texts)
        try:
            encoded = (
                _conversations(job, source, texts, counts)
                if source.chat is not None
                else spec.tokenizer.encode(texts, source.specials_in_tokens)
            )
        except DocumentProblem as e:  # a document that gives no ids, named as a lane names it
            rows = [row for text, row in zip(texts, documents.rows) if isinstance(text, str)]
            raise e.at(documents.file, source.row_unit, rows[e.index], source.name) from None
        lengths = np.array([len(t) for t in encoded], dtype=np.int64)
        if dropped:
            lengths[np.asarray(dropped)] = 0
        counts.tokens += int(lengths.sum())
        if documents.keep is not None and documents.repeat is not None:  # the pipeline's decisions (pipeline.py)
            copies = np.where(documents.keep, documents.repeat, 0.0)
            counts.kept += int(documents.keep.sum())
            counts.copies += float(copies.sum())
            counts.tokens_after += float((copies * lengths).sum())
        held = held_out(spec.config.split_seed, documents.file, documents.rows, config.eval_fraction)
        counts.held_out += int(held.sum())
        counts.held_out_tokens += int(lengths[held].sum())
        progress.advance(1, counts.tokens - before)
    counts.pipeline_seconds = source.pipeline_seconds
    return counts


def _transformed(source, documents, texts: list, counts: Counts) -> tuple[list, list[bool]]:
    """The block's texts after the transforms, counted (dropped, characters before and after), and which the
    transforms dropped (an empty text here, no token)."""
    from zephon_titan.engine.pipeline import DROPPED

    assert documents.records is not None
    out = []
    for i, text in enumerate(texts):
        counts.chars_before += len(documents.records(i)[source.text_field] or "")
        if text is DROPPED:
            counts.transform_dropped += 1
            out.append("")
        else:
            counts.chars_after += len(text)
            out.append(text)
    return out, [t is DROPPED for t in texts]


def _conversations(job: LoaderJob, source, texts: list, counts: Counts) -> list:
    """A chat source's conversations encoded with their masks and counted (refused, too long, trained targets):
    the ids a lane trains of each (none for one it leaves out)."""
    import numpy as np

    from zephon_titan.engine import chat
    from zephon_titan.engine.tokenize import check_encodable

    tokenizer = job.spec.tokenizer
    out = []
    try:
        encoded = chat.encode(tokenizer.tokenizer, texts, tokenizer.bos_id, tokenizer.eos_id)
    except Exception:
        check_encodable(texts)  # the conversation that is no Unicode text, named by the caller
        raise
    for ids in encoded:
        if ids is chat.REFUSED:
            counts.chat_refused += 1
            ids = np.zeros(0, dtype=np.int32)
        elif len(ids) - 1 > job.spec.seq_len:
            counts.chat_too_long += 1
            ids = ids[: job.spec.seq_len + 1] if source.chat.too_long == "truncate" else np.zeros(0, dtype=np.int32)
        counts.chat_tokens += len(ids)
        counts.chat_targets += int(np.count_nonzero((ids[1:] & chat.MASKED) == 0))
        out.append(ids & ~chat.MASKED)
    return out


def _excluded_in(exclusion, index: int, documents) -> int:
    """How many of a block's documents the exclusion skips (by place, or by the SHA-256 of their text)."""
    return sum(
        exclusion.excludes(index, documents.file, row) or exclusion.lists_text(text)
        for text, row in zip(documents.texts, documents.rows)
    )


def run_draws(job: LoaderJob, sources: list[SourceSummary]) -> RunDraws | None:
    """What the run's [training] steps draw from each source, expected from the weights at each step, the rows
    and their length, against the source's training tokens per epoch (None: the documents were not counted)."""
    spec, steps = job.spec, job.training_steps
    drawn = dict.fromkeys(spec.source_names, 0.0)
    if job.data.phases:  # weights (and ramps, and row lengths) by step
        for step in range(1, steps + 1):
            tokens = job.global_batch_size * spec.era_of(step).seq_len
            for name, weight in spec.schedule.weights_by_name(step).items():
                drawn[name] += weight * tokens
    else:
        for name, weight in spec.schedule.weights_by_name(1).items():
            drawn[name] = weight * job.global_batch_size * spec.seq_len * steps
    draws = []
    for source in sources:
        if source.counts is None:
            return None
        c = source.counts
        per_epoch = c.tokens_after if c.copies or c.kept else float(c.tokens)  # keep/repeat: its expected copies
        per_epoch *= 1 - c.held_out_tokens / c.tokens if c.tokens else 1.0  # the eval set's part is not trained
        draws.append(Draw(source.name, drawn[source.name], per_epoch))
    return RunDraws(steps, job.data.exhaustion, draws)


def write_draws_picture(draws: RunDraws, job_path: str, path: str) -> None:
    """`validate --plot`: each source's epoch beside what the run draws from it (pictures.py)."""
    from zephon_titan.pictures import draws_svg

    names = [d.name for d in draws.draws]
    title = f"{os.path.basename(job_path)}: tokens per source, {draws.steps:,} steps"
    svg = draws_svg(names, [d.drawn for d in draws.draws], [d.per_epoch for d in draws.draws], title)
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(svg)
    except OSError as e:
        raise ZephonError(f"--plot {path}: cannot write the picture ({e.strerror})") from None
    print(f"  (drawn in {path})")


def schedule(job: LoaderJob) -> Schedule | None:
    """The phases, each with its steps and the tokens per source it is expected to read (weight x slots)."""
    if not job.data.phases:
        return None
    last = job.training_steps
    starts = [p.start_step for p in job.data.phases] + [last + 1]
    phases = []
    for phase, start, end in zip(job.data.phases, starts, starts[1:]):
        if start > last:
            phases.append(Phase(start, None))
            continue
        steps = range(start, min(end, last + 1))
        weights = job.spec.schedule.weights_by_name(steps[-1])  # after its ramp
        expected = {name: 0.0 for name in job.spec.source_names}
        for step in steps:
            for name, w in job.spec.schedule.weights_by_name(step).items():
                expected[name] += w * job.global_batch_size * job.spec.era_of(step).seq_len
        phases.append(Phase(start, steps[-1], dict(weights), phase.ramp_steps, expected))
    resting = [n for n in job.spec.source_names if all(p.weights.get(n, 0) <= 0 for p in job.data.phases)]
    eras = [e for e in job.spec.job_eras if e.start <= last]
    ends = [e.start - 1 for e in eras[1:]] + [last]
    return Schedule(last, phases, resting, [Stage(e.start, end, e.seq_len) for e, end in zip(eras, ends)])


def exclusion(job: LoaderJob) -> Exclusion | None:
    """How many documents of the `[dataloader] exclude` list the sources hold, and which they do not."""
    from zephon_titan.engine.exclusion import missing_entries, parse_list

    spec = job.spec.exclusion
    if spec is None:
        return None
    entries = parse_list(job.data.exclude)
    missing = missing_entries(entries, list(job.spec.sources))
    return Exclusion(
        path=job.data.exclude,
        from_step=spec.from_step,
        sha256=spec.digest,
        listed=len(entries),
        missing=[Missing(e.line, e.normalized(), why) for e, why in missing],
    )


def validation(job: LoaderJob, count: bool) -> Validation:
    """The eval set, built as the trainer's ZephonEvalLoader builds it; with `count`, its first step too."""
    from zephon_titan import progress
    from zephon_titan.engine import build_engine, rows_per_lane
    from zephon_titan.engine.eval_set import eval_steps
    from zephon_titan.engine.packing import packer_class

    if not job.eval_enabled:
        return Validation(enabled=False)
    progress.doing("building the eval set")
    job.check_eval_layout(1)
    data = job.eval_data
    from zephon_titan.job_file import eval_message
    from zephon_titan.titan.tokenizer import loader_tokenizer

    try:  # what the trainer's ZephonEvalLoader checks when it is built, named as [validator.dataloader]
        packer_class(data.packing)
        spec = build_engine(data, job.seq_len, loader_tokenizer(data, job.trainer_tokenizer))
    except ConfigError as e:
        raise ConfigError(f"{job.path}: {eval_message(e)}") from None
    if count:  # its first step: an eval set without a single row is refused, as the trainer refuses it
        next(eval_steps(spec, range(data.num_lanes), rows_per_lane(job.eval_global_batch_size, data.num_lanes), 1))
    size = "the whole eval set once" if job.eval_steps == -1 else f"{job.eval_steps} eval steps"
    sources = []
    for source in data.sources:
        part = f"held-out part (eval_fraction {source.eval_fraction:g}, split_seed {data.split_seed})"
        sources.append(EvalSource(source.name, part if data.split == "eval" else "all documents", list(source.paths)))
    return Validation(True, job.eval_freq, size, job.eval_global_batch_size, data.num_lanes, sources)


def world_sizes(job: LoaderJob, asked: list[int]) -> WorldSizes:
    """The data-parallel sizes that can run the job, and why each size asked for can or cannot."""
    from zephon_titan.engine import valid_world_sizes

    def misfit(w: int) -> str | None:
        """Why `w` data-parallel ranks cannot run the job (None: they can)."""
        try:
            job.check_layout(w)
            job.check_eval_layout(w)
        except ZephonError as e:
            return str(e).removeprefix(f"{job.path}: ")
        return None

    usable = [w for w in valid_world_sizes(job.global_batch_size) if misfit(w) is None]
    checked = []
    for w in asked:
        why = misfit(w)
        rows = job.global_batch_size // w
        checked.append(WorldSize(w, why, rows, rows // job.local_batch_size if why is None else None))
    return WorldSizes(
        global_batch=job.global_batch_size,
        local_batch=job.local_batch_size,
        lanes=job.spec.num_lanes,
        usable=usable,
        checked=checked,
    )
