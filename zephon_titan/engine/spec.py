"""EngineSpec: the immutable description every lane stream is a pure function of.

Built once per process from the `[dataloader]` config, the tokenizer and seq_len.
It opens the sources (file sizes, Parquet footers) but reads no document.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import Any

from zephon_titan.config import DataConfig, SourceConfig, require_sources
from zephon_titan.engine.chat import chat_setup, era_chats
from zephon_titan.engine.exclusion import Exclusion, build_exclusion
from zephon_titan.engine.mixing import added_offsets, initial_offsets
from zephon_titan.engine.pipeline import (
    PipelineEra,
    config_eras,
    era_index,
    era_pipelines,
    slots_needed,
)
from zephon_titan.engine.schedule import Phase, Schedule
from zephon_titan.engine.seq_len_schedule import Era, era_at, eras_after, seq_len_eras
from zephon_titan.engine.sources import open_source
from zephon_titan.engine.sources.base import FileBlocks, FileRecord, Source
from zephon_titan.engine.sources.storage import StorageOptions
from zephon_titan.engine.tokenize import DocumentTokenizer
from zephon_titan.engine.transforms import SAMPLE_DOCUMENTS, check_deterministic, describe_all, era_transforms
from zephon_titan.errors import ConfigError


@dataclass(frozen=True, eq=False, kw_only=True)
class EngineSpec:
    config: DataConfig
    sources: tuple[Source, ...]
    schedule: Schedule
    """The mixture weights in force at each step (schedule.py)."""
    tokenizer: DocumentTokenizer
    seq_len: int
    phase_offsets: tuple[Fraction, ...] | None = None
    """Each source's mixing offset u_s as a checkpoint kept it (mixing.py: sources added at a resume move no
    other source's phase); None: s / S, a run's own sources."""
    eras: tuple[Era, ...] = ()
    """The run's row lengths by step, one schedule (empty: seq_len from step 1): each era's first step, seq_len
    and mixer piece size. A new run's are its job's (`[[dataloader.phases]] seq_len`); a resume keeps its
    checkpoint's up to the checkpoint's step and appends this config's from the next step (eras_after), so a
    resume may change [training] seq_len in a job that schedules it too. A lane entering an era goes on as a
    resume at that step with that seq_len would (its open unit replayed with the era it was drawn in: stream.py)."""
    exclusion: Exclusion | None = None
    """The documents skipped from a step on (`[dataloader] exclude`: exclusion.py); None: none."""
    pipeline_eras: tuple[PipelineEra, ...] = ()
    """The sources' keep and repeat by step (engine/pipeline.py): the config's from pipeline_from_step, and before
    it a checkpoint's (or none); each source's `era_pipelines` follow them."""

    @property
    def num_lanes(self) -> int:
        return self.config.num_lanes

    @property
    def seed(self) -> int:
        return self.config.seed

    @property
    def mix_chunk_tokens(self) -> int:
        """Largest piece of a document the mixer takes at once (mixing.py); 0 in the config: seq_len."""
        return self.config.mix_chunk_tokens or self.seq_len

    def era_of(self, step: int) -> Era:
        """The era of `step` (a unit drawn for a row of that step was cut with its seq_len and piece size)."""
        return era_at(self.planned_eras, step)

    def eras_from(self, step: int, until: int | None = None) -> list[Era]:
        """The era of `step` and every later one (that begins by step `until`, if given), in order."""
        first = self.era_of(step)
        later = (e for e in self.eras if e.start > first.start)
        return [first, *(e for e in later if until is None or e.start <= until)]

    @property
    def planned_eras(self) -> tuple[Era, ...]:
        """The eras, at least one (seq_len from step 1)."""
        return self.eras or (Era(1, self.seq_len, self.mix_chunk_tokens),)

    @cached_property
    def job_eras(self) -> tuple[Era, ...]:
        """The job's own row lengths by step (its phases' seq_len; empty: none), whatever its resumes changed:
        what the job's checks and reports speak of."""
        return seq_len_eras(self.config, self.seq_len)

    @cached_property
    def pipelines_change(self) -> bool:
        """Whether some source's keep or repeat changes by step (a lane then needs the step of its rows)."""
        return len({json.dumps([e.expressions, e.transforms, e.chats], sort_keys=True) for e in self.pipeline_eras}) > 1

    @cached_property
    def chats_change(self) -> bool:
        """Whether some chat source's template or mask rule changes by step."""
        return len({json.dumps(e.chats, sort_keys=True) for e in self.pipeline_eras}) > 1

    @cached_property
    def transforms_change(self) -> bool:
        """Whether some source's transforms change by step."""
        return len({json.dumps(e.transforms, sort_keys=True) for e in self.pipeline_eras}) > 1

    @cached_property
    def counts_documents(self) -> bool:
        """Whether the ledger says per step what happened to each source's documents (document_counts.py): in a
        run where some may be dropped or repeated (a keep, a repeat, a transform, an exclusion, a chat source); other
        ledgers keep the form they had."""
        pipelined = any(e.expressions or e.transforms for e in self.pipeline_eras)
        return pipelined or self.exclusion is not None or self.counts_targets

    def counts_documents_at(self, step: int) -> bool:
        """Whether the ledger's entry of `step` says what happened to documents: from the first step where something
        may drop or repeat them (a keep, repeat, transform or chat source in force, an exclusion from its step), so
        the steps before keep the form they had (a resume that adds an exclusion leaves them byte for byte)."""
        if not self.counts_documents:
            return False
        era = self.pipeline_eras[self.pipeline_era_of(step)] if self.pipeline_eras else None
        if era is not None and (era.expressions or era.transforms or era.chats):
            return True
        return self.exclusion is not None and step >= self.exclusion.from_step

    @property
    def counts_targets(self) -> bool:
        """Whether the ledger says per step each source's trained targets: in a run with chat sources, whose
        masks leave some targets untrained (other ledgers keep their form)."""
        return any(s.chat is not None for s in self.sources)

    def pipeline_era_of(self, step: int) -> int:
        """The index of the pipeline era in force at `step`."""
        return era_index(self.pipeline_eras, step) if self.pipelines_change else 0

    def with_pipeline_eras(self, eras: tuple[PipelineEra, ...], slots: dict[str, int]) -> EngineSpec:
        """This spec with the pipelines of a resumed run: the checkpoint's eras, then this config's (resume.py);
        each source's windows keep the checkpoint's slots per document (`slots`, by source name)."""
        if eras == self.pipeline_eras and all(slots.get(s.name, s.slots) == s.slots for s in self.sources):
            return self
        for source in self.sources:
            pipelines = era_pipelines(source.name, eras)
            source.set_pipelines(pipelines, slots.get(source.name, slots_needed(pipelines)))
            source.set_era_transforms(era_transforms(source, eras))
            source.set_era_chats(era_chats(source, eras))
        return dataclasses.replace(self, pipeline_eras=eras)

    def with_eras(self, eras: tuple[Era, ...]) -> EngineSpec:
        """This spec continuing a run whose row lengths by step are `eras` (its checkpoint's, then this config's:
        eras_after): the mixer starts a new segment at each change (schedule.py's cuts)."""
        if len(eras) <= 1:
            eras = ()
        if eras == self.eras:
            return self
        schedule = self.schedule.with_cuts(tuple(e.start for e in eras[1:]))
        return dataclasses.replace(self, eras=eras, schedule=schedule)

    @property
    def mixing_offsets(self) -> tuple[Fraction, ...]:
        """Each source's mixing offset u_s (mixing.py)."""
        return self.phase_offsets if self.phase_offsets is not None else initial_offsets(len(self.sources))

    def continuing(self, previous: EngineSpec) -> EngineSpec:
        """This spec as a resume of a run of `previous` continues it (what Restored.spec gives from a checkpoint):
        its sources keep their mixing offsets, added ones take new ones (mixing.added_offsets)."""
        kept = dict(zip(previous.source_names, previous.mixing_offsets))
        offsets = added_offsets(kept, self.source_names)
        return self.resumed(previous.config.best_fit_mixing, tuple(offsets.values()))

    def continuing_at(self, previous: EngineSpec, step: int) -> EngineSpec:
        """continuing(previous) for a resume from `previous`'s checkpoint after `step` steps, which may also change
        seq_len (and the mixer's piece size with it): the eras of `previous` up to `step`, then this spec's."""
        return self.continuing(previous).with_eras(eras_after(previous.planned_eras, step, self.planned_eras))

    def resumed(self, best_fit_mixing: str, phase_offsets: tuple[Fraction, ...] | None) -> EngineSpec:
        """This spec as a resume continues it: with its checkpoint's best_fit_mixing and mixing offsets (a run in
        progress never changes how it mixes: resume.read_state)."""
        if phase_offsets == initial_offsets(len(self.sources)):
            phase_offsets = None  # a run's own sources, as a new run of this config has them
        if self.config.packing != "best_fit":
            best_fit_mixing = self.config.best_fit_mixing  # no rows depend on it: keep the spec (and warm workers)
        if best_fit_mixing == self.config.best_fit_mixing and phase_offsets == self.phase_offsets:
            return self
        config = dataclasses.replace(self.config, best_fit_mixing=best_fit_mixing)
        return dataclasses.replace(self, config=config, phase_offsets=phase_offsets)

    @property
    def repeat(self) -> bool:
        return self.config.exhaustion == "repeat"

    @property
    def pad_id(self) -> int:
        """Input id of padding tokens (their labels are always -100)."""
        eos = self.tokenizer.eos_id
        return eos if eos is not None else 0

    @property
    def source_names(self) -> list[str]:
        return [s.name for s in self.sources]

    @property
    def weights(self) -> tuple[float, ...]:
        """The weights of step 1, normalized to sum to 1, in source order (a run without phases: all steps')."""
        return self.schedule.segment(1).weights


def build_engine(
    config: DataConfig,
    seq_len: int,
    tokenizer: DocumentTokenizer,
    listings: dict[str, list[FileRecord]] | None = None,
) -> EngineSpec:
    """Validate the config against its files and open every source.

    `listings` (source name -> FileBlocks records) skips listing and scanning: worker processes
    get them from the process that built the spec first. The config's values were checked when it was
    made (config/)."""
    require_sources(config)
    if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 1:
        raise ConfigError(f"seq_len must be an integer >= 1, got {seq_len!r} ([training] seq_len)")
    if seq_len > 1 << 20:  # a row of seq_len + 1 tokens per lane is held in memory
        raise ConfigError(f"seq_len must be <= {1 << 20}, got {seq_len} ([training] seq_len; a row is built in memory)")
    listings = listings or {}
    for s in config.sources:
        if s.eos_token_id >= tokenizer.vocab_size:  # checked before the files: it explains what they would show
            raise ConfigError(
                f"[dataloader.sources.{s.name}] eos_token_id = {s.eos_token_id} is outside the tokenizer's "
                f"vocabulary of {tokenizer.vocab_size:,} ids: no document of these files could end; set the EOS id "
                "of the tokenizer that wrote them (and use that tokenizer)"
            )
    sources = tuple(
        _open(s, config, [FileBlocks.from_record(r) for r in listings[s.name]] if s.name in listings else None)
        for s in config.sources
    )
    if not listings:  # the process that lists the files checks the transforms (workers get the listing)
        for source in sources:
            check_source_transforms(source)
    exclusion = None
    if config.exclude:
        files = [(s.name, [f.path for f in s.files]) for s in sources]
        exclusion = build_exclusion(config.exclude, config.exclude_from_step, files)
    eras = seq_len_eras(config, seq_len)
    for source, source_config in zip(sources, config.sources):
        if source_config.chat:
            source.chat = chat_setup(source_config, config.tokenizer_path or tokenizer.folder)
    transforms = {s.name: describe_all(s.transforms) for s in sources if s.transforms}
    pipelines = config_eras(config, transforms, {s.name: s.chat.era_record() for s in sources if s.chat is not None})
    for source in sources:
        by_era = era_pipelines(source.name, pipelines)
        source.set_pipelines(by_era, slots_needed(by_era))
        source.set_era_transforms(era_transforms(source, pipelines))
        source.set_era_chats(era_chats(source, pipelines))
    return EngineSpec(
        config=config,
        sources=sources,
        schedule=schedule_of(config).with_cuts(tuple(e.start for e in eras[1:])),
        tokenizer=tokenizer,
        seq_len=seq_len,
        exclusion=exclusion,
        eras=eras,
        pipeline_eras=pipelines,
    )


def schedule_of(config: DataConfig) -> Schedule:
    """The config's phases, or one phase of the sources' weights; weights normalized per phase."""
    names = config.source_names()
    if not config.phases:
        phases = [Phase(1, _normalized([s.weight for s in config.sources]))]
    else:
        phases = [
            Phase(p.start_step, _normalized([float(p.weights.get(n, 0.0)) for n in names]), p.ramp_steps, p.seq_len)
            for p in config.phases
        ]
    return Schedule(names, phases)


def weight_notes(config: DataConfig) -> list[str]:
    """One line per set of weights (the sources', or a phase's) that does not sum to 1: it is normalized,
    and a user who meant shares that add up should hear it (weights 0.7 and 0.5 are 58 % and 42 %)."""
    names = config.source_names()
    sets = (
        [("[dataloader.sources] weights", [s.weight for s in config.sources])]
        if not config.phases
        else [
            (f"[[dataloader.phases]] start_step {p.start_step} weights", [float(p.weights.get(n, 0.0)) for n in names])
            for p in config.phases
        ]
    )
    notes = []
    for where, weights in sets:
        if abs(sum(weights) - 1.0) > 1e-9:
            shares = ", ".join(f"{n} {w:.4g}" for n, w in zip(names, _normalized(weights)) if w)
            notes.append(f"{where} sum to {sum(weights):g}; normalized to {shares}")
    return notes


def _normalized(weights: list[float]) -> tuple[float, ...]:
    total = sum(weights)
    return tuple(w / total for w in weights)


def check_source_transforms(source: Source) -> None:
    """A source's transforms on a sample of its first documents: deterministic, or ConfigError (transforms.py)."""
    if not source.transforms:
        return
    records: list[dict[str, Any]] = []
    for b in range(source.num_blocks):
        block = source.read_block(b)
        assert block.records is not None, "a source with transforms reads records"
        records += [block.records(i) for i in range(min(SAMPLE_DOCUMENTS - len(records), len(block.texts)))]
        if len(records) >= SAMPLE_DOCUMENTS:
            break
    check_deterministic(source.transforms, records, f"[dataloader.sources.{source.name}]")


def _open(source: SourceConfig, config: DataConfig, listed: list[FileBlocks] | None) -> Source:
    opened = open_source(
        source, max_document_chars=config.max_document_chars, options=StorageOptions.of(config), listed=listed
    )
    if opened.num_blocks == 0:
        files = ", ".join(os.path.basename(f.path) for f in opened.files)
        raise ConfigError(
            f"[dataloader.sources.{source.name}] has no data: its files ({files}) are empty; "
            "fix the paths or remove the source"
        )
    return opened
