"""The mixture schedule: which weights are in force at each optimizer step.

Without `[[dataloader.phases]]` the sources' own weights hold for the whole run (one segment).
With phases, phase p's weights hold from its `start_step`; a phase with `ramp_steps = n` moves
linearly from the previous phase's weights to its own over its first n steps (step start + i has
the fraction (i + 1) / (n + 1) of the way), each ramp step its own segment.

A *segment* is a maximal run of steps with constant weights, named by its first step. A lane
mixes each segment on its own (mixing.py's rule over the tokens taken since the segment began),
so a phase starts at its weights, not at the debt of the previous phase. A lane knows a row's
step through the batch layout (stream.py's StepClock).
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True, slots=True)
class Phase:
    start_step: int
    weights: tuple[float, ...]
    """Normalized to sum to 1, in source order (0: the source rests in this phase)."""
    ramp_steps: int = 0
    seq_len: int = 0
    """The row length from this phase on (`[[dataloader.phases]] seq_len`); 0: the previous phase's (the first
    phase's: the job's training.seq_len)."""


@dataclass(frozen=True, slots=True)
class Segment:
    start: int
    """The segment's first step."""
    weights: tuple[float, ...]


class Schedule:
    def __init__(self, source_names: list[str], phases: list[Phase], cuts: tuple[int, ...] = ()):
        self.source_names = list(source_names)
        self.phases = list(phases)
        self.cuts = tuple(sorted(cuts))
        """Steps where a segment starts with unchanged weights: where seq_len changed at a resume (the mixer
        starts a new segment there, as at a phase). Not part of describe(): the weights are the phases'."""
        self._starts = [p.start_step for p in self.phases]
        self.segment = lru_cache(maxsize=64)(self._segment)  # asked once per row: steps repeat R times

    def with_cuts(self, cuts: tuple[int, ...]) -> Schedule:
        return Schedule(self.source_names, self.phases, cuts)

    @property
    def phased(self) -> bool:
        """The weights change during the run (more than one phase, or a ramp): the fingerprint keeps the schedule
        and the ledger each step's weights."""
        return len(self.phases) > 1 or any(p.ramp_steps or p.seq_len for p in self.phases)

    @property
    def scheduled(self) -> bool:
        """More than one segment: lanes must know the step of each row, and save their segment."""
        return self.phased or bool(self.cuts)

    def _segment(self, step: int) -> Segment:
        """The segment in force at `step` (>= 1)."""
        segment = self._phase_segment(step)
        at = bisect.bisect_right(self.cuts, step) - 1
        if at >= 0 and self.cuts[at] > segment.start:
            return Segment(self.cuts[at], segment.weights)
        return segment

    def _phase_segment(self, step: int) -> Segment:
        p = max(bisect.bisect_right(self._starts, step) - 1, 0)
        phase = self.phases[p]
        into = step - phase.start_step
        if p == 0 or into >= phase.ramp_steps:
            return Segment(phase.start_step + (phase.ramp_steps if p else 0), phase.weights)
        before = self.phases[p - 1].weights
        f = (into + 1) / (phase.ramp_steps + 1)
        return Segment(step, tuple(a + f * (b - a) for a, b in zip(before, phase.weights)))

    def next_start(self, step: int) -> int | None:
        """The first step after `step` that begins a segment (None: `step`'s segment lasts the whole run)."""
        starts = [c for c in self.cuts if c > step][:1]
        for p, phase in enumerate(self.phases):
            if step < phase.start_step:
                starts.append(phase.start_step)
            elif p and step < phase.start_step + phase.ramp_steps:  # a ramp: each of its steps is a segment
                starts.append(step + 1)
        return min(starts, default=None)

    def describe(self) -> str:
        """Canonical text of the schedule (the fingerprint keeps it: a resume compares past steps)."""
        # A phase's seq_len is written only in a schedule that sets one: other schedules keep their text.
        lengths = any(p.seq_len for p in self.phases)
        return json.dumps(
            {
                "sources": self.source_names,
                "phases": [
                    [p.start_step, [round(w, 12) for w in p.weights], p.ramp_steps, *([p.seq_len] if lengths else [])]
                    for p in self.phases
                ],
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_description(cls, text: str) -> Schedule:
        data = json.loads(text)
        return cls(data["sources"], [Phase(start, tuple(weights), *rest) for start, weights, *rest in data["phases"]])

    def boundaries(self, last_step: int) -> list[int]:
        """Every step <= last_step where the weights may change (segment starts), ascending."""
        out = {1}
        for p in self.phases:
            if p.start_step <= last_step:
                out.update(range(p.start_step, min(p.start_step + p.ramp_steps, last_step) + 1))
        return sorted(out)

    def first_difference(self, other: Schedule, last_step: int) -> int | None:
        """The first step <= last_step whose weights differ between the two schedules (by source name),
        or None: steps 1..last_step mix the same."""
        for step in sorted(set(self.boundaries(last_step)) | set(other.boundaries(last_step))):
            if self.weights_by_name(step) != other.weights_by_name(step) or self.seq_len_at(step) != other.seq_len_at(
                step
            ):
                return step
        return None

    def seq_len_at(self, step: int) -> int:
        """The row length the phases set for `step` (0: none set, the job's training.seq_len)."""
        p = max(bisect.bisect_right(self._starts, step) - 1, 0)
        return next((q.seq_len for q in reversed(self.phases[: p + 1]) if q.seq_len), 0)

    def weights_by_name(self, step: int) -> dict[str, float]:
        """The weights at `step` by source name, resting sources left out (rounded: a saved schedule is text)."""
        weights = self.segment(step).weights
        return {name: round(w, 9) for name, w in zip(self.source_names, weights) if w > 0}
