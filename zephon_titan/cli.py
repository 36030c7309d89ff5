"""zephon-titan: look inside a data stream and prove two runs saw the same data, without GPUs.

zephon-titan plan CONFIG.toml --steps N [--from-checkpoint DIR] [-o ledger.jsonl] [--procs N]
zephon-titan plan CONFIG.toml --validation
zephon-titan verify A.jsonl B.jsonl
zephon-titan inspect CONFIG.toml --step S [--lane L] [--json]
zephon-titan where CONFIG.toml --source S (--file F --row N | --match TEXT) [--steps A-B] [--json]
zephon-titan validate CONFIG.toml [--world-sizes 8,16,32]
zephon-titan index CONFIG.toml [--check]
zephon-titan init DATA... --tokenizer DIR [--gpus 8,16] [-o job.toml]
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shlex
import sys
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from zephon_titan import launch
from zephon_titan.errors import EXIT_USER_ERROR, ConfigError, ZephonError

# Each command imports what it needs when it runs: `verify` and `--help` must not pay for torch and
# TorchTitan (seconds and ~1 GB), which only the commands that resolve a job's tokenizer or model need.
if TYPE_CHECKING:
    from zephon_titan.engine import LaneState
    from zephon_titan.engine.ledger import LedgerEntry
    from zephon_titan.titan.job import Job


def cmd_plan(args) -> int:
    from zephon_titan.plan import plan_eval_set, plan_ledger
    from zephon_titan.progress import tqdm

    if args.validation:
        print(json.dumps(plan_eval_set(args.config), sort_keys=True))
        if args.steps is None:
            return 0
    if args.steps is None:
        raise ZephonError("plan needs --steps N (the last step to plan), or --validation")
    entries: Iterable[LedgerEntry] = plan_ledger(args.config, args.steps, args.from_checkpoint, args.procs)
    if args.mixture:
        entries = _with_mixture_report(args.config, list(entries), not args.output, args.from_checkpoint)
    if not args.output:
        for entry in entries:
            print(entry.to_json())
        return 0
    # Written beside the target and renamed at the end: a plan that fails leaves no file behind.
    partial = f"{args.output}.partial"
    try:
        with open(partial, "w", encoding="utf-8") as out, tqdm(desc="planning", unit="step", total=args.steps) as bar:
            for entry in entries:
                out.write(entry.to_json() + "\n")
                bar.update(entry.step - bar.n)  # from a checkpoint, the bar starts at its step
        os.replace(partial, args.output)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    print(f"wrote {args.output}")
    return 0


def _with_mixture_report(
    config: str, entries: list[LedgerEntry], to_stderr: bool, checkpoint: str | None = None
) -> list[LedgerEntry]:
    """Print each source's planned share per step against its weight (normalized, and said so)."""
    from zephon_titan.plan import mixture_report, packing_note, read_checkpoint
    from zephon_titan.titan.job import load_job

    job = load_job(config)
    data = job.data
    out = sys.stderr if to_stderr else sys.stdout  # the ledger keeps standard output when it goes there
    if note := packing_note(read_checkpoint(checkpoint, job)[2] if checkpoint else job.spec):  # as the run mixes
        print(note, file=out)
    if data.phases:
        _phase_reports(job, entries, out)
        return entries
    raw = [s.weight for s in data.sources]
    weights = [w / sum(raw) for w in raw]
    if abs(sum(raw) - 1) > 1e-9:
        given = ", ".join(f"{s.name} {s.weight:g}" for s in data.sources)
        print(f"weights {given} sum to {sum(raw):g}; normalized: " + ", ".join(f"{w:.4f}" for w in weights), file=out)
    if entries:
        print(mixture_report(entries, weights).format(), file=out)
    return entries


def _phase_reports(job: Job, entries: list[LedgerEntry], out) -> None:
    """Under a schedule: one report per phase, over its steps after its ramp, against its weights."""
    from zephon_titan.plan import mixture_report

    phases = job.data.phases
    ends = [p.start_step for p in phases[1:]] + [1 << 62]
    for i, (phase, end) in enumerate(zip(phases, ends)):
        steady = [e for e in entries if phase.start_step + phase.ramp_steps <= e.step < end]
        if not steady:
            continue
        weights = list(job.spec.schedule.segment(steady[0].step).weights)
        ramp = f" (its {phase.ramp_steps} ramp steps left out)" if phase.ramp_steps else ""
        print(f"phase {i + 1}, from step {phase.start_step}{ramp}:", file=out)
        print(mixture_report(steady, weights).format(), file=out)


def _read(path: str) -> dict[int, LedgerEntry]:
    from zephon_titan.engine.ledger import read_ledger

    try:
        return {e.step: e for e in read_ledger(path)}
    except FileNotFoundError:
        raise ZephonError(f"ledger {path} does not exist") from None
    except (ValueError, TypeError) as e:
        raise ZephonError(f"{path} is not a zephon_titan ledger ({e})") from None


def cmd_verify(args) -> int:
    """Every step of either ledger must be in both, with every field equal (--prefix: B may stop early)."""
    a, b = _read(args.a), _read(args.b)
    if args.steps:
        a, b = ({s: e for s, e in x.items() if args.steps[0] <= s <= args.steps[1]} for x in (a, b))
    if not a or not b:
        print(f"nothing to compare: {args.a} has steps {_span(a)}, {args.b} has {_span(b)}")
        return 1
    for step in sorted(set(a) | set(b)):
        if step not in b and args.prefix and step > max(b):
            continue  # B is a run still in progress
        if step not in a or step not in b:
            have, lack = (args.a, args.b) if step in a else (args.b, args.a)
            print(
                f"first difference at step {step}: {have} has it, {lack} does not "
                f"({args.a}: steps {_span(a)}, {args.b}: steps {_span(b)})"
            )
            return 1
        if a[step] != b[step]:
            fields = [
                f
                for f in ("sha256", "rows", "tokens", "padding", "weights", "seq_len", "excluded")
                if getattr(a[step], f) != getattr(b[step], f)
            ]
            print(f"first difference at step {step} ({', '.join(fields)}):")
            for path, entry in ((args.a, a[step]), (args.b, b[step])):
                print(
                    f"  {path}: sha256 {entry.sha256}  rows {entry.rows}  tokens {entry.tokens}  padding {entry.padding}"
                )
            return 1
    steps = sorted(b) if args.prefix else sorted(a)
    extra = f" ({args.a} goes on to step {max(a)})" if args.prefix and max(a) > max(b) else ""
    print(
        f"identical: all {len(steps)} steps ({steps[0]}-{steps[-1]}) have the same global batch SHA-256, rows "
        f"and tokens{extra}"
    )
    return 0


def _step_range(text: str) -> tuple[int, int]:
    first, _, last = text.partition("-")
    try:
        return int(first), int(last or first)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected FIRST-LAST (e.g. 5-8), got {text!r}") from None


def _span(entries: dict) -> str:
    return f"{min(entries)}-{max(entries)}" if entries else "none"


_PIECE_KEYS = ("source", "file", "doc_tokens", "row_tokens", "text")


def _pieces(job: Job, row) -> list[dict]:
    from zephon_titan.engine.packing import RowShape

    out, at = [], 0
    if RowShape.of(job.spec).within_document:
        tokens = row.inputs.tolist()  # a piece's slots are its inputs (each label is the next token)
    else:  # the row's tokens: the inputs, plus the last label when it is a real token (not padding)
        tokens = row.inputs.tolist() + ([int(row.labels[-1])] if row.padding == 0 else [])
    for piece in row.pieces:
        ids = tokens[at : at + piece.length]
        out.append(
            {
                "source": job.spec.source_names[piece.source],
                "file": piece.file,
                job.spec.sources[piece.source].row_unit.replace(" ", "_"): piece.row,
                "doc_tokens": [piece.doc_offset, piece.doc_offset + piece.length],
                "row_tokens": [at, at + piece.length],
                "text": job.spec.tokenizer.decode(ids),
            }
        )
        at += piece.length
    return out


def cmd_inspect(args) -> int:
    from zephon_titan.engine import open_lane_group
    from zephon_titan.engine.lanes import group_steps
    from zephon_titan.plan import read_checkpoint
    from zephon_titan.progress import tqdm
    from zephon_titan.titan.job import load_job

    job = load_job(args.config)
    lanes = [args.lane] if args.lane is not None else list(range(job.spec.num_lanes))
    for lane in lanes:
        if not 0 <= lane < job.spec.num_lanes:
            raise ZephonError(f"--lane must be in [0, {job.spec.num_lanes}), got {lane}")
    if args.step < 1:
        raise ZephonError(f"--step counts from 1, got {args.step}")
    r = job.check_layout(1)
    spec, saved = job.spec, 0
    states: dict[int, LaneState] = {}
    if args.from_checkpoint:  # the run continues as its checkpoint did (another seq_len, G, schedule), as plan does
        saved, states, spec = read_checkpoint(args.from_checkpoint, job)
        if args.step <= saved:
            raise ZephonError(
                f"--step {args.step} is at or before the checkpoint's step {saved}; inspect it without "
                "--from-checkpoint, with the job file that trained it"
            )
    owned = {lane: states[lane] for lane in lanes if lane in states}
    report: list[dict[str, Any]] = []
    group = open_lane_group(spec, lanes, r, 0, 2, owned, False, saved)
    with group, tqdm(desc="simulating", unit="step", total=args.step - saved, disable=args.json) as bar:
        for step, rows in group_steps(group, saved, args.step):
            bar.update(1)
            if step < args.step:
                continue
            for lane, lane_rows in zip(lanes, rows):
                first = (owned[lane].rows if lane in owned else 0) + (step - saved - 1) * r
                for i, row in enumerate(lane_rows):
                    report.append(
                        {
                            "step": step,
                            "lane": lane,
                            "lane_row": first + i,
                            "batch_row": lane * r + i,
                            "seq_len": len(row.inputs),
                            "padding": row.padding,
                            "pieces": _pieces(job, row),
                        }
                    )
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        print()
        return 0
    if not report:
        raise ZephonError(f"--step {args.step} is after the end of this finite run: its lanes cannot fill it")
    print(f"step {args.step}: rows of {report[0]['seq_len']} tokens")
    if spec.schedule.scheduled:
        weights = spec.schedule.weights_by_name(args.step)
        print(
            f"step {args.step} mixes "
            + ", ".join(f"{n} {w:g}" for n, w in weights.items())
            + " (the schedule's weights)"
        )
    for item in report:
        print(
            f"step {item['step']} lane {item['lane']} row {item['lane_row']} (row {item['batch_row']} of the global "
            f"batch), {item['padding']} padding tokens"
        )
        for p in item["pieces"]:
            # The place's key is the source's row unit (row, byte offset, document, token offset).
            where = next(f"{k.replace('_', ' ')} {v}" for k, v in p.items() if k not in _PIECE_KEYS)
            start, end = p["row_tokens"]
            inputs = min(end, item["seq_len"]) - start  # under labels = "stream" the row's last token is a label only
            text = p["text"] if args.full else (p["text"][:160] + ("..." if len(p["text"]) > 160 else ""))
            print(
                f"  tokens {start:>5}-{end:<5} positions 0-{inputs - 1:<5} {p['source']}: {p['file']} "
                f"{where}, document tokens {p['doc_tokens'][0]}-{p['doc_tokens'][1]}"
            )
            print(f"      {text!r}")
    return 0


def cmd_where(args) -> int:
    """Every step and row where a document's pieces are trained; 1 when none is in the steps searched."""
    from zephon_titan.where import where

    if (args.match is None) == (args.file is None) or (args.file is None) != (args.row is None):
        raise ZephonError("where needs --file F --row N, or --match TEXT")
    report = where(args.config, args.source, args.file, args.row, args.match, args.steps, args.from_checkpoint)
    reached = report.reached()
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
        return 0 if reached else 1
    span = f"steps {report.first}-{report.last}"
    if args.match is not None:
        n = len(report.documents)
        found = "1 document contains" if n == 1 else f"{n} documents contain"
        print(f"source {args.source}: {found} {args.match!r}; {len(reached)} in {span}")
        if not reached:
            return 1
        report.documents = reached  # the others are in no step searched: said above
    print("\n".join(report.lines()))
    return 0 if reached else 1


# Sources with this many files (and no index) get a hint to add one.
INDEX_HINT_FILES = 1000


def _print_schedule(job: Job) -> None:
    """The phases, each with its steps and the tokens per source it is expected to read (weight x slots)."""
    if not job.data.phases:
        return
    last = job.config.training.steps
    starts = [p.start_step for p in job.data.phases] + [last + 1]
    print(f"mixture schedule ({len(job.data.phases)} phases over [training] steps = {last}):")
    for phase, start, end in zip(job.data.phases, starts, starts[1:]):
        if start > last:
            print(f"  from step {start}: after the last step, never reached")
            continue
        steps = range(start, min(end, last + 1))
        weights = job.spec.schedule.weights_by_name(steps[-1])  # after its ramp
        expected = {name: 0.0 for name in job.spec.source_names}
        for step in steps:
            for name, w in job.spec.schedule.weights_by_name(step).items():
                expected[name] += w * job.global_batch_size * job.spec.era_of(step).seq_len
        ramp = f", ramped over {phase.ramp_steps} steps" if phase.ramp_steps else ""
        print(
            f"  steps {start}-{steps[-1]}: " + ", ".join(f"{n} {w:g}" for n, w in weights.items()) + ramp
            + "; expected tokens: " + ", ".join(f"{n} {int(v):,}" for n, v in expected.items() if v)
        )  # fmt: skip
    resting = [n for n in job.spec.source_names if all(p.weights.get(n, 0) <= 0 for p in job.data.phases)]
    if resting:
        print(f"  resting in every phase (declared for a later phase): {', '.join(resting)}")
    eras = [e for e in job.spec.seq_len_schedule if e.start <= last]
    if eras:
        ends = [e.start - 1 for e in eras[1:]] + [last]
        print(
            "seq_len stages ([[dataloader.phases]] seq_len; [training] seq_len is the longest): "
            + "; ".join(f"steps {e.start}-{end}: rows of {e.seq_len}" for e, end in zip(eras, ends))
        )


def _print_validation(job: Job, count: bool) -> None:
    from zephon_titan.engine import build_engine, rows_per_lane
    from zephon_titan.engine.eval_set import eval_steps
    from zephon_titan.engine.packing import packer_class

    validator = job.config.validator
    if not validator.enable:
        print("validation: off ([validator] enable = true and eval_fraction on a source, or eval sources, turn it on)")
        return
    job.check_eval_layout(1)
    eval_loader = validator.dataloader
    data = eval_loader.data
    from zephon_titan.titan.tokenizer import loader_tokenizer
    from zephon_titan.titan.validator import eval_message

    try:  # what the trainer's ZephonEvalLoader checks when it is built, named as [validator.dataloader]
        packer_class(data.packing)
        spec = build_engine(data, job.seq_len, loader_tokenizer(data, job.trainer_tokenizer))
    except ConfigError as e:
        raise ConfigError(f"{job.path}: {eval_message(e)}") from None
    if count:  # its first step: an eval set without a single row is refused, as the trainer refuses it
        next(eval_steps(spec, range(data.num_lanes), rows_per_lane(eval_loader.global_batch_size, data.num_lanes), 1))
    size = "the whole eval set once" if validator.steps == -1 else f"{validator.steps} eval steps"
    print(
        f"validation: every {validator.freq} steps, {size} of {eval_loader.global_batch_size} rows over "
        f"{data.num_lanes} lanes, the same rows on every data-parallel size (`zephon-titan plan CONFIG --validation` "
        "prints its SHA-256)"
    )
    for source in data.sources:
        part = f"held-out part (eval_fraction {source.eval_fraction:g}, split_seed {data.split_seed})"
        print(f"  {source.name:<12} {part if data.split == 'eval' else 'all documents'} of {', '.join(source.paths)}")


def cmd_validate(args) -> int:
    import numpy as np

    from zephon_titan.engine import fingerprint, valid_world_sizes
    from zephon_titan.engine.feed import check_token_ids
    from zephon_titan.engine.fingerprint import component_text
    from zephon_titan.engine.spec import weight_notes
    from zephon_titan.engine.split import held_out
    from zephon_titan.progress import tqdm
    from zephon_titan.titan.job import load_job

    # Resolves the job as the trainer does: unknown or mistyped TorchTitan keys, the tokenizer
    # (hf_assets_path), the model's vocabulary, the batch layout; then opens every file.
    job = load_job(args.config)
    rows_per_lane = job.check_layout(1)
    key, path = job.tokenizer_setting
    tokenizer = job.tokenizer
    job.check_model_vocab()
    job.check_model_seq_len()
    job.check_seq_len_schedule()
    spec = job.spec
    print(
        f"config: {job.path}  ({spec.num_lanes} lanes, global batch {job.global_batch_size} rows of "
        f"{spec.seq_len} tokens, {rows_per_lane} rows per lane per step)"
    )
    print(
        f"tokenizer: {key} = {os.path.abspath(path)}  ({tokenizer.vocab_size:,} ids; model vocabulary "
        f"{job.model_vocab_size if job.model_vocab_size is not None else 'unknown'})"
    )
    for name, choice in (("bos", tokenizer.bos), ("eos", tokenizer.eos)):
        token = tokenizer.tokenizer.id_to_token(choice.token_id) if choice.token_id is not None else None
        print(
            f"  add_{name} = {'true' if token else 'false'}"
            + (f" ({token!r}, id {choice.token_id})" if token else "")
            + f": {choice.reason}"
        )
    tokenizer.select_backend(announce=False)
    print(f"  backend: {tokenizer.backend_reason}")
    if args.check_tokenizer:
        return _check_tokenizer(spec)
    print("fingerprint:")
    for name, value in fingerprint(spec).items():
        print(f"  {name:<22} {component_text(value)}")
    print("sources:")
    for note in weight_notes(job.data):
        print(f"  {note}")
    all_excluded = []
    for index, (source, weight, config) in enumerate(zip(spec.sources, spec.weights, job.data.sources)):
        size = sum(f.size for f in source.files)
        line = f"  {source.name:<12} weight {weight:.3f}  {len(source.files)} files, {size:,} bytes, {source.num_blocks} blocks"
        if not args.no_count:
            docs = tokens = 0
            held = excluded = 0
            for block in tqdm(range(source.num_blocks), desc=f"reading {source.name}", unit="block", leave=False):
                documents = source.read_block(block)
                texts = documents.texts  # surfaces bad lines/rows with file and position
                if source.specials_in_tokens or source.token_field:  # ids outside the vocabulary, as a lane names them
                    for ids, row in zip(texts, documents.rows):
                        check_token_ids(source, np.asarray(ids), documents.file, row, spec.tokenizer.vocab_size)
                if spec.exclusion is not None:
                    excluded += _excluded_in(spec.exclusion, index, documents)
                docs += len(texts)
                tokens += sum(len(t) for t in spec.tokenizer.encode(texts, source.specials_in_tokens))
                held += int(
                    held_out(spec.config.split_seed, documents.file, documents.rows, config.eval_fraction).sum()
                )
            line += f", {docs:,} documents, {tokens:,} tokens per epoch"
            if excluded:
                line += f" ({excluded:,} excluded from step {spec.exclusion.from_step})"  # type: ignore[union-attr]
            if docs and excluded == docs:
                all_excluded.append(source.name)
            if config.eval_fraction > 0:
                line += f" ({held:,} documents held out for validation, eval_fraction {config.eval_fraction:g})"
                if not held:
                    line += "; WARNING: none, so validation reports no loss for this source (raise eval_fraction)"
        print(line)
        if config.index:
            print(f"  {'':<12} index {config.index}")
        elif len(source.files) >= INDEX_HINT_FILES:
            print(
                f"  {'':<12} hint: every rank lists these {len(source.files):,} files at startup; set "
                f'index = "<path or URI>" in [dataloader.sources.{source.name}] to read one manifest instead'
            )
    _print_schedule(job)
    _print_exclusion(job)
    _print_validation(job, count=not args.no_count)
    if all_excluded:  # the run reads on past them and stops: say so now, not at that step
        print(
            f"ERROR: [dataloader] exclude removes every document of {', '.join(all_excluded)} from step "
            f"{spec.exclusion.from_step}: the run would stop there with no document to read; shorten the list "  # type: ignore[union-attr]
            "or give the source weight 0 from that step"
        )

    def misfit(w: int) -> str | None:
        """Why `w` data-parallel ranks cannot run the job (None: they can)."""
        try:
            job.check_layout(w)
            job.check_eval_layout(w)
        except ZephonError as e:
            return str(e).removeprefix(f"{job.path}: ")
        return None

    usable = [w for w in valid_world_sizes(job.global_batch_size) if misfit(w) is None]
    print(
        f"valid data-parallel sizes (divide the {job.global_batch_size} rows per step, local_batch_size "
        f"{job.local_batch_size} divides the rows per rank; more ranks than the {spec.num_lanes} lanes is fine): "
        f"{usable}"
    )
    bad = 0
    for w in args.world_sizes:
        why = misfit(w)
        rows = job.global_batch_size // w
        detail = f"{rows} rows per rank per step, {rows // job.local_batch_size} microbatches" if why is None else why
        bad += why is not None
        print(f"  {w:>5} ranks: {'ok' if why is None else 'INVALID'} ({detail})")
    return 1 if bad or all_excluded else 0


def _excluded_in(exclusion, index: int, documents) -> int:
    """How many of a block's documents the exclusion skips (by place, or by the SHA-256 of their text)."""
    return sum(
        exclusion.excludes(index, documents.file, row) or exclusion.lists_text(text)
        for text, row in zip(documents.texts, documents.rows)
    )


# `validate` names at most this many listed documents it could not find, then says how many more.
MISSING_SHOWN = 5


def _print_exclusion(job: Job) -> None:
    """How many documents of the `[dataloader] exclude` list the sources hold, and which they do not."""
    from zephon_titan.engine.exclusion import missing_entries, parse_list

    exclusion = job.spec.exclusion
    if exclusion is None:
        return
    entries = parse_list(job.data.exclude)
    missing = missing_entries(entries, list(job.spec.sources))
    print(
        f"exclude: {job.data.exclude}, from step {exclusion.from_step} (list sha256 {exclusion.digest[:16]}): "
        f"{len(entries) - len(missing)} of {len(entries)} listed documents found in the sources"
    )
    if missing:
        named = [f"line {e.line} ({e.normalized().replace(chr(9), ' ')}: {why})" for e, why in missing[:MISSING_SHOWN]]
        more = f" and {len(missing) - MISSING_SHOWN} more" if len(missing) > MISSING_SHOWN else ""
        print(f"  not found: {'; '.join(named)}{more}")


def _check_tokenizer(spec, fast_json: str | None = None) -> int:
    """fastokens against tokenizers, document by document over every source; 1 at the first difference.
    `fast_json` (tests) loads fastokens from another tokenizer.json."""
    from zephon_titan.engine.tokenizer_backends import FastBackend, ReferenceBackend, fast_eligibility, first_difference
    from zephon_titan.progress import tqdm

    reference = ReferenceBackend(spec.tokenizer.tokenizer)
    try:
        fast = FastBackend(fast_json if fast_json is not None else spec.tokenizer.tokenizer.to_str())
    except ImportError:
        raise ZephonError("--check-tokenizer needs fastokens: pip install 'zephon-titan[fast]'") from None
    except Exception as e:
        print(f"fastokens cannot load this tokenizer: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
        return 1
    why_not = fast_eligibility(spec.tokenizer.tokenizer.to_str())
    print(
        "  fastokens is verified for this tokenizer's configuration"
        if why_not is None
        else f"  fastokens is not verified for this tokenizer ({why_not}): the run uses tokenizers whatever this finds"
    )
    documents = 0
    for source in spec.sources:
        for block in tqdm(range(source.num_blocks), desc=f"comparing {source.name}", unit="block"):
            docs = source.read_block(block)
            texts = [t for t in docs.texts if isinstance(t, str)]  # pre-tokenized rows need no tokenizer
            rows = [r for t, r in zip(docs.texts, docs.rows) if isinstance(t, str)]
            try:
                bad = first_difference(reference, fast, texts)
            except Exception as e:  # it cannot encode some document: name the first
                print(f"fastokens fails on {docs.file} {source.row_unit} {rows[_first_failing(fast, texts)]}: {e}")
                return 1
            if bad is not None:
                print(
                    f"first difference: {docs.file} {source.row_unit} {rows[bad]} (source {source.name}): "
                    f"{texts[bad][:80]!r}"
                )
                return 1
            documents += len(texts)
    print(f"fastokens and tokenizers give the same ids for all {documents:,} documents")
    return 0


def _first_failing(fast, texts: list[str]) -> int:
    for i, text in enumerate(texts):
        try:
            fast.encode_flat([text])
        except Exception:
            return i
    return 0


def cmd_index(args) -> int:
    from zephon_titan.engine.sources import open_source
    from zephon_titan.engine.sources.index import read_index, write_index
    from zephon_titan.engine.sources.storage import StorageOptions
    from zephon_titan.titan.job import load_job

    config = load_job(args.config).data
    sources = [s for s in config.sources if s.index]
    if not sources:
        raise ZephonError(
            f'no source of {args.config} has an index; add index = "<path or URI>" to a '
            "[dataloader.sources.<name>] table"
        )
    options, stale = StorageOptions.of(config), 0
    for source in sources:
        start = time.perf_counter()
        listed = open_source(source, max_document_chars=config.max_document_chars, options=options, use_index=False)
        seconds = time.perf_counter() - start
        summary = f"{len(listed.files):,} files, {listed.num_blocks:,} blocks (listed in {seconds:.2f} s)"
        if not args.check:
            write_index(source, listed, options)
            print(f"{source.name}: wrote {source.index}: {summary}")
            continue
        indexed = read_index(source, options)
        problems = _index_differences(indexed[1] if indexed else None, listed.files)
        stale += bool(problems)
        print(
            f"{source.name}: {source.index}: "
            + ("up to date, " + summary if not problems else "STALE: " + "; ".join(problems))
        )
    return 1 if stale else 0


def _index_differences(indexed, listed) -> list[str]:
    if indexed is None:
        return ["missing (write it with `zephon-titan index CONFIG`)"]
    old, new = {f.path: f for f in indexed}, {f.path: f for f in listed}
    problems = [f"{p} is gone" for p in sorted(set(old) - set(new))]
    problems += [f"{p} is new" for p in sorted(set(new) - set(old))]
    problems += [
        f"{p} changed ({old[p].size:,} -> {new[p].size:,} bytes, {old[p].num_blocks} -> {new[p].num_blocks} blocks)"
        for p in sorted(set(old) & set(new))
        if old[p] != new[p]
    ]
    if problems:
        problems.append(
            "rebuild it with `zephon-titan index CONFIG` (a run resumed on the rebuilt index sees "
            "the changed files; finish or restart runs that use the old one)"
        )
    return problems


def cmd_init(args) -> int:
    from zephon_titan.init_job import run

    return run(args, shlex.join(["zephon-titan", *args.argv]))


JOB_HELP = "the job TOML (relative paths inside it start from the current directory)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="zephon-titan", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="write the ledger a run of CONFIG will write")
    plan.add_argument("config", help=JOB_HELP)
    plan.add_argument("--steps", type=_positive, help="last step to plan")
    plan.add_argument(
        "--validation",
        action="store_true",
        help="print the eval set's SHA-256, steps, rows and targets per source, as every validation of the run logs them",
    )
    plan.add_argument("--from-checkpoint", help="a DCP step-N folder: plan from its step on")
    plan.add_argument("-o", "--output", help="ledger file (default: standard output)")
    plan.add_argument(
        "--procs",
        type=int,
        default=1,
        help="simulate the lanes in this many processes, each a range of them (the same ledger; "
        "default 1: all lanes in this process)",
    )
    plan.add_argument(
        "--mixture",
        action="store_true",
        help="also print each source's share of every planned step (mean, min, max) and cumulative, "
        "against its normalized weight",
    )
    plan.set_defaults(run=cmd_plan)
    verify = sub.add_parser("verify", help="compare two ledgers; exit 1 at the first differing step")
    verify.add_argument("a", help="a ledger (e.g. the plan, or a finished run)")
    verify.add_argument("b", help="another ledger")
    verify.add_argument(
        "--prefix",
        action="store_true",
        help="B may end before A (a run still in progress); every step B has must match",
    )
    verify.add_argument(
        "--steps",
        type=_step_range,
        metavar="FIRST-LAST",
        help="compare only these steps (e.g. 5-8: a plan from a step-4 checkpoint)",
    )
    verify.set_defaults(run=cmd_verify)
    inspect = sub.add_parser("inspect", help="decode the rows of a step and trace them to files")
    inspect.add_argument("config", help=JOB_HELP)
    inspect.add_argument("--step", type=int, required=True, help="the optimizer step to show (from 1)")
    inspect.add_argument("--lane", type=int, help="only this lane (default: every lane of the step)")
    inspect.add_argument("--json", action="store_true", help="machine-readable, full text")
    inspect.add_argument("--full", action="store_true", help="do not shorten texts")
    inspect.add_argument(
        "--from-checkpoint", help="a DCP step-N folder: the step as the run continues from it (e.g. another seq_len)"
    )
    inspect.set_defaults(run=cmd_inspect)
    _add_where(sub)
    validate = sub.add_parser("validate", help="check a config and its data, list valid data-parallel sizes")
    validate.add_argument("config", help=JOB_HELP)
    validate.add_argument(
        "--world-sizes",
        type=_int_list,
        default=[],
        metavar="W1,W2,...",
        help="data-parallel sizes to check the batch layout for; exit 1 if one is invalid",
    )
    validate.add_argument("--no-count", action="store_true", help="skip reading every document")
    validate.add_argument(
        "--check-tokenizer",
        action="store_true",
        help="compare the fast tokenizer backend (fastokens) with tokenizers on every document; exit 1 at the "
        "first document whose ids differ, naming its file and row",
    )
    validate.set_defaults(run=cmd_validate)
    launch.add_parser(sub)
    index = sub.add_parser("index", help="list the files of every source with an `index` and write the index")
    index.add_argument("config", help=JOB_HELP)
    index.add_argument("--check", action="store_true", help="compare the indexes with the files; exit 1 if stale")
    index.set_defaults(run=cmd_index)
    _add_init(sub)
    return p


def _add_where(sub) -> None:
    where = sub.add_parser("where", help="every step and row where a document's pieces are (or will be) trained")
    where.add_argument("config", help=JOB_HELP)
    where.add_argument("--source", required=True, help="the source's name ([dataloader.sources.NAME])")
    where.add_argument("--file", help="the document's file (its path as the source lists it, or its end)")
    where.add_argument("--row", type=int, help="the document's row in the file: Parquet row number, JSONL byte offset")
    where.add_argument(
        "--match", metavar="TEXT", help="instead of --file/--row: every document whose text contains TEXT"
    )
    where.add_argument(
        "--steps",
        type=_step_range,
        metavar="FIRST-LAST",
        help="the steps to search (default: 1, or the checkpoint's step + 1, to [training] steps)",
    )
    where.add_argument("--from-checkpoint", help="a DCP step-N folder: search the steps after it, as the run continues")
    where.add_argument("--json", action="store_true", help="machine-readable")
    where.set_defaults(run=cmd_where)


def _add_init(sub) -> None:
    init = sub.add_parser("init", help="write a starter job from your data files and tokenizer (then validate it)")
    init.add_argument(
        "data",
        nargs="+",
        metavar="[NAME=]PATH",
        help="a source each: a directory (its Parquet/JSONL files), a file or a quoted glob; NAME= names it",
    )
    init.add_argument("--tokenizer", required=True, help="the directory holding tokenizer.json (hf_assets_path)")
    init.add_argument("-o", "--output", default="my_job.toml", help="the job file to write (default my_job.toml)")
    init.add_argument("--force", action="store_true", help="replace the output file if it exists")
    init.add_argument(
        "--gpus",
        type=_int_list,
        default=[1, 2, 4, 8],
        metavar="N1,N2,...",
        help="the data-parallel sizes (GPU counts, with FSDP) the job must run on (default 1,2,4,8)",
    )
    init.add_argument(
        "--recipe",
        default="llama3:llama3_debugmodel",
        metavar="MODULE:CONFIG",
        help="TorchTitan's --module and --config (default llama3:llama3_debugmodel, a small model to start with)",
    )
    init.add_argument("--flavor", help="the model size within the recipe's model (e.g. 1B)")
    init.add_argument("--seq-len", type=_positive, default=2048, help="tokens per row (default 2048)")
    init.add_argument("--local-batch-size", type=_positive, help="rows per microbatch (default: 8 rows of 2048 tokens)")
    init.add_argument("--global-batch-size", type=_positive, help="rows per step (default: the least that fits --gpus)")
    init.add_argument("--steps", type=_positive, help="training steps (default: about one pass over the data)")
    init.add_argument("--weights", metavar="NAME=W,...", help="each source's weight (default: its share of the tokens)")
    init.add_argument("--seed", type=int, default=1234, help="[dataloader] seed (default 1234)")
    init.set_defaults(run=cmd_init)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return int(text)


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas (e.g. 8,16), got {text!r}") from None


# Exit status when the reader of standard output went away (`zephon-titan verify A B | head -1`): what a
# shell reports for a command ended by SIGPIPE (128 + 13), as `yes | head -1` does.
EXIT_BROKEN_PIPE = 141


def _stdout_closed() -> bool:
    """Is standard output a pipe whose reader has gone (poll reports an error on its write end)?"""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no poll (not Linux), no file descriptor (a test's capture)
        return False


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv  # the command as typed (init writes it into the job)
    try:
        status = args.run(args)
        sys.stdout.flush()  # a closed pipe is found here, not in the interpreter's exit
        return status
    except BrokenPipeError:
        if not _stdout_closed():
            raise  # another pipe (a loader worker's): not the reader going away
        # Nothing more can be said on standard output, and a traceback helps no one. Point it at /dev/null
        # so that the interpreter's own final flush does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE
    except ZephonError as e:
        print(f"zephon-titan: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
