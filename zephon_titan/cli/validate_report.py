"""What `validate` found, as plain dataclasses, and its text: each section's `lines()` are what it prints.

Kept apart from the computing (validate.py) so that the same findings can be written another way
(`dataclasses.asdict` gives their JSON form) without reading a job again. Imports nothing of the package.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

# `validate` names at most this many listed documents it could not find, then says how many more.
MISSING_SHOWN = 5


@dataclass
class Special:
    """A BOS or EOS choice: the token added (None: none is), and why."""

    name: str
    token: str | None
    token_id: int | None
    reason: str


@dataclass
class JobSummary:
    """The batch layout and the tokenizer, as the trainer resolves them."""

    path: str
    lanes: int
    global_batch: int
    seq_len: int
    rows_per_lane: int
    tokenizer_key: str
    tokenizer_path: str
    vocab_size: int
    model_vocab: int | None
    specials: list[Special]

    def lines(self) -> Iterator[str]:
        yield (
            f"config: {self.path}  ({self.lanes} lanes, global batch {self.global_batch} rows of "
            f"{self.seq_len} tokens, {counted(self.rows_per_lane, 'row')} per lane per step)"
        )
        yield (
            f"tokenizer: {self.tokenizer_key} = {self.tokenizer_path}  ({self.vocab_size:,} ids; model vocabulary "
            f"{self.model_vocab if self.model_vocab is not None else 'unknown'})"
        )
        for s in self.specials:
            yield (
                f"  add_{s.name} = {'true' if s.token else 'false'}"
                + (f" ({s.token!r}, id {s.token_id})" if s.token else "")
                + f": {s.reason}"
            )


def counted(n: int, word: str, plural: str = "s") -> str:
    """`n` and the word, plural unless n is 1 ("1 file", "2 files", "1,024 rows")."""
    return f"{n:,} {word}{'' if n == 1 else plural}"


@dataclass
class Counts:
    """What reading every document of a source found."""

    documents: int
    tokens: int
    excluded: int  # skipped by the `[dataloader] exclude` list
    held_out: int  # the eval set's part (eval_fraction)
    held_out_tokens: int = 0  # and its tokens
    kept: int = 0  # with keep or repeat: documents its keep condition holds for
    copies: float = 0.0  # and the copies a pass trains of them, expected (sum of the repeat values)
    tokens_after: float = 0.0  # and the tokens those copies hold, expected
    pipeline_seconds: float = 0.0  # evaluating keep and repeat (CPU of this process)
    transform_dropped: int = 0  # with transforms: documents one of them dropped
    chars_before: int = 0  # and the characters of the texts before them
    chars_after: int = 0  # and after them (of the documents kept)
    transform_seconds: float = 0.0  # running them (CPU of this process, reading the records included)
    chat_refused: int = 0  # chat sources: conversations whose mask cannot be exact
    chat_too_long: int = 0  # and those longer than a row
    chat_targets: int = 0  # and the trained targets of the others
    chat_tokens: int = 0  # and their tokens


@dataclass
class SourceSummary:
    """A source's files and blocks, and what counting its documents found."""

    name: str
    weight: float
    files: int
    bytes: int
    blocks: int
    eval_fraction: float
    counts: Counts | None  # None: --no-count
    excluded_from: int | None  # the exclusion's first step (None: no exclusion)
    index: str | None
    index_hint: bool  # so many files that an index would spare every rank listing them
    pipeline: str = ""  # its keep and repeat as the fingerprint says them ("" without)
    transforms: str = ""  # its transforms as the fingerprint says them ("" without)
    chat: str = ""  # a chat source's template and mask rule as the fingerprint says them ("" without)
    chat_origin: str = ""  # where its template was found
    too_long: str = ""  # what it does with a conversation longer than a row

    @property
    def all_excluded(self) -> bool:
        """The exclusion removes every document: the run would stop at the exclusion's step, with nothing to read."""
        return self.counts is not None and bool(self.counts.documents) and self.counts.excluded == self.counts.documents

    def lines(self) -> Iterator[str]:
        line = (
            f"  {self.name:<12} weight {self.weight:.3f}  {counted(self.files, 'file')}, {self.bytes:,} bytes, "
            f"{counted(self.blocks, 'block')}"
        )
        if (c := self.counts) is not None:
            line += f", {c.documents:,} documents, {c.tokens:,} tokens per epoch"
            if c.excluded:
                line += f" ({c.excluded:,} excluded from step {self.excluded_from})"
            if self.eval_fraction > 0:
                line += f" ({c.held_out:,} documents held out for validation, eval_fraction {self.eval_fraction:g})"
                if not c.held_out:
                    line += "; WARNING: none, so validation reports no loss for this source (raise eval_fraction)"
        yield line
        if self.pipeline:
            yield from self.pipeline_lines()
        if self.transforms:
            yield from self.transform_lines()
        if self.chat:
            yield from self.chat_lines()
        if self.index:
            yield f"  {'':<12} index {self.index}"
        elif self.index_hint:
            yield (
                f"  {'':<12} hint: every rank lists these {self.files:,} files at startup; set "
                f'index = "<path or URI>" in [dataloader.sources.{self.name}] to read one manifest instead'
            )

    def chat_lines(self) -> Iterator[str]:
        yield f"  {'':<12} chat: {self.chat} ({self.chat_origin})"
        c = self.counts
        if c is None or not c.documents:
            return
        kept = c.documents - c.chat_refused - c.chat_too_long
        verb = "truncated" if self.too_long == "truncate" else "dropped"
        line = (
            f"  {'':<12} {c.documents:,} conversations: {c.chat_refused:,} refused (their mask cannot be exact), "
            f"{c.chat_too_long:,} longer than a row ({verb}); the {kept:,} others train {c.chat_targets:,} of their "
            f"{c.chat_tokens:,} tokens ({c.chat_targets / max(c.chat_tokens, 1):.1%})"
        )
        if not kept and self.too_long != "truncate":
            line += "; WARNING: nothing is left, so the source gives no token"
        yield line

    def transform_lines(self) -> Iterator[str]:
        yield f"  {'':<12} transforms: {self.transforms}"
        c = self.counts
        if c is None or not c.documents:
            return
        kept = c.documents - c.transform_dropped
        line = (
            f"  {'':<12} they drop {c.transform_dropped:,} of {c.documents:,} documents ({c.transform_dropped / c.documents:.1%}); "
            f"the others' text {c.chars_after:,} characters ({c.chars_after / max(c.chars_before, 1):.1%} of the "
            f"{c.chars_before:,} the files hold), {1e6 * c.transform_seconds / c.documents:.1f} us per document"
        )
        if not kept:
            line += "; WARNING: nothing is left, so the source gives no token"
        yield line

    def pipeline_lines(self) -> Iterator[str]:
        yield f"  {'':<12} pipeline: {self.pipeline}"
        c = self.counts
        if c is None or not c.documents:
            return
        share = c.kept / c.documents
        line = (
            f"  {'':<12} keeps {c.kept:,} of {c.documents:,} documents ({share:.1%}), {c.copies / max(c.kept, 1):.2f} "
            f"copies each on average: ~{c.tokens_after:,.0f} tokens per pass ({c.tokens_after / max(c.tokens, 1):.1%} "
            f"of the source's), {1e6 * c.pipeline_seconds / c.documents:.1f} us per document to decide"
        )
        if not c.copies:
            line += "; WARNING: nothing, so the source gives no token (loosen keep or raise repeat)"
        yield line


@dataclass
class Phase:
    """A phase of the mixture schedule: its steps, weights after its ramp and expected tokens per source."""

    start: int
    last: int | None  # None: it starts after the last step and is never reached
    weights: dict[str, float] = field(default_factory=dict)
    ramp_steps: int = 0
    expected_tokens: dict[str, float] = field(default_factory=dict)


@dataclass
class Stage:
    """A seq_len stage: steps `start`-`end` train rows of `seq_len` tokens."""

    start: int
    end: int
    seq_len: int


@dataclass
class Schedule:
    """The mixture schedule over [training] steps, and the seq_len stages within them."""

    last_step: int
    phases: list[Phase]
    resting: list[str]  # sources with weight 0 in every phase
    stages: list[Stage]

    def lines(self) -> Iterator[str]:
        yield f"mixture schedule ({len(self.phases)} phases over [training] steps = {self.last_step}):"
        for p in self.phases:
            if p.last is None:
                yield f"  from step {p.start}: after the last step, never reached"
                continue
            ramp = f", ramped over {p.ramp_steps} steps" if p.ramp_steps else ""
            yield (
                f"  steps {p.start}-{p.last}: " + ", ".join(f"{n} {w:g}" for n, w in p.weights.items()) + ramp
                + "; expected tokens: " + ", ".join(f"{n} {int(v):,}" for n, v in p.expected_tokens.items() if v)
            )  # fmt: skip
        if self.resting:
            yield f"  resting in every phase (declared for a later phase): {', '.join(self.resting)}"
        if self.stages:
            yield (
                "seq_len stages ([[dataloader.phases]] seq_len; [training] seq_len is the longest): "
                + "; ".join(f"steps {s.start}-{s.end}: rows of {s.seq_len}" for s in self.stages)
            )


@dataclass
class Draw:
    """What the run's steps draw from a source, expected from the weights, against its tokens per epoch."""

    name: str
    drawn: float  # weight x rows x row length, step by step, summed over [training] steps
    per_epoch: float  # its training tokens in one epoch (held-out ones out; keep and repeat's expected copies in)

    @property
    def epochs(self) -> float:
        return self.drawn / self.per_epoch if self.per_epoch else float("inf")


@dataclass
class RunDraws:
    """Each source's draw over the run."""

    steps: int
    exhaustion: str
    draws: list[Draw]

    def lines(self) -> Iterator[str]:
        yield f"the run's draw ([training] steps = {self.steps:,}; expected from the weights, rows and row lengths):"
        for d in self.draws:
            note = ""
            if d.epochs > 1:
                note = (
                    "; read once (exhaustion = redistribute): it runs out before the last step and the others "
                    "take its share"
                    if self.exhaustion == "redistribute"
                    else "; each epoch in a new order"
                )
            yield f"  {d.name:<12} ~{d.drawn:,.0f} tokens: {d.epochs:.2f} epochs of its {d.per_epoch:,.0f}{note}"


@dataclass
class Missing:
    """A line of the exclusion list that names no document of the sources."""

    line: int
    entry: str
    why: str


@dataclass
class Exclusion:
    """The `[dataloader] exclude` list: how many of its documents the sources hold, and the lines that name none."""

    path: str
    from_step: int
    sha256: str
    listed: int
    missing: list[Missing]

    def lines(self) -> Iterator[str]:
        yield (
            f"exclude: {self.path}, from step {self.from_step} (list sha256 {self.sha256[:16]}): "
            f"{self.listed - len(self.missing)} of {self.listed} listed documents found in the sources"
        )
        if self.missing:
            shown = self.missing[:MISSING_SHOWN]
            named = [f"line {m.line} ({m.entry.replace(chr(9), ' ')}: {m.why})" for m in shown]
            more = f" and {len(self.missing) - MISSING_SHOWN} more" if len(self.missing) > MISSING_SHOWN else ""
            yield f"  not found: {'; '.join(named)}{more}"


@dataclass
class EvalSource:
    """A source of the eval set and the part of its documents the eval set reads."""

    name: str
    part: str  # all its documents, or the held-out part
    paths: list[str]


@dataclass
class Validation:
    """The eval set of `[validator]` (enabled False: off)."""

    enabled: bool
    freq: int = 0
    size: str = ""
    global_batch: int = 0
    lanes: int = 0
    sources: list[EvalSource] = field(default_factory=list)

    def lines(self) -> Iterator[str]:
        if not self.enabled:
            yield "validation: off ([validator] enable = true and eval_fraction on a source, or eval sources, turn it on)"
            return
        yield (
            f"validation: every {self.freq} steps, {self.size} of {self.global_batch} rows over "
            f"{self.lanes} lanes, the same rows on every data-parallel size (`zephon-titan plan CONFIG --validation` "
            "prints its SHA-256)"
        )
        for s in self.sources:
            yield f"  {s.name:<12} {s.part} of {', '.join(s.paths)}"


@dataclass
class WorldSize:
    """A data-parallel size asked for (--world-sizes): None as `why` when it can run the job."""

    size: int
    why: str | None
    rows: int
    microbatches: int | None  # None: not worked out for a size that cannot run the job


@dataclass
class WorldSizes:
    """The data-parallel sizes that can run the job, and each size asked for, checked."""

    global_batch: int
    local_batch: int
    lanes: int
    usable: list[int]
    checked: list[WorldSize]

    def lines(self) -> Iterator[str]:
        yield (
            f"valid data-parallel sizes (divide the {self.global_batch} rows per step, local_batch_size "
            f"{self.local_batch} divides the rows per rank; more ranks than the {self.lanes} lanes is fine): "
            f"{self.usable}"
        )
        for w in self.checked:
            detail = (
                f"{counted(w.rows, 'row')} per rank per step, {counted(w.microbatches or 0, 'microbatch', 'es')}"
                if w.why is None
                else w.why
            )
            yield f"  {w.size:>5} {'rank' if w.size == 1 else 'ranks'}: {'ok' if w.why is None else 'INVALID'} ({detail})"


# Headings printed before what they head is worked out: an error in it (a packing the fingerprint refuses)
# comes after its heading.
FINGERPRINT = "fingerprint:"
SOURCES = "sources:"


@dataclass
class ValidateReport:
    """Every section `validate` prints, in its order; filled as each is found."""

    job: JobSummary
    backend: str = ""  # the tokenizer backend a run would use, and why
    fingerprint: dict[str, str] = field(default_factory=dict)
    weight_notes: list[str] = field(default_factory=list)
    sources: list[SourceSummary] = field(default_factory=list)
    draws: RunDraws | None = None
    schedule: Schedule | None = None
    exclusion: Exclusion | None = None
    validation: Validation | None = None
    world_sizes: WorldSizes | None = None

    @property
    def all_excluded(self) -> list[str]:
        return [s.name for s in self.sources if s.all_excluded]

    def backend_lines(self) -> Iterator[str]:
        yield f"  backend: {self.backend}"

    def fingerprint_lines(self) -> Iterator[str]:
        """Under the heading FINGERPRINT, printed before the fingerprint is worked out."""
        for name, text in self.fingerprint.items():
            yield f"  {name:<22} {text}"

    def notes_lines(self) -> Iterator[str]:
        """Under the heading SOURCES, what the weights mean (each source's line follows)."""
        for note in self.weight_notes:
            yield f"  {note}"

    def refusal_lines(self) -> Iterator[str]:
        """The run reads on past the sources the exclusion empties and stops: said now, not at that step."""
        if names := self.all_excluded:
            from_step = next(s.excluded_from for s in self.sources if s.all_excluded)
            yield (
                f"ERROR: [dataloader] exclude removes every document of {', '.join(names)} from step "
                f"{from_step}: the run would stop there with no document to read; shorten the list "
                "or give the source weight 0 from that step"
            )

    @property
    def status(self) -> int:
        """1 when a data-parallel size asked for cannot run the job, or a source is all excluded."""
        bad = self.world_sizes is not None and any(w.why is not None for w in self.world_sizes.checked)
        return 1 if bad or self.all_excluded else 0
