"""`plan` writes the ledger a run will write (and, with --mixture, each source's share of it); `verify`
compares two ledgers step by step.

`verify` reads two JSON files and nothing else: it imports neither torch nor TorchTitan (the architecture
test holds it to that), so what `plan` needs is imported when it runs: the job file first (job_file.py, no
torch), TorchTitan only when the file leaves a loader value to the recipe (plan.open_job).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING

from zephon_titan.errors import DataError, ZephonError

if TYPE_CHECKING:
    from zephon_titan.engine.ledger import LedgerEntry
    from zephon_titan.job_view import LoaderJob


def cmd_plan(args) -> int:
    from zephon_titan import progress

    progress.doing(f"reading {args.config}")  # and importing what plan needs
    from zephon_titan.plan import open_job, plan_eval_set, plan_ledger

    if args.json and not args.validation:
        raise ZephonError("plan --json goes with --validation (the ledger is JSON lines already)")
    job = open_job(args.config)
    if args.validation:
        eval_set = plan_eval_set(job)
        print(json.dumps(eval_set, sort_keys=True) if args.json else eval_set_text(job, eval_set))
        if args.steps is None:
            return 0
    if args.steps is None:
        raise ZephonError("plan needs --steps N (the last step to plan), or --validation")
    entries: Iterable[LedgerEntry] = plan_ledger(job, args.steps, args.from_checkpoint, args.procs)
    if args.mixture or args.plot:
        planned = list(entries)
        if args.mixture:
            _with_mixture_report(job, planned, not args.output, args.from_checkpoint)
        if args.plot:
            _plot(job, planned, args.plot, sys.stderr if not args.output else sys.stdout)
        entries = planned
    if not args.output:
        for entry in entries:
            print(entry.to_json())
        return 0
    _write_ledger(entries, args.output)
    print(f"wrote {args.output}")
    return 0


def eval_set_text(job: LoaderJob, eval_set: dict) -> str:
    """`plan --validation`'s report: what every validation of a run of the job logs (validation.jsonl)."""
    targets = eval_set["tokens"]
    total = sum(targets.values()) or 1
    width = max(len(name) for name in targets)
    lines = [
        f"eval set of {job.path} ([validator.dataloader]), as every validation of a run of it logs it:",
        f"  SHA-256  {eval_set['sha256']}",
        f"  steps    {eval_set['steps']:,}, {eval_set['rows'] // max(eval_set['steps'], 1):,} rows each",
        f"  rows     {eval_set['rows']:,} of {eval_set['seq_len']:,} tokens (seq_len)",
        "  targets per source (trained label tokens; padding not counted):",
        *(f"    {name:<{width}}  {n:>12,}  {n / total:6.1%}" for name, n in targets.items()),
    ]
    return "\n".join(lines)


def _plot(job: LoaderJob, entries: list[LedgerEntry], path: str, out) -> None:
    """`plan --plot`: the shares of every planned step and cumulative, against the targets (pictures.py)."""
    from zephon_titan.pictures import shares_svg
    from zephon_titan.plan import mixture_report

    if not entries:
        raise ZephonError("--plot: no planned step to draw (the checkpoint is at or after --steps)")
    raw = [s.weight for s in job.data.sources]
    fixed = [w / sum(raw) for w in raw] if sum(raw) > 0 else raw
    report = mixture_report(entries, fixed, _by_targets(job))
    targets = [
        [(e.weights or {}).get(n, 0.0) / (sum((e.weights or {}).values()) or 1) for n in report.names]
        if e.weights is not None
        else fixed
        for e in entries
    ]
    name = os.path.splitext(os.path.basename(str(job.path)))[0]
    title = f"{name}: token share per source, steps {report.steps[0]:,}-{report.steps[-1]:,}"
    text = shares_svg(report.names, report.steps, report.shares, report.cumulative, targets, title)
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise ZephonError(f"--plot {path}: cannot write the picture ({e.strerror})") from None
    print(f"wrote {path}", file=out)


def _write_ledger(entries: Iterable[LedgerEntry], output: str) -> None:
    """Written beside the target and renamed at the end: a plan that fails leaves no file behind. A target that is
    no regular file (/dev/null, /dev/stdout, a FIFO) is written as it is: the rename would put a file in its place."""
    if os.path.isdir(output):
        raise ZephonError(f"-o {output} is a folder; name a file in it (-o {os.path.join(output, 'planned.jsonl')})")
    folder = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(folder):
        raise ZephonError(f"-o {output}: the folder {folder} does not exist; create it or name a file elsewhere")
    special = os.path.exists(output) and not os.path.isfile(output)
    partial = output if special else f"{output}.partial"
    try:
        with open(partial, "w", encoding="utf-8") as out:
            for entry in entries:
                out.write(entry.to_json() + "\n")
        if not special:
            os.replace(partial, output)
    except OSError as e:  # no room, no permission: the sources name their own read errors (DataError)
        raise ZephonError(f"-o {output}: cannot write the ledger ({e.strerror})") from None
    finally:
        if not special and os.path.exists(partial):
            os.remove(partial)


def _with_mixture_report(
    job: LoaderJob, entries: list[LedgerEntry], to_stderr: bool, checkpoint: str | None = None
) -> list[LedgerEntry]:
    """Print each source's planned share per step against its weight (normalized, and said so)."""
    from zephon_titan.plan import mixture_report, packing_note, read_checkpoint

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
        print(mixture_report(entries, weights, _by_targets(job)).format(), file=out)
    return entries


def _by_targets(job: LoaderJob) -> list[str]:
    """The sources whose share is of trained targets (mix_by = "targets": the chat sources)."""
    return [s.name for s in job.data.sources if s.chat] if job.data.mix_by == "targets" else []


def _phase_reports(job: LoaderJob, entries: list[LedgerEntry], out) -> None:
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
        print(mixture_report(steady, weights, _by_targets(job)).format(), file=out)


def _read(path: str) -> dict[int, LedgerEntry]:
    from zephon_titan.engine.ledger import read_ledger

    try:
        return {e.step: e for e in read_ledger(path)}
    except FileNotFoundError:
        raise ZephonError(f"ledger {path} does not exist") from None
    except (ValueError, TypeError) as e:
        raise ZephonError(f"{path} is not a zephon_titan ledger ({e})") from None


# The fields `verify` names when two entries of a step differ.
_COMPARED = (
    "sha256",
    "rows",
    "tokens",
    "padding",
    "weights",
    "seq_len",
    "excluded",
    "pipeline",
    "documents",
    "targets",
)


def _comparable(a: LedgerEntry, b: LedgerEntry) -> tuple[LedgerEntry, LedgerEntry]:
    """The entries as compared: a ledger written before releases counted documents has no `documents`; the other's
    are then not compared (everything else still is). `membership` (torchft: who trained the step) is never
    compared: the same rows trained by 2 groups or 3 are the same step."""
    a, b = dataclasses.replace(a, membership=None), dataclasses.replace(b, membership=None)
    if (a.documents is None) != (b.documents is None):
        return dataclasses.replace(a, documents=None), dataclasses.replace(b, documents=None)
    return a, b


def _value(value: object) -> str:
    """A ledger field as verify prints it: absent fields say so (a ledger of another job or release)."""
    return "(not recorded)" if value is None else str(value)


def _read_union(paths: list[str]) -> tuple[dict[int, LedgerEntry], str]:
    """The ledger of one path, or of several (a torchft run's replica groups: each holds the steps it committed) their
    union, each step once (loader/ft_steps.union_ledger refuses two groups that recorded a step differently); and
    what to call it."""
    if len(paths) == 1:
        return _read(paths[0]), paths[0]
    from zephon_titan.engine.ledger import union_ledger

    ledgers = [_read(path) for path in paths]
    try:
        union = union_ledger(ledger.values() for ledger in ledgers)
    except DataError as e:
        raise ZephonError(f"{e}, among {', '.join(paths)}") from None
    return {e.step: e for e in union}, f"the union of {len(paths)} ledgers ({paths[0]}, ...)"


def cmd_verify(args) -> int:
    """Every step of either ledger must be in both, with every field equal (--prefix: B may stop early). Several B:
    their union (a torchft run's replica-group ledgers)."""
    b_paths = args.b if isinstance(args.b, list) else [args.b]
    a, (b, args.b) = _read(args.a), _read_union(b_paths)
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
        x, y = _comparable(a[step], b[step])
        if x != y:
            fields = [f for f in _COMPARED if getattr(x, f) != getattr(y, f)]
            same = " (the batches are byte-identical: the same SHA-256; only what is recorded differs)"
            print(f"first difference at step {step} ({', '.join(fields)}){same if x.sha256 == y.sha256 else ''}:")
            for path, entry in ((args.a, x), (args.b, y)):
                shown = [f"{f} {_value(getattr(entry, f))}" for f in fields if f not in ("sha256", "rows", "tokens")]
                print(
                    f"  {path}: sha256 {entry.sha256}  rows {entry.rows}  tokens {entry.tokens}"
                    + "".join(f"  {text}" for text in shown)
                )
            return 1
    steps = sorted(b) if args.prefix else sorted(a)
    extra = f" ({args.a} goes on to step {max(a)})" if args.prefix and max(a) > max(b) else ""
    print(
        f"identical: all {len(steps)} steps ({steps[0]}-{steps[-1]}) have the same global batch SHA-256, rows "
        f"and tokens{extra}"
    )
    return 0


def _span(entries: dict) -> str:
    """The steps a ledger holds, gaps shown (a torchft group's ledger lacks the steps it healed past): 1-9,11-14."""
    if not entries:
        return "none"
    runs: list[list[int]] = []
    for step in sorted(entries):
        if runs and step == runs[-1][1] + 1:
            runs[-1][1] = step
        else:
            runs.append([step, step])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in runs)
