"""LaneStream: one lane's infinite (or, under `redistribute`, finite) sequence of rows."""

from __future__ import annotations

from dataclasses import dataclass

from zephon_titan.engine.encode_calls import EncodeBatcher
from zephon_titan.engine.feed import DocumentFeed
from zephon_titan.engine.packing import packer_class
from zephon_titan.engine.rows import Row, RowShape
from zephon_titan.engine.spec import EngineSpec
from zephon_titan.engine.state import LaneState
from zephon_titan.errors import ResumeError


@dataclass(frozen=True, slots=True)
class StepClock:
    """The optimizer step of each of a lane's rows: R rows per step, counted from where the lane started
    (a resume may change R: the global batch size may change, lane streams do not depend on it)."""

    rows_per_step: int
    first_row: int = 0
    """The lane's row count when this layout began (its state's rows at a resume)."""
    first_step: int = 0
    """Steps completed at first_row."""

    def step(self, row: int) -> int:
        """The step (from 1) of the lane's row number `row` (from 0)."""
        return self.first_step + 1 + (row - self.first_row) // self.rows_per_step


def lane_clock(rows_per_step: int, state: LaneState | None, first_step: int) -> StepClock:
    """The clock of a lane that starts at `state` (None: its first row) after `first_step` steps."""
    return StepClock(rows_per_step, state.rows if state is not None else 0, first_step)


class LaneStream:
    """Rows of lane `lane_id`, a pure function of the spec and the lane id (and, under a mixture
    schedule, of the step of each row: `clock`).

    `state()` may be taken after any row; a LaneStream built from that state
    continues with exactly the rows the original would have produced.
    """

    def __init__(
        self,
        spec: EngineSpec,
        lane_id: int,
        state: LaneState | None = None,
        clock: StepClock | None = None,
        batcher: EncodeBatcher | None = None,
    ):
        """`batcher`: shared by lanes stepped together in one thread, so that their readers encode in shared
        calls (a speed knob: rows never depend on it); None: the lane's own."""
        if not 0 <= lane_id < spec.num_lanes:
            raise ValueError(f"lane_id must be in [0, {spec.num_lanes}), got {lane_id}")
        stepped = spec.schedule.scheduled or spec.exclusion is not None or spec.pipelines_change
        if clock is None and stepped:
            raise ValueError(
                "a lane under a mixture schedule, an exclusion or keep and repeat by step needs the step of its rows "
                "(a StepClock)"
            )
        self.spec = spec
        self.lane_id = lane_id
        self.rows = 0
        self.clock = clock if stepped else None
        if state is not None:
            _check_state(spec, lane_id, state)
            self.rows = state.rows
        self.batcher = batcher
        # The feed takes its state, and with it how the open unit was drawn (its era, an exclusion, a replay).
        self.feed = DocumentFeed(spec, lane_id, state.feed if state is not None else None, batcher)
        self.packer = packer_class(spec.config.packing).from_spec(self.feed, spec)
        self._unit_start: object = None
        # The pipeline era the open unit was drawn in (engine/pipeline.py): rows of a later era leave out its
        # documents that era's keep drops. A state without one was saved in a run of one era up to its checkpoint:
        # its unit was drawn in the era of the last step trained.
        if state is not None and spec.pipelines_change and state.feed.era is None:
            last = self.clock.step(state.rows) - 1 if self.clock is not None else 0
            self.feed.set_era(spec.pipeline_era_of(last))
        self._unit_era = self.feed.era
        # The era of the lane's next row: its row length and the mixer's piece size (seq_len_schedule.py; one era
        # unless the job schedules seq_len or a resume changed it).
        self.era = spec.era_of(self.clock.step(self.rows) if self.clock is not None else 1)
        self.packer.shape = RowShape.of(spec, self.era.seq_len)
        self.feed.chunk = self.era.chunk
        if spec.schedule.scheduled and self.clock is not None:
            self.packer.boundary = self._rows_to_next_segment
        if state is not None:
            # The open unit, drawn as it was: with the seq_len and piece size of the step it was drawn for
            # (its segment's first step: a seq_len change starts a segment), then resized (packing.py).
            eras = spec.eras_from(state.feed.mixing.segment, self.era.start) if state.packer.unit_open else []
            shapes = [RowShape.of(spec, era.seq_len) for era in eras]
            self.feed.chunk = eras[0].chunk if eras else self.era.chunk
            self.packer.restore(state.packer, shapes)
            self.feed.chunk = self.era.chunk
            self.feed.end_replay()
            self._unit_start = self.packer.unit()[0]
        # The feed's counts when the lane's last row was made: a restore's replay counted what it read again, up
        # to where the saved row left off (document_counts.py).
        self._counted = list(self.feed.counted)

    def next_row(self) -> Row:
        """The next row; raises LaneExhausted at the end of a finite lane."""
        if self.clock is not None:
            step = self.clock.step(self.rows)
            if self.spec.eras and self.spec.era_of(step) != self.era:
                # The run's seq_len changes at this step: the lane goes on exactly as a resume here with the new
                # seq_len would (its open unit replayed, a best_fit window packed again at the new length).
                self.__init__(self.spec, self.lane_id, self.state(), self.clock, self.batcher)  # type: ignore[misc]
            self.feed.at_step(step)
            exclusion = self.spec.exclusion
            self.feed.excluding = exclusion is not None and step >= exclusion.from_step
            self.feed.pruning = self._unit_era != self.feed.era
        row = self.packer.next_row()
        tracked = self.spec.exclusion is not None or self.spec.pipelines_change
        if tracked and self.packer.unit()[0] is not self._unit_start:  # a unit drawn now
            self._unit_start, self._unit_era = self.packer.unit()[0], self.feed.era
        self.rows += 1
        counted = self.feed.counted
        documents = tuple(a - b for a, b in zip(counted, self._counted))
        # Row(...), not dataclasses.replace: the same row, without replace's per-call field walk (per row: issue 47).
        row = Row(
            row.inputs, row.labels, row.positions, row.pieces, row.padding, documents=documents, targets=row.targets
        )
        self._counted = list(counted)
        return row

    def _rows_to_next_segment(self) -> int | None:
        """Rows from the next one (row `self.rows`) to the first row of the next segment, by the clock."""
        assert self.clock is not None, "set as the packer's boundary only under a schedule"
        start = self.spec.schedule.next_start(self.clock.step(self.rows))
        if start is None:
            return None
        return self.clock.first_row + (start - 1 - self.clock.first_step) * self.clock.rows_per_step - self.rows

    def take(self, n: int) -> list[Row]:
        return [self.next_row() for _ in range(n)]

    def take_with_states(self, n: int) -> list[tuple[Row, LaneState]]:
        """n rows, each with the lane state right after it (what a consumer of that row saves)."""
        out = []
        for _ in range(n):
            row = self.next_row()
            out.append((row, self.state()))
        return out

    def state(self) -> LaneState:
        """The lane's rows and each stage's own state: the feed's at the start of the packer's open unit."""
        feed, packer = self.packer.unit()
        return LaneState(
            lane_id=self.lane_id, rows=self.rows, feed=feed if packer.unit_open else feed.at_rest(), packer=packer
        )


def _check_state(spec: EngineSpec, lane_id: int, state: LaneState) -> None:
    if state.lane_id != lane_id:
        raise ResumeError(f"state of lane {state.lane_id} given to lane {lane_id}")
    if len(state.feed.cursors) != len(spec.sources):
        raise ResumeError(
            f"lane {lane_id}: state has {len(state.feed.cursors)} source cursors, the config has "
            f"{len(spec.sources)} sources ({', '.join(spec.source_names)})"
        )
