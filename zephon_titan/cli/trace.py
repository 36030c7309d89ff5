"""`inspect` traces a step's rows back to the files and documents they hold; `where` traces a document
forward to every step and row that trains it.

Both read the job as plan does (plan.open_job: the file, TorchTitan only for what the file leaves to the
recipe), so what they need is imported when they run.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from zephon_titan.errors import ZephonError

if TYPE_CHECKING:
    from zephon_titan.engine import LaneState
    from zephon_titan.job_view import LoaderJob

_PIECE_KEYS = ("source", "file", "doc_tokens", "row_tokens", "text", "trained_targets")


def _pieces(job: LoaderJob, row) -> list[dict]:
    from zephon_titan.engine.rows import IGNORE_INDEX, RowShape

    out, at = [], 0
    if RowShape.of(job.spec).within_document:
        tokens = row.inputs.tolist()  # a piece's slots are its inputs (each label is the next token)
    else:  # the row's tokens: the inputs, plus the last label when it is a real token (not padding)
        tokens = row.inputs.tolist() + ([int(row.labels[-1])] if row.padding == 0 else [])
    masked = RowShape.of(job.spec).masked
    for piece in row.pieces:
        ids = tokens[at : at + piece.length]
        entry = {
            "source": job.spec.source_names[piece.source],
            "file": piece.file,
            job.spec.sources[piece.source].row_unit.replace(" ", "_"): piece.row,
            "doc_tokens": [piece.doc_offset, piece.doc_offset + piece.length],
            "row_tokens": [at, at + piece.length],
            "text": job.spec.tokenizer.decode(ids),
        }
        if masked:  # chat sources: which targets are trained, marked in the text
            labels = row.labels[at : at + piece.length].tolist()
            entry["trained_targets"] = sum(label != IGNORE_INDEX for label in labels)
            entry["text"] = _marked(job, ids, labels)
        out.append(entry)
        at += piece.length
    return out


def _marked(job: LoaderJob, ids: list[int], labels: list[int]) -> str:
    """A piece's text with its trained targets between ⟦ and ⟧ (each label is the next token: the piece's first
    token is no target, and its last label is the token after it)."""
    from zephon_titan.engine.rows import IGNORE_INDEX

    targets = [
        (label if label != IGNORE_INDEX else (ids[k + 1] if k + 1 < len(ids) else None))
        for k, label in enumerate(labels)
    ]
    flags = [False] + [label != IGNORE_INDEX for label in labels]
    runs: list[tuple[bool, list[int]]] = []
    for token, trained in zip([ids[0], *targets] if ids else [], flags):
        if token is None:
            continue
        if runs and runs[-1][0] == trained:
            runs[-1][1].append(token)
        else:
            runs.append((trained, [token]))
    decode = job.spec.tokenizer.decode
    return "".join(f"⟦{decode(run)}⟧" if trained else decode(run) for trained, run in runs)


def cmd_inspect(args) -> int:
    from zephon_titan import progress

    progress.doing(f"reading {args.config}")  # and importing what inspect needs
    from zephon_titan.plan import open_job

    job = open_job(args.config)
    lanes = [args.lane] if args.lane is not None else list(range(job.spec.num_lanes))
    for lane in lanes:
        if not 0 <= lane < job.spec.num_lanes:
            raise ZephonError(f"--lane must be in [0, {job.spec.num_lanes}), got {lane}")
    if args.step < 1:
        raise ZephonError(f"--step counts from 1, got {args.step}")
    report, spec = _step_rows(job, lanes, args.step, args.from_checkpoint)
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
        _print_row(item, args.full)
    return 0


def _step_rows(job: LoaderJob, lanes: list[int], target: int, checkpoint: str | None):
    """Simulate `lanes` up to step `target` and describe its rows (with the spec the step was made under)."""
    from zephon_titan import progress
    from zephon_titan.engine import open_lane_group
    from zephon_titan.engine.lanes import group_steps
    from zephon_titan.plan import read_checkpoint

    r = job.check_layout(1)
    spec, saved = job.spec, 0
    states: dict[int, LaneState] = {}
    if checkpoint:  # the run continues as its checkpoint did (another seq_len, G, schedule), as plan does
        saved, states, spec = read_checkpoint(checkpoint, job)
        if target <= saved:
            raise ZephonError(
                f"--step {target} is at or before the checkpoint's step {saved}; inspect it without "
                "--from-checkpoint, with the job file that trained it"
            )
    owned = {lane: states[lane] for lane in lanes if lane in states}
    report: list[dict[str, Any]] = []
    group = open_lane_group(spec, lanes, r, 0, 2, owned, False, saved)
    progress.doing(f"simulating {len(lanes)} lane{'s' if len(lanes) > 1 else ''} to step {target}", target - saved)
    with group:
        for step, rows in group_steps(group, saved, target):
            progress.advance(1)
            if step < target:
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
    return report, spec


def _print_row(item: dict[str, Any], full: bool) -> None:
    print(
        f"step {item['step']} lane {item['lane']} row {item['lane_row']} (row {item['batch_row']} of the global "
        f"batch), {item['padding']} padding tokens"
    )
    for p in item["pieces"]:
        # The place's key is the source's row unit (row, byte offset, document, token offset).
        where = next(f"{k.replace('_', ' ')} {v}" for k, v in p.items() if k not in _PIECE_KEYS)
        start, end = p["row_tokens"]
        inputs = min(end, item["seq_len"]) - start  # under labels = "stream" the row's last token is a label only
        text = p["text"] if full else (p["text"][:160] + ("..." if len(p["text"]) > 160 else ""))
        trained = f", {p['trained_targets']} trained targets (in ⟦ ⟧)" if "trained_targets" in p else ""
        print(
            f"  tokens {start:>5}-{end:<5} positions 0-{inputs - 1:<5} {p['source']}: {p['file']} "
            f"{where}, document tokens {p['doc_tokens'][0]}-{p['doc_tokens'][1]}{trained}"
        )
        print(f"      {text!r}")


def cmd_where(args) -> int:
    """Every step and row where a document's pieces are trained; 1 when none is in the steps searched."""
    from zephon_titan import progress

    progress.doing(f"reading {args.config}")  # and importing what where needs
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
