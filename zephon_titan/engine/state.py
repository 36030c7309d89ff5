"""A lane's checkpoint state: a few integers, JSON-serializable, never tokens or pickles.

The state names a *unit* of work that is replayed on restore: in `wrap` packing
the document being split across rows, in `best_fit` packing the window of
documents being placed into rows. `cursors` are the per-source reading positions
at the start of that unit and `unit_offset` the progress inside it (tokens of the
document already emitted, or rows of the window already emitted). Restoring
re-reads and re-tokenizes that one unit and skips what was already emitted.
"""

from __future__ import annotations

from dataclasses import dataclass

from zephon_titan.errors import ResumeError

# 2: cursors gained `offset` (documents are mixed in pieces), rows follow TorchTitan's label rule.
STATE_VERSION = 2
# The most seq_len changes a best_fit window may stay open across (LaneState.resized: one count each), so a lane
# entry keeps its fixed size in the checkpoint (engine/resume.py's lane_capacity).
MAX_RESIZED = 8


@dataclass(frozen=True, kw_only=True, slots=True)
class SourceCursor:
    """Where a lane stands in one source."""

    window: int
    """Index of the lane's current shuffle window (shuffle_window_blocks blocks each)."""

    position: int
    """Documents of that window already taken, in the window's shuffled order."""

    tokens: int
    """Tokens taken from this source by the lane so far (drives the mixture); a chat source's trained targets
    under mix_by = "targets"."""

    offset: int = 0
    """Tokens of the document at `position` already taken: the source's open document (see mixing.py)."""


@dataclass(frozen=True, slots=True)
class MixState:
    """Where the lane's mixer stands in a mixture schedule (schedule.py)."""

    segment: int
    """First step of the segment whose weights the lane mixes with."""

    bases: tuple[int, ...]
    """Per source, its tokens (SourceCursor.tokens) when the segment began: the rule counts from there."""

    @classmethod
    def initial(cls, num_sources: int) -> MixState:
        return cls(1, (0,) * num_sources)


@dataclass(frozen=True, slots=True)
class Replay:
    """The sources' places when a lane's open unit was drawn, before a resume by an earlier release added sources
    (it re-phased every source: phi by the index among S sources): the unit is replayed with the mixing phases it
    was drawn with. Read from such checkpoints and kept while that unit is open; this release writes none, as
    added sources keep the others' phases (mixing.py)."""

    num_sources: int
    """S when the unit was drawn."""
    indices: tuple[int, ...]
    """Per source of this run, its index then (-1: added since; it had no weight then)."""


@dataclass(frozen=True, slots=True)
class FeedState:
    """A lane's feed at the start of its open unit: what a restore replays from."""

    cursors: tuple[SourceCursor, ...]
    mix: MixState


@dataclass(frozen=True, kw_only=True, slots=True)
class LaneState:
    lane_id: int
    rows: int
    """Rows the consumer has taken from this lane."""

    cursors: tuple[SourceCursor, ...]
    """Per source (sorted-name order), at the start of the open unit."""

    unit_open: bool
    """Whether a unit (document or best-fit window) is partly emitted."""

    unit_offset: int
    """Tokens (wrap) or rows (best_fit) of the open unit already emitted."""

    mix: MixState | None = None
    """The mixer's segment at the start of the open unit; None without a schedule (always segment 1)."""

    replay: Replay | None = None
    """Set when the open unit was drawn among other sources (a resume added some): how to replay it."""

    resized: tuple[int, ...] | None = None
    """best_fit: the open window was drawn before a resume changed seq_len; its rows emitted at each earlier seq_len
    (packing.py's BestFitPacker.restore re-packs the rest at each change). Saved only while such a window is open."""

    window_rows: int | None = None
    """best_fit_mixing = "per_step" under a schedule: the rows the open window could fill before the next segment
    when it was drawn (packing.py). Saved with it: a restore draws the same window whatever the clock is then
    (a resume may change the global batch size)."""

    excluding: bool | None = None
    """True while a unit drawn with `[dataloader] exclude` in force (from its step on) is open: a restore draws it
    the same way (exclusion.py). Saved only then, so states of runs without an exclusion keep their keys."""

    pipeline_era: int | None = None
    """The pipeline era (engine/pipeline.py) the open unit was drawn in, while a unit is open in a run whose keep or
    repeat changes by step: a restore draws it in that era. Saved only then."""

    version: int = STATE_VERSION

    @property
    def feed(self) -> FeedState:
        return FeedState(self.cursors, self.mix or MixState.initial(len(self.cursors)))

    def with_sources(self, saved: list[str], names: list[str]) -> LaneState:
        """This state (saved with the sources `saved`) for a run with the sources `names`, matched by name:
        an added source starts at its beginning. A removed one is refused: its open document (a piece of
        the open unit) could not be replayed, and its position would be lost."""
        refuse_removed_sources(saved, names)
        at = {name: i for i, name in enumerate(saved)}
        start = SourceCursor(window=0, position=0, tokens=0)
        cursors = tuple(self.cursors[at[n]] if n in at else start for n in names)
        mix = self.mix or MixState.initial(len(saved))
        bases = tuple(mix.bases[at[n]] if n in at else 0 for n in names)
        # Added sources move no other source's mixing phase (mixing.py): the open unit replays as it was drawn.
        # Only a unit drawn before an earlier release added sources (which re-phased them) keeps its replay.
        before = self.replay
        replay = before and Replay(before.num_sources, tuple(before.indices[at[n]] if n in at else -1 for n in names))
        return LaneState(
            lane_id=self.lane_id,
            rows=self.rows,
            cursors=cursors,
            unit_open=self.unit_open,
            unit_offset=self.unit_offset,
            mix=MixState(mix.segment, bases),
            replay=replay if self.unit_open else None,
            window_rows=self.window_rows,
            resized=self.resized,
            excluding=self.excluding,
            pipeline_era=self.pipeline_era,
        )

    @classmethod
    def initial(cls, lane_id: int, num_sources: int) -> LaneState:
        """The state of a lane before its first row (no data needs to be read to know it)."""
        return cls(lane_id=lane_id, rows=0, cursors=initial_cursors(num_sources), unit_open=False, unit_offset=0)

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "version": self.version,
            "lane_id": self.lane_id,
            "rows": self.rows,
            "cursors": [[c.window, c.position, c.tokens, c.offset] for c in self.cursors],
            "unit_open": self.unit_open,
            "unit_offset": self.unit_offset,
        }
        if self.mix is not None:  # only runs with a schedule: other states keep their old form
            out["mix"] = [self.mix.segment, list(self.mix.bases)]
        if self.replay is not None:  # only while a unit drawn before sources were added is open
            out["replay"] = [self.replay.num_sources, list(self.replay.indices)]
        if self.window_rows is not None:  # only while a best_fit window with a row budget is open
            out["window_rows"] = self.window_rows
        if self.resized is not None:  # only while a best_fit window drawn before a seq_len change is open
            out["resized"] = list(self.resized)
        if self.excluding is not None:  # only while a unit drawn under an exclusion is open
            out["excluding"] = True
        if self.pipeline_era is not None:  # only while a unit is open in a run whose pipelines change by step
            out["pipeline_era"] = self.pipeline_era
        return out

    @classmethod
    def from_dict(cls, data: object, where: str = "lane state") -> LaneState:
        """Parse and check a saved state: exact keys, integer fields >= 0, a boolean unit_open, and the
        fields consistent with each other (check_consistent). Checks against the data (an offset within
        its document or window) are the restore's: packing.py, source_reader.py."""
        expected = {"version", "lane_id", "rows", "cursors", "unit_open", "unit_offset"}
        if (
            not isinstance(data, dict)
            or set(data) - {"mix", "replay", "window_rows", "resized", "excluding", "pipeline_era"} != expected
        ):
            got = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise ResumeError(f"{where} must have keys {sorted(expected)}, got {got}")
        if data["version"] != STATE_VERSION:
            raise ResumeError(
                f"{where}: version {data['version']!r} is not supported by this zephon_titan "
                f"(it reads version {STATE_VERSION}); resume with the release that wrote it"
            )
        optional = [name for name in ("window_rows", "pipeline_era") if name in data]
        for name in ("lane_id", "rows", "unit_offset", *optional):
            _count(data[name], name, where)
        resized = data.get("resized")
        if resized is not None:
            if not isinstance(resized, list) or not 1 <= len(resized) <= MAX_RESIZED:
                raise ResumeError(
                    f"{where}: field 'resized' must be a list of rows (1-{MAX_RESIZED} entries), got {resized!r:.80}"
                )
            for value in resized:
                _count(value, "resized", where)
        if data.get("excluding", True) is not True:
            raise ResumeError(f"{where}: field 'excluding' must be true when present, got {data['excluding']!r:.80}")
        if not isinstance(data["unit_open"], bool):
            raise ResumeError(f"{where}: field 'unit_open' must be true or false, got {data['unit_open']!r}")
        if not data["unit_open"] and data["unit_offset"] != 0:
            raise ResumeError(f"{where}: field 'unit_offset' is {data['unit_offset']} with no open unit")
        cursors = data["cursors"]
        if not isinstance(cursors, list) or not all(isinstance(c, list) and len(c) == 4 for c in cursors):
            raise ResumeError(
                f"{where}: field 'cursors' must be a list of [window, position, tokens, offset], got {cursors!r}"
            )
        for c in cursors:
            for name, value in zip(("window", "position", "tokens", "offset"), c):
                _count(value, f"cursors.{name}", where)
        state = cls(
            lane_id=data["lane_id"],
            rows=data["rows"],
            cursors=tuple(SourceCursor(window=w, position=p, tokens=t, offset=o) for w, p, t, o in cursors),
            unit_open=data["unit_open"],
            unit_offset=data["unit_offset"],
            mix=_mix_from(data["mix"], len(cursors), where) if "mix" in data else None,
            replay=_replay_from(data["replay"], len(cursors), where) if "replay" in data else None,
            window_rows=data.get("window_rows"),
            resized=None if resized is None else tuple(resized),
            excluding=data.get("excluding"),
            pipeline_era=data.get("pipeline_era"),
        )
        state.check_consistent(where)
        return state

    def check_consistent(self, where: str = "lane state") -> None:
        """What every state a lane writes satisfies (ResumeError naming the field otherwise):

        - a source's `tokens` count the taken part (`offset`) of its open document;
        - the mix's `bases` are tokens counted when its segment began: at most the source's tokens now;
        - `window_rows` and `replay` are kept only while a unit is open; replay's indices are the checkpoint's S sources, each
          once, and a source added since (-1) has not been read in the open unit (its cursor is at the start).
        """
        for i, c in enumerate(self.cursors):
            if c.offset > c.tokens:
                raise ResumeError(
                    f"{where}: field 'cursors' of source {i}: offset {c.offset} exceeds tokens {c.tokens} (the open "
                    "document's taken tokens are counted in tokens); the checkpoint is damaged"
                )
        if self.mix is not None:
            for i, (base, c) in enumerate(zip(self.mix.bases, self.cursors)):
                if base > c.tokens:
                    raise ResumeError(
                        f"{where}: field 'mix.bases' of source {i} is {base}, more than the source's {c.tokens} "
                        "tokens; the checkpoint is damaged"
                    )
        if self.window_rows is not None and not (self.unit_open and self.window_rows >= 1):
            raise ResumeError(
                f"{where}: field 'window_rows' is {self.window_rows} with {'an' if self.unit_open else 'no'} open unit "
                "(a best_fit window's rows before the next phase, >= 1); the checkpoint is damaged"
            )
        if self.resized is not None and not self.unit_open:
            raise ResumeError(f"{where}: field 'resized' is set with no open unit; the checkpoint is damaged")
        if self.excluding is not None and not self.unit_open:
            raise ResumeError(f"{where}: field 'excluding' is set with no open unit; the checkpoint is damaged")
        if self.pipeline_era is not None and not self.unit_open:
            raise ResumeError(f"{where}: field 'pipeline_era' is set with no open unit; the checkpoint is damaged")
        if self.replay is None:
            return
        if not self.unit_open:
            raise ResumeError(f"{where}: field 'replay' is set with no open unit; the checkpoint is damaged")
        if sorted(i for i in self.replay.indices if i >= 0) != list(range(self.replay.num_sources)):
            raise ResumeError(
                f"{where}: field 'replay' must give each of its {self.replay.num_sources} sources one index, got "
                f"{list(self.replay.indices)!r:.80}; the checkpoint is damaged"
            )
        start = SourceCursor(window=0, position=0, tokens=0)
        for i, (index, c) in enumerate(zip(self.replay.indices, self.cursors)):
            if index < 0 and c != start:
                raise ResumeError(
                    f"{where}: field 'cursors' of source {i}: a source added after the open unit was drawn "
                    "('replay' -1) has been read; the checkpoint is damaged"
                )


def refuse_removed_sources(saved: list[str], names: list[str]) -> None:
    removed = [n for n in saved if n not in names]
    if removed:
        raise ResumeError(
            f"sources {', '.join(removed)} were removed from the config; a resume may add sources but not "
            f"remove them: keep [dataloader.sources.{removed[0]}] and give it no weight in the phases from the "
            "next step on (it rests, and keeps its position)"
        )


def _mix_from(value: object, num_sources: int, where: str) -> MixState:
    if not (
        isinstance(value, list) and len(value) == 2 and isinstance(value[1], list) and len(value[1]) == num_sources
    ):
        raise ResumeError(f"{where}: field 'mix' must be [segment, [one base per source]], got {value!r:.80}")
    _count(value[0], "mix.segment", where)
    for base in value[1]:
        _count(base, "mix.bases", where)
    if value[0] < 1:
        raise ResumeError(f"{where}: field 'mix.segment' must be a step >= 1, got {value[0]}")
    return MixState(value[0], tuple(value[1]))


def _replay_from(value: object, num_sources: int, where: str) -> Replay:
    ok = isinstance(value, list) and len(value) == 2 and isinstance(value[1], list) and len(value[1]) == num_sources
    if not ok or not all(type(i) is int for i in [value[0], *value[1]]):  # type: ignore[index]
        raise ResumeError(f"{where}: field 'replay' must be [sources, [one index per source]], got {value!r:.80}")
    count, indices = value[0], value[1]  # type: ignore[index]
    if not 1 <= count <= 1 << 16 or not all(-1 <= i < count for i in indices):
        raise ResumeError(f"{where}: field 'replay' has indices outside [-1, {count}); the checkpoint is damaged")
    return Replay(count, tuple(indices))


def initial_cursors(num_sources: int) -> tuple[SourceCursor, ...]:
    return tuple(SourceCursor(window=0, position=0, tokens=0) for _ in range(num_sources))


def _count(value: object, name: str, where: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 63:
        raise ResumeError(f"{where}: field {name!r} must be an integer >= 0, got {value!r}")
