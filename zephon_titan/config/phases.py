"""The schema of a mixture schedule: `[[dataloader.phases]]` (PhaseConfig) and the rules a schedule keeps.

Its own module because a schedule is checked as a whole (order, ramps, the source names it weights), not
field by field; sources.py and data.py stay the per-table schemas.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass

from zephon_titan.config.schema import setting
from zephon_titan.config.sources import MAX_WEIGHT
from zephon_titan.errors import ConfigError

# The schedule is kept in the loader's checkpoint header, whose slot is fixed (engine/resume.py).
MAX_PHASES = 256


@dataclass(kw_only=True, slots=True)
class PhaseConfig:
    """One phase of a mixture schedule (`[[dataloader.phases]]`)."""

    start_step: int = setting(rows=True, rows_note="the schedule component")
    """First optimizer step of the phase (the first phase starts at step 1)."""

    weights: dict[str, float] = setting(rows=True, rows_note="the schedule component")
    """Share of tokens per source name in this phase (normalized); a source left out rests (weight 0)."""

    ramp_steps: int = setting(0, rows=True, rows_note="the schedule component")
    """Move linearly from the previous phase's weights to these over the phase's first ramp_steps steps."""

    seq_len: int = setting(
        0,
        rows=True,
        rows_note="the schedule component",
        bounds=(0, 1 << 20, "a row is built in memory"),
        allowed="0 or a length <= [training] seq_len",
    )
    """Rows of this many tokens from this phase's start_step (a sequence-length warm-up, or a long-context stage
    planned from the start); 0: the previous phase's (the first phase's: [training] seq_len, which must be the
    schedule's longest: TorchTitan sizes the RoPE cache by it). Each lane continues where it stopped, as at a resume
    that changes seq_len (docs/changing-a-run.md). The job needs [training] disable_cuda_graphs = true (TorchTitan's
    CUDA graphs refuse inputs of another shape)."""


def validate_phases(phases: list[PhaseConfig], names: list[str]) -> None:
    """A schedule starts at step 1, its phases in increasing order, each ramp done before the next phase,
    every weight finite and >= 0 over known sources, every phase with some weight. A source may rest in
    every phase: declared now, it can be given a weight in a later phase when the run is resumed."""
    if not phases:
        return
    if len(phases) > MAX_PHASES:  # the schedule is kept in the checkpoint header (engine/resume.py)
        raise ConfigError(f"[[dataloader.phases]]: {len(phases)} phases, at most {MAX_PHASES} are supported")
    for i, phase in enumerate(phases):
        where = f"[[dataloader.phases]] #{i + 1} (start_step {phase.start_step})"
        if i == 0 and phase.start_step != 1:
            raise ConfigError(f"{where}: the first phase must start at step 1")
        if i and phase.start_step <= phases[i - 1].start_step:
            raise ConfigError(
                f"{where}: phases must be in increasing start_step order (after {phases[i - 1].start_step})"
            )
        if phase.ramp_steps < 0 or (i == 0 and phase.ramp_steps):
            raise ConfigError(f"{where}: ramp_steps must be >= 0, and 0 in the first phase (nothing to ramp from)")
        if i and phases[i - 1].start_step + phases[i - 1].ramp_steps > phase.start_step:
            raise ConfigError(
                f"{where}: the previous phase's ramp of {phases[i - 1].ramp_steps} steps runs into this phase"
            )
        for name, weight in phase.weights.items():
            if name not in names:
                close = difflib.get_close_matches(name, names, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"sources: {', '.join(names)}"
                raise ConfigError(f"{where}: weights name an unknown source {name!r}; {hint}")
            if not (isinstance(weight, (int, float)) and not isinstance(weight, bool)) or not (
                math.isfinite(weight) and 0 <= weight <= MAX_WEIGHT
            ):
                raise ConfigError(f"{where}: weight of {name!r} must be a finite number >= 0, got {weight!r}")
        if not any(w > 0 for w in phase.weights.values()):
            raise ConfigError(f"{where}: no source has a weight > 0; every phase must read something")
        if not 0 <= phase.seq_len <= 1 << 20:
            raise ConfigError(
                f"{where}: seq_len must be 0 (the previous phase's) or in [1, {1 << 20}], got {phase.seq_len}"
            )
