"""Where did a document go: every step, row and token range where its pieces are trained.

`zephon-titan where JOB --source S (--file F --row N | --match TEXT)` runs the simulation `plan` runs (the
job read as plan reads it, plan.open_job; every lane stepped in one process, from a checkpoint's lane states if
given) and looks only at the rows' provenance: each packed row carries its pieces' (source, file, row,
offset, length), so finding a document costs a plan of the same steps and nothing more. Rows are named
as `inspect` names them: the row of the step's global batch (rank-independent), its lane and row in the
lane, and the piece's tokens in the row and in the document.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from zephon_titan import progress
from zephon_titan.engine import LaneState, Row, open_lane_group
from zephon_titan.engine.exclusion import files_named
from zephon_titan.engine.lanes import group_steps
from zephon_titan.engine.pipeline import DROPPED
from zephon_titan.engine.sources.base import Source, file_blocks
from zephon_titan.engine.spec import EngineSpec
from zephon_titan.errors import ZephonError
from zephon_titan.job_view import LoaderJob

# Without --steps, `where` simulates the job's [training] steps; above this many tokens (about 20 minutes at
# a million tokens a second) it asks for --steps instead.
MAX_DEFAULT_TOKENS = 1 << 30

Document = tuple[str, int]
"""(file, row): a document of one source, its row in the source's row unit (Parquet row, JSONL byte offset)."""


@dataclass(frozen=True)
class Placement:
    """One piece of a document in one row of one step."""

    document: Document
    step: int
    batch_row: int
    """The row of the step's global batch (the same on every number of ranks)."""
    lane: int
    lane_row: int
    """The row of the lane's stream, counted from the run's first row."""
    row_tokens: tuple[int, int]
    """[start, end) of the piece's tokens in the row (as `inspect` prints them)."""
    doc_tokens: tuple[int, int]
    """[start, end) of the piece's tokens in the document."""


@dataclass
class WhereReport:
    source: str
    row_unit: str
    first: int
    last: int
    """The steps searched."""
    documents: list[Document]
    """The documents looked for (one for --file/--row; those whose text matched for --match)."""
    placements: list[Placement]
    ended: int | None = None
    """The last step the data could fill, when a finite run ends before `last`."""
    held_out: set[Document] = field(default_factory=set)
    """The documents held out for validation (eval_fraction): never trained."""
    excluded_from: dict[Document, int] = field(default_factory=dict)
    """The documents on the `[dataloader] exclude` list, with the first step that skips them."""
    decided: dict[Document, str] = field(default_factory=dict)
    """With keep or repeat: what the source's pipeline decides for each document, in words."""

    def reached(self) -> list[Document]:
        seen = {p.document for p in self.placements}
        return [d for d in self.documents if d in seen]

    def by_document(self) -> dict[Document, list[Placement]]:
        """Each document looked for, with its placements in step order."""
        out: dict[Document, list[Placement]] = {d: [] for d in self.documents}
        for p in self.placements:
            out[p.document].append(p)
        return out

    def to_json(self) -> dict:
        key = self.row_unit.replace(" ", "_")
        placed = self.by_document()
        return {
            "source": self.source,
            "steps": [self.first, self.last],
            "ended_at_step": self.ended,
            "documents": [
                {
                    "file": file,
                    key: row,
                    "held_out": (file, row) in self.held_out,
                    "excluded_from_step": self.excluded_from.get((file, row)),
                    "pipeline": self.decided.get((file, row)),
                    "placements": [
                        {
                            "step": p.step,
                            "batch_row": p.batch_row,
                            "lane": p.lane,
                            "lane_row": p.lane_row,
                            "row_tokens": list(p.row_tokens),
                            "doc_tokens": list(p.doc_tokens),
                        }
                        for p in placed[(file, row)]
                    ],
                }
                for file, row in self.documents
            ],
        }

    def lines(self) -> list[str]:
        out = []
        for document, mine in self.by_document().items():
            name = f"{self.source}: {document[0]} {self.row_unit} {document[1]}"
            if document in self.decided:
                out.append(f"{name}: {self.decided[document]}")
            if not mine:
                why = " (held out for validation: eval_fraction)" if document in self.held_out else ""
                out.append(f"{name}: in no step of {self.first}-{self.last}{why}")
                continue
            steps = sorted({p.step for p in mine})
            out.append(f"{name}: {_count(len(mine), 'piece')} in {_count(len(steps), 'step')} ({steps[0]}-{steps[-1]})")
            out += [
                f"  step {p.step:>6} row {p.batch_row:>5} of the global batch (lane {p.lane} row {p.lane_row}): "
                f"row tokens {p.row_tokens[0]}-{p.row_tokens[1]}, document tokens {p.doc_tokens[0]}-{p.doc_tokens[1]}"
                for p in mine
            ]
        for document, k in self.excluded_from.items():
            later = [p.step for p in self.placements if p.document == document and p.step >= k]
            out.append(
                f"{self.source}: {document[0]} {self.row_unit} {document[1]}: excluded from step {k} ([dataloader] "
                + (
                    "exclude): in no step from it"
                    if not later
                    else f"exclude), yet in step {later[0]}: a bug, report it)"
                )
            )
        if self.ended is not None:
            out.append(f'(the data ends after step {self.ended}: a finite run, exhaustion = "redistribute")')
        return out


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def source_index(job: LoaderJob, name: str) -> int:
    names = job.spec.source_names
    if name not in names:
        raise ZephonError(f"--source {name!r} is not a source of {job.path}; its sources: {', '.join(names)}")
    return names.index(name)


def resolve_file(source: Source, file: str) -> str:
    """The source's name for `file`: its path as listed, the same path spelled otherwise, or a unique ending."""
    paths = [f.path for f in source.files]
    found = files_named(paths, file)
    if len(found) == 1:
        return found[0]
    if not found:
        raise ZephonError(f"--file {file} is not a file of source {source.name} ({len(paths)} files)")
    raise ZephonError(f"--file {file} names {len(found)} files of source {source.name}; give more of its path")


def check_row(source: Source, path: str, row: int) -> Document:
    """(path, row) if the file has a document at `row`; a one-line error otherwise."""
    if any(row in block.rows for block in file_blocks(source, path)):
        return path, row
    raise ZephonError(f"{path} has no document at {source.row_unit} {row} (source {source.name})")


def matching_documents(source: Source, text: str) -> list[Document]:
    """Every document of the source whose text contains `text` (each file read once; nothing tokenized)."""
    found = []
    progress.doing(f"searching {source.name} for the text", len(source.files), "file")
    for f in source.files:
        progress.advance(1)
        for block in file_blocks(source, f.path):
            for row, document in zip(block.rows, block.texts):
                if document is DROPPED:
                    continue  # a transform drops it: never trained, and its text is not the files'
                if not isinstance(document, str):
                    raise ZephonError(
                        f"source {source.name} is pre-tokenized: --match needs text; use --file and --row"
                    )
                if text in document:
                    found.append((f.path, row))
    return found


def held_out_documents(job: LoaderJob, source: int, documents: list[Document]) -> set[Document]:
    """Those of `documents` that the source's eval_fraction holds out for validation (never trained)."""
    from zephon_titan.engine.split import held_out

    fraction, seed = job.data.sources[source].eval_fraction, job.spec.config.split_seed
    return {(file, row) for file, row in documents if held_out(seed, file, [row], fraction)[0]}


def excluded_documents(spec: EngineSpec, source: int, documents: list[Document]) -> dict[Document, int]:
    """Those of `documents` on the exclusion list (by place, or by the SHA-256 of their text), with its first step."""
    exclusion = spec.exclusion
    if exclusion is None:
        return {}
    listed = {d for d in documents if exclusion.excludes(source, *d)}
    if exclusion.texts:
        wanted = set(documents) - listed
        for path in sorted({file for file, _ in wanted}):
            for block in file_blocks(spec.sources[source], path):
                for row, text in zip(block.rows, block.texts):
                    if (path, row) in wanted and exclusion.lists_text(text):
                        listed.add((path, row))
    return {d: exclusion.from_step for d in documents if d in listed}


def pipeline_decisions(spec: EngineSpec, source: int, documents: list[Document]) -> dict[Document, str]:
    """What the source's keep and repeat decide for each of `documents`, in words (engine/pipeline.py)."""
    src = spec.sources[source]
    pipeline = src.pipeline
    if pipeline is None and not src.transforms:
        return {}
    out, wanted = {}, set(documents)
    for path in sorted({file for file, _ in documents}):
        for block in file_blocks(src, path):
            for i, row in enumerate(block.rows):
                if (path, row) not in wanted:
                    continue
                if src.transforms and block.texts[i] is DROPPED:
                    out[(path, row)] = f"dropped by its transforms ({', '.join(t.reference for t in src.transforms)})"
                    continue
                if pipeline is None:
                    continue
                assert block.keep is not None and block.repeat is not None
                if not block.keep[i]:
                    out[(path, row)] = (
                        f"left out by its keep ({pipeline.keep.text if pipeline.keep else ''}): never trained"
                    )
                    continue
                x = float(block.repeat[i])
                first = int(
                    pipeline.counts(block.keep[i : i + 1], block.repeat[i : i + 1], spec.seed, path, [row], 0)[0]
                )
                whole = int(x)
                copies = f"{whole}" if x == whole else f"{whole} or {whole + 1}"
                out[(path, row)] = f"kept, repeat {x:.4g}: {copies} copies per pass ({first} in the first)"
    return out


def find_documents(source: Source, file: str | None, row: int | None, match: str | None) -> list[Document]:
    """The documents to look for: those containing `match`, else the one at `file` and `row`."""
    if match is None:
        assert file is not None and row is not None
        return [check_row(source, resolve_file(source, file), row)]
    documents = matching_documents(source, match)
    if not documents:
        raise ZephonError(f"no document of source {source.name} contains {match!r}")
    return documents


def step_range(job: LoaderJob, steps: tuple[int, int] | None, start: int) -> tuple[int, int]:
    """The steps to search: --steps, or the steps after `start` (a checkpoint's) up to [training] steps."""
    if steps is not None:
        first, last = steps
        if first < 1 or last < first:
            raise ZephonError(f"--steps must be FIRST-LAST with 1 <= FIRST <= LAST, got {first}-{last}")
        if first <= start:
            raise ZephonError(f"--steps {first}-{last} starts at or before the checkpoint's step {start}")
        return first, last
    last = job.training_steps
    tokens = (last - start) * job.global_batch_size * job.seq_len
    if last <= start:
        raise ZephonError(f"[training] steps = {last} leaves no step after {start}; give --steps FIRST-LAST")
    if tokens > MAX_DEFAULT_TOKENS:
        raise ZephonError(
            f"[training] steps = {last} is {tokens:,} tokens to simulate; give --steps FIRST-LAST (e.g. --steps 1-1000)"
        )
    return start + 1, last


def step_placements(
    step: int, lanes: list[list[Row]], source: int, wanted: set[Document], lane_rows: list[int]
) -> Iterator[Placement]:
    """Every piece of a wanted document in one step's rows (`lane_rows`: each lane's rows before the step)."""
    for lane, rows in enumerate(lanes):
        for i, row in enumerate(rows):
            at = 0  # the piece's first token in the row, as inspect counts it
            for piece in row.pieces:
                document = (piece.file, piece.row)
                if piece.source == source and document in wanted:
                    yield Placement(
                        document,
                        step,
                        lane * len(rows) + i,
                        lane,
                        lane_rows[lane] + i,
                        (at, at + piece.length),
                        (piece.doc_offset, piece.doc_offset + piece.length),
                    )
                at += piece.length


def where(
    job_path: str,
    source_name: str,
    file: str | None = None,
    row: int | None = None,
    match: str | None = None,
    steps: tuple[int, int] | None = None,
    checkpoint: str | None = None,
) -> WhereReport:
    """Find a document (file and row) or every document containing `match`, in the planned steps."""
    from zephon_titan.plan import open_job, read_checkpoint

    job = open_job(job_path, needs_steps=steps is None)
    rows_per_lane = job.check_layout(1)
    job.check_model_vocab()
    s = source_index(job, source_name)
    source = job.spec.sources[s]
    spec, start, states = job.spec, 0, dict[int, LaneState]()
    if checkpoint:  # the run continues as its checkpoint did, as plan does
        start, states, spec = read_checkpoint(checkpoint, job)
    first, last = step_range(job, steps, start)
    documents = find_documents(source, file, row, match)
    lanes = range(spec.num_lanes)
    lane_rows = [states[lane].rows if lane in states else 0 for lane in lanes]
    report = WhereReport(source_name, source.row_unit, first, last, documents, [])
    report.held_out = held_out_documents(job, s, documents)
    report.excluded_from = excluded_documents(spec, s, documents)
    report.decided = pipeline_decisions(spec, s, documents)
    wanted = set(documents)
    group = open_lane_group(
        spec, lanes, rows_per_lane, job.data.num_workers, job.data.prefetch_factor, states, False, start
    )
    done = start
    progress.doing(f"simulating {spec.num_lanes} lanes to step {last}", last - start)
    with group:
        for done, rows in group_steps(group, start, last):
            if done >= first:
                report.placements += step_placements(done, rows, s, wanted, lane_rows)
            lane_rows = [n + len(lane) for n, lane in zip(lane_rows, rows)]
            progress.advance(1, sum(len(row.inputs) for lane in rows for row in lane))
    if done < last:
        report.ended = done
    return report
