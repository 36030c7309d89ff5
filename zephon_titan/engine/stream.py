"""LaneStream: one lane's infinite (or, under `redistribute`, finite) sequence of rows."""

from __future__ import annotations

from zephon_titan.engine.feed import DocumentFeed
from zephon_titan.engine.packing import Row, packer_class
from zephon_titan.engine.spec import EngineSpec
from zephon_titan.engine.state import LaneState
from zephon_titan.errors import ResumeError


class LaneStream:
    """Rows of lane `lane_id`, a pure function of the spec and the lane id.

    `state()` may be taken after any row; a LaneStream built from that state
    continues with exactly the rows the original would have produced.
    """

    def __init__(self, spec: EngineSpec, lane_id: int, state: LaneState | None = None):
        if not 0 <= lane_id < spec.num_lanes:
            raise ValueError(f"lane_id must be in [0, {spec.num_lanes}), got {lane_id}")
        self.spec = spec
        self.lane_id = lane_id
        self.rows = 0
        cursors = None
        if state is not None:
            _check_state(spec, lane_id, state)
            cursors = state.cursors
            self.rows = state.rows
        self.feed = DocumentFeed(spec, lane_id, cursors)
        self.packer = packer_class(spec.config.packing).from_spec(self.feed, spec)
        if state is not None:
            self.packer.restore(state.unit_open, state.unit_offset)

    def next_row(self) -> Row:
        """The next row; raises LaneExhausted at the end of a finite lane."""
        row = self.packer.next_row()
        self.rows += 1
        return row

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
        cursors, unit_open, unit_offset = self.packer.unit()
        return LaneState(
            lane_id=self.lane_id, rows=self.rows, cursors=cursors, unit_open=unit_open, unit_offset=unit_offset
        )


def _check_state(spec: EngineSpec, lane_id: int, state: LaneState) -> None:
    if state.lane_id != lane_id:
        raise ResumeError(f"state of lane {state.lane_id} given to lane {lane_id}")
    if len(state.cursors) != len(spec.sources):
        raise ResumeError(
            f"lane {lane_id}: state has {len(state.cursors)} source cursors, the config has "
            f"{len(spec.sources)} sources ({', '.join(spec.source_names)})"
        )
