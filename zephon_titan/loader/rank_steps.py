"""One DP rank's steps of the global batch, for any trainer adapter (torch, never TorchTitan).

DP rank r of W takes rows [r G/W, (r+1) G/W) of each step's global batch (lane 0's R = G/L rows, then
lane 1's, ...; engine/lanes.py): W may be any divisor of G, more than the lanes too. It produces every lane its
rows fall on, whole, and records what its trainer consumed: per lane the engine state, tokens per source and
padding. Its checkpoint state (loader/state.py) is one entry per lane it owns (the lane's first row of a step is
its own), so every lane is saved exactly once, plus a header replicated on every rank; a rank that produces other
lanes after a resize loads exactly those entries. An adapter (titan/dataloader.py for TorchTitan 0.3) only puts
each step's microbatches (step_microbatches: the cut the eval set's loader/eval_steps.py shares) in its trainer's
shapes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from zephon_titan.config import DataConfig
from zephon_titan.engine import LaneState, Row, fingerprint, lane_digest, open_lane_group, tally
from zephon_titan.engine.cores import workers_note
from zephon_titan.engine.document_counts import PER_SOURCE, count_documents
from zephon_titan.engine.resume import HEADER_CAPACITY, HEADER_VERSION, Header, LaneEntry, Restored, read_state
from zephon_titan.engine.rows import step_tally
from zephon_titan.engine.spec import weight_notes
from zephon_titan.engine.tokenize import DocumentTokenizer
from zephon_titan.engine.workers import ProcessLaneGroup
from zephon_titan.errors import ConfigError, LaneExhausted, ResumeError
from zephon_titan.loader.prefetch import PrefetchedSteps, StepSource
from zephon_titan.loader.rank_lanes import Microbatch, RankLanes, dp_rank_zero, every_rank
from zephon_titan.loader.state import Decoded, encode_header, encode_state

log = logging.getLogger()  # TorchTitan's logger is the root logger: the same lines under any adapter


@dataclass(frozen=True, slots=True)
class StepRecord:
    """What the lanes this rank owns contributed to one step, for the batch ledger."""

    lane_digests: list[bytes]
    """Per owned lane (RankLanes.owned), over all its rows of the step."""
    tokens: list[int]
    """Per source, then padding, then the documents' counts (engine/document_counts.py), over the owned lanes'
    rows: step_tally."""

    @classmethod
    def of(cls, owned_rows: list[list[tuple[Row, LaneState]]], num_sources: int) -> StepRecord:
        totals = step_tally((row for rows in owned_rows for row, _ in rows), num_sources)
        return cls([lane_digest(row for row, _ in rows) for rows in owned_rows], totals)


@dataclass(frozen=True, slots=True)
class RankStep:
    """One step as this rank produces it."""

    rows: Sequence[Row]
    """This rank's rows of the step's global batch, in order."""
    lanes: list[list[tuple[Row, LaneState]]]
    """Every lane this rank produces, whole, each row with the lane's state after it."""
    record: StepRecord | None
    """For the batch ledger (None when no ledger is kept)."""


class RankSteps:
    """One DP rank's steps, what its trainer consumed, and its checkpoint entries (see the module's docstring)."""

    def __init__(
        self,
        data: DataConfig,
        *,
        global_batch_size: int,
        dp_world_size: int,
        dp_rank: int,
        local_batch_size: int,
        seq_len: int,
        tokenizer: Callable[[], DocumentTokenizer],
        ledger: bool = True,
    ):
        self.data = data
        self.global_batch_size = global_batch_size
        self.ledger = ledger
        lanes = RankLanes.build(
            data,
            global_batch_size=global_batch_size,
            dp_world_size=dp_world_size,
            dp_rank=dp_rank,
            local_batch_size=local_batch_size,
            seq_len=seq_len,
            tokenizer=tokenizer,
        )
        self.lanes = lanes
        self.spec, self.lane_ids, self.rows_per_lane = lanes.spec, lanes.lane_ids, lanes.rows_per_lane
        self.local_batch_size = local_batch_size
        # In process: loaded while the trainer builds its model; chosen (and said, once per rank) at the first
        # batch. Worker processes load, check and report their own: this process then never tokenizes.
        if not data.num_workers:
            self.spec.tokenizer.start_backend()
        self.fingerprint = fingerprint(self.spec)
        for note in weight_notes(data):
            log.info(f"zephon_titan: {note}")
        if self.spec.exclusion and self.spec.exclusion.unplaced_note:
            log.warning(f"zephon_titan: {self.spec.exclusion.unplaced_note}")
        self._steps_done = 0  # whole steps consumed (a row's step matters under a mixture schedule)
        self.restored: Restored | None = None  # what the last load_state_dict restored
        try:
            encode_header(self._header())  # fails here, at startup, never at the first save
        except ResumeError:
            phases, sources = len(data.phases), len(data.sources)
            raise ConfigError(
                f"[[dataloader.phases]]: the schedule ({phases} phases x {sources} sources) does not fit the "
                f"checkpoint header's {HEADER_CAPACITY} bytes; use fewer phases (ramp_steps draws a ramp in one)"
            ) from None
        self.num_lanes = data.num_lanes
        num_sources = len(self.spec.sources)
        self._group: StepSource | None = None
        # Worker processes start now (imports, tokenizer backend) while the trainer builds the model
        # and loads a checkpoint; their lanes start at the first batch, from the consumed state.
        self._warm: Any = None
        if data.num_workers:
            if crowded := workers_note(data.num_workers, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)):
                log.warning(f"zephon_titan: {crowded}")
            self._warm = open_lane_group(
                self.spec, self.lane_ids, self.rows_per_lane, data.num_workers, data.prefetch_factor, deferred=True
            )
        # What the trainer has consumed, per lane: engine state and tokens per source.
        # Known without reading data: building the loader costs no request to the sources.
        self._consumed: dict[int, LaneState] = {lane: LaneState.initial(lane, num_sources) for lane in self.lane_ids}
        self._tokens: dict[int, list[int]] = {lane: [0] * num_sources for lane in self.lane_ids}
        self._padding: dict[int, int] = {lane: 0 for lane in self.lane_ids}
        # And what happened to documents in the rows consumed by this process (metrics only: not saved).
        self._documents: dict[int, list[int]] = {lane: [0] * num_sources * PER_SOURCE for lane in self.lane_ids}
        self.last_step: StepRecord | None = None

    # ---- steps ------------------------------------------------------------------------------

    def steps(self) -> Iterator[RankStep]:
        """This rank's rows of each step, in order, until a lane runs out under a non-repeating policy (then on
        every rank at the same step). An adapter hands a step's rows to its trainer in its own shapes and calls
        `consume(step)` as it hands over the last of them."""
        num_sources = len(self.spec.sources)
        announce_workers = False
        if self._group is None:
            data = self.data
            if self._warm is not None:
                group, self._warm = self._warm, None
                group.start(self._consumed, self._steps_done)
            else:
                group = open_lane_group(
                    self.spec,
                    self.lane_ids,
                    self.rows_per_lane,
                    data.num_workers,
                    data.prefetch_factor,
                    self._consumed,
                    first_step=self._steps_done,
                )
            # In process, a thread produces the next steps while the trainer computes (loader/prefetch.py).
            if data.num_workers:
                self._group = group
                announce_workers = True  # with the first step: the workers report their backend before any rows
            else:
                self._announce_backend()  # before the prefetch thread encodes: one thread uses the tokenizer
                self._group = PrefetchedSteps(group, data.prefetch_factor)
        while True:
            step = self._next_step_everywhere()
            if step is None:
                log.warning(
                    f'zephon_titan: a lane ran out of data under exhaustion = "{self.data.exhaustion}" after '
                    f"{self._consumed[self.lane_ids[0]].rows} rows per lane; every rank stops here"
                )
                return
            if announce_workers:
                self._announce_workers_backend()
                announce_workers = False
            self._announce_seq_len(self._steps_done + 1)
            record = StepRecord.of(self.lanes.of_owned(step), num_sources) if self.ledger else None
            yield RankStep(self.lanes.mine([row for rows in step for row, _ in rows]), step, record)

    def step_microbatches(self, step: RankStep) -> Iterator[Microbatch]:
        """This rank's rows of the step, in microbatches of local_batch_size rows; `consume(step)` goes with the last
        (Microbatch.last)."""
        return self.lanes.microbatches(step.rows)

    def consume(self, step: RankStep) -> None:
        """The step handed over whole (TorchTitan saves between steps): every lane this rank produces now stands
        at the end of the step, whichever of its rows this rank took."""
        self._consume(step.lanes, len(self.spec.sources))
        self.last_step = step.record

    def _announce_seq_len(self, step: int) -> None:
        """One line where the job's seq_len schedule changes the row length (at `step`, the step now handed out)."""
        era = self.spec.era_of(step)
        if era in self.spec.job_eras and era.start == step and step > 1:
            before = self.spec.era_of(step - 1).seq_len
            log.info(f"zephon_titan: seq_len {before} -> {era.seq_len} from step {step} (the job's schedule)")

    def _consume(self, step: list[list[tuple[Row, LaneState]]], num_sources: int) -> None:
        for lane, rows in zip(self.lane_ids, step):
            self._consumed[lane] = rows[-1][1]
            counts = tally((row for row, _ in rows), num_sources)
            self._tokens[lane] = [a + b for a, b in zip(self._tokens[lane], counts)]
            self._padding[lane] += counts[-1]
            documents = count_documents((row for row, _ in rows), num_sources)
            self._documents[lane] = [a + b for a, b in zip(self._documents[lane], documents)]
        self._steps_done += 1

    def _announce_backend(self) -> None:
        """Choose the backend (loaded in the background since __init__, while the model was built) and
        say which, once per rank: a fallback, or tokenizer_backend = fastokens refused, before step 1."""
        self.spec.tokenizer.select_backend()
        log.info(f"zephon_titan: tokenizer backend {self.spec.tokenizer.backend_reason}")

    def _announce_workers_backend(self) -> None:
        """Say which backend the loader workers chose, once per rank, before step 1: each worker loads and
        checks its own (a refused tokenizer_backend = fastokens is its error, raised with the first step)."""
        assert isinstance(self._group, ProcessLaneGroup)
        chosen: dict[str, list[int]] = {}
        for worker, (_, why) in sorted(self._group.backends().items()):
            chosen.setdefault(why, []).append(worker)
        for why, workers in chosen.items():
            log.info(f"zephon_titan: tokenizer backend {why} (loader workers {', '.join(map(str, workers))})")

    def _next_step_everywhere(self):
        """The next step's rows, or None on every rank once any lane of the run is exhausted.

        Lanes only run out under a non-repeating policy, and they run out at different steps;
        a rank that stopped alone would leave the others waiting in a collective. So finite runs
        agree on every step with one tiny all-reduce (MIN of "I have a full step").
        """
        assert self._group is not None, "__iter__ opens the lane group first"
        try:
            step = self._group.next_step_with_states()
        except LaneExhausted:
            step = None
        if self.spec.repeat:
            return step
        return step if every_rank(step is not None) else None

    # ---- token accounting ------------------------------------------------------------------

    def consumed_tokens(self) -> list[int]:
        """Tokens per source (plus padding, last) in the lanes this rank owns, as consumed by the trainer: a sum
        over the DP ranks counts every lane once."""
        owned = self.lanes.owned
        totals = [sum(self._tokens[lane][s] for lane in owned) for s in range(len(self.spec.sources))]
        return totals + [sum(self._padding[lane] for lane in owned)]

    def consumed_documents(self) -> list[int]:
        """What happened to documents in the rows of the lanes this rank owns that this process handed to the trainer
        (engine/document_counts.py; PER_SOURCE per source): a sum over the DP ranks counts every lane once."""
        totals = [0] * (len(self.spec.sources) * PER_SOURCE)  # a rank with no lane of its own (more ranks than lanes)
        for lane in self.lanes.owned:
            totals = [a + b for a, b in zip(totals, self._documents[lane])]
        return totals

    # ---- checkpoint state ------------------------------------------------------------------

    def _header(self) -> Header:
        # num_lanes and seq_len are fingerprint components; G is checked on its own (load_state_dict).
        return Header(HEADER_VERSION, self.global_batch_size, self._steps_done, self.fingerprint)

    @property
    def restored_step(self) -> int | None:
        """The step of the state the last load_state_dict restored."""
        return None if self.restored is None else self.restored.step

    @property
    def steps_done(self) -> int:
        """Whole steps of rows handed out (restored ones included): the trainer's step, between steps."""
        return self._steps_done

    def state_dict(self) -> dict[str, Any]:
        # Only the lanes this rank owns: every lane is saved once, whichever ranks produce it.
        lanes = {
            lane: LaneEntry(self._consumed[lane], self._tokens[lane], self._padding[lane]) for lane in self.lanes.owned
        }
        return encode_state(self._header(), lanes, len(self.spec.sources))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore from a checkpoint's entries for this rank's lanes (loader/state.restore() loads them: DCP
        calls this), after every check of engine/resume.read_state."""
        restored = read_state(Decoded(state_dict), self.lane_ids, self.fingerprint, self.data.resume_allow)
        if dp_rank_zero():
            if restored.added:
                log.info(
                    f"zephon_titan: sources added at this resume: {', '.join(restored.added)} (each from its start)"
                )
            if restored.mixture_change:
                log.info(f"zephon_titan: {restored.mixture_change}")
            if restored.seq_len_change:
                log.info(f"zephon_titan: {restored.seq_len_change}; every lane continues where it stopped")
            saved_batch = restored.header.global_batch_size
            if saved_batch != self.global_batch_size:
                log.info(
                    f"zephon_titan: global batch size {saved_batch} -> {self.global_batch_size} rows from the "
                    "next step on; every lane continues where it stopped (lane streams do not depend on it)"
                )
        self._close_started()  # a group started before the load would continue from the old position
        self._continue_mixing(restored)
        self._consumed = {lane: entry.state for lane, entry in restored.lanes.items()}
        self._tokens = {lane: entry.tokens for lane, entry in restored.lanes.items()}
        self._padding = {lane: entry.padding for lane, entry in restored.lanes.items()}
        self._documents = {lane: [0] * len(self.spec.sources) * PER_SOURCE for lane in restored.lanes}
        self._steps_done = restored.step
        self.restored = restored

    def _continue_mixing(self, restored: Restored) -> None:
        """Mix as the checkpoint's run did (a run in progress never changes how it mixes: engine/mixing.py). Worker
        processes started with the config's spec are let go; the first batch starts them anew."""
        spec = restored.spec(self.spec)
        if spec is self.spec:
            return
        if dp_rank_zero() and spec.config.best_fit_mixing != self.spec.config.best_fit_mixing:
            log.info(
                f'zephon_titan: best_fit_mixing = "{spec.config.best_fit_mixing}", as the checkpoint\'s run (a new '
                f'run of this config would use "{self.spec.config.best_fit_mixing}"; docs/mixture.md)'
            )
        self.spec = spec
        self.fingerprint = fingerprint(self.spec)
        if self._warm is not None:
            self._warm.close()
            self._warm = None

    def close(self) -> None:
        self._close_started()
        if self._warm is not None:
            self._warm.close()
            self._warm = None

    def _close_started(self) -> None:
        if self._group is not None:
            self._group.close()
            self._group = None
