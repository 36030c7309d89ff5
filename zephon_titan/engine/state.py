"""A lane's checkpoint state: a few integers, JSON-serializable, never tokens or pickles.

The state names a *unit* of work that is replayed on restore: in `wrap` packing the document being split across
rows, in `best_fit` packing the window of documents being placed into rows. Each stage of the lane owns its part:

- the feed (feed.py: the readers and the mixer), `FeedState`: where it stood when the open unit was drawn (the
  per-source cursors, the mixer's segment) and how the unit was drawn (another release's mixing phases, an
  exclusion in force, a pipeline era);
- the packer (packing.py), `PackerState`: whether a unit is open and how far it was emitted (tokens of the
  document, or rows of the window), with what a best_fit window keeps across a schedule or a seq_len change.

Restoring hands each stage its own state: the feed is put at the unit's start, the packer re-reads and
re-tokenizes that one unit and skips what was already emitted. A stage with state of its own (a new packer, a
stateful operator) adds its class here and one entry in `LaneState`; the lane never writes a stage's fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zephon_titan.errors import ResumeError

# The rows a state's cursors mean (the fingerprint's state_version): 2, cursors gained `offset` (documents are
# mixed in pieces), rows follow TorchTitan's label rule. A new value means other rows, and a resume is refused.
STATE_VERSION = 2
# The layout of a saved lane state: 2 flat (every stage's fields side by side), 3 one object per stage. Both are
# read; 3 is written.
LANE_FORMAT = 3
READ_FORMATS = (2, 3)
# The most seq_len changes a best_fit window may stay open across (PackerState.resized: one count each), so a lane
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
    """The feed's state (feed.py): where it stood when the lane's open unit was drawn, and how it drew it. The
    optional parts are set only when they apply, so a state keeps the fewest keys."""

    cursors: tuple[SourceCursor, ...]
    """Per source (sorted-name order)."""
    mix: MixState | None = None
    """The mixer's segment; None without a schedule (always segment 1)."""
    replay: Replay | None = None
    """Set when the open unit was drawn among other sources (a resume by an earlier release added some)."""
    excluding: bool = False
    """The open unit was drawn with `[dataloader] exclude` in force (from its step on): a restore draws it the same
    way (exclusion.py)."""
    era: int | None = None
    """The pipeline era (pipeline.py) the open unit was drawn in, in a run whose keep or repeat changes by step."""

    @property
    def mixing(self) -> MixState:
        return self.mix or MixState.initial(len(self.cursors))

    def at_rest(self) -> FeedState:
        """Where the feed stands between units: how a unit was drawn is kept only while it is open."""
        if self.replay is None and not self.excluding and self.era is None:
            return self
        return FeedState(self.cursors, self.mix)

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"cursors": [[c.window, c.position, c.tokens, c.offset] for c in self.cursors]}
        if self.mix is not None:
            out["mix"] = [self.mix.segment, list(self.mix.bases)]
        if self.replay is not None:
            out["replay"] = [self.replay.num_sources, list(self.replay.indices)]
        if self.excluding:
            out["excluding"] = True
        if self.era is not None:
            out["era"] = self.era
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> FeedState:
        _keys(data, {"cursors"}, {"mix", "replay", "excluding", "era"}, "feed", where)
        cursors = data["cursors"]
        if not isinstance(cursors, list) or not all(isinstance(c, list) and len(c) == 4 for c in cursors):
            raise ResumeError(
                f"{where}: field 'feed.cursors' must be a list of [window, position, tokens, offset], got {cursors!r}"
            )
        for c in cursors:
            for name, value in zip(("window", "position", "tokens", "offset"), c):
                _count(value, f"feed.cursors.{name}", where)
        if data.get("excluding", True) is not True:
            raise ResumeError(
                f"{where}: field 'feed.excluding' must be true when present, got {data['excluding']!r:.80}"
            )
        if "era" in data:
            _count(data["era"], "feed.era", where)
        return cls(
            cursors=tuple(SourceCursor(window=w, position=p, tokens=t, offset=o) for w, p, t, o in cursors),
            mix=_mix_from(data["mix"], len(cursors), where) if "mix" in data else None,
            replay=_replay_from(data["replay"], len(cursors), where) if "replay" in data else None,
            excluding="excluding" in data,
            era=data.get("era"),
        )

    def check(self, where: str, unit_open: bool) -> None:
        """What every feed state satisfies (see LaneState.check_consistent)."""
        for i, c in enumerate(self.cursors):
            if c.offset > c.tokens:
                raise ResumeError(
                    f"{where}: field 'feed.cursors' of source {i}: offset {c.offset} exceeds tokens {c.tokens} (the "
                    "open document's taken tokens are counted in tokens); the checkpoint is damaged"
                )
        if self.mix is not None:
            for i, (base, c) in enumerate(zip(self.mix.bases, self.cursors)):
                if base > c.tokens:
                    raise ResumeError(
                        f"{where}: field 'feed.mix.bases' of source {i} is {base}, more than the source's {c.tokens} "
                        "tokens; the checkpoint is damaged"
                    )
        for name, present in (("replay", self.replay is not None), ("excluding", self.excluding)):
            if present and not unit_open:
                raise ResumeError(f"{where}: field 'feed.{name}' is set with no open unit; the checkpoint is damaged")
        if self.era is not None and not unit_open:
            raise ResumeError(f"{where}: field 'feed.era' is set with no open unit; the checkpoint is damaged")
        if self.replay is None:
            return
        if sorted(i for i in self.replay.indices if i >= 0) != list(range(self.replay.num_sources)):
            raise ResumeError(
                f"{where}: field 'feed.replay' must give each of its {self.replay.num_sources} sources one index, got "
                f"{list(self.replay.indices)!r:.80}; the checkpoint is damaged"
            )
        start = SourceCursor(window=0, position=0, tokens=0)
        for i, (index, c) in enumerate(zip(self.replay.indices, self.cursors)):
            if index < 0 and c != start:
                raise ResumeError(
                    f"{where}: field 'feed.cursors' of source {i}: a source added after the open unit was drawn "
                    "('replay' -1) has been read; the checkpoint is damaged"
                )


@dataclass(frozen=True, slots=True)
class PackerState:
    """The packer's state (packing.py): its open unit and how far it was emitted."""

    unit_open: bool
    """Whether a unit (document or best-fit window) is partly emitted."""
    unit_offset: int = 0
    """Tokens (wrap) or rows (best_fit) of the open unit already emitted."""
    window_rows: int | None = None
    """best_fit_mixing = "per_step" under a schedule: the rows the open window could fill before the next segment
    when it was drawn. Saved with it: a restore draws the same window whatever the clock is then (a resume may
    change the global batch size)."""
    resized: tuple[int, ...] | None = None
    """best_fit: the open window was drawn before a seq_len change; its rows emitted at each earlier seq_len
    (BestFitPacker.restore re-packs the rest at each change). Saved only while such a window is open."""

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"unit_open": self.unit_open, "unit_offset": self.unit_offset}
        if self.window_rows is not None:
            out["window_rows"] = self.window_rows
        if self.resized is not None:
            out["resized"] = list(self.resized)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> PackerState:
        _keys(data, {"unit_open", "unit_offset"}, {"window_rows", "resized"}, "packer", where)
        for name in ("unit_offset", *(["window_rows"] if "window_rows" in data else [])):
            _count(data[name], f"packer.{name}", where)
        resized = data.get("resized")
        if resized is not None:
            if not isinstance(resized, list) or not 1 <= len(resized) <= MAX_RESIZED:
                raise ResumeError(
                    f"{where}: field 'packer.resized' must be a list of rows (1-{MAX_RESIZED} entries), got "
                    f"{resized!r:.80}"
                )
            for value in resized:
                _count(value, "packer.resized", where)
        if not isinstance(data["unit_open"], bool):
            raise ResumeError(f"{where}: field 'packer.unit_open' must be true or false, got {data['unit_open']!r}")
        return cls(
            data["unit_open"], data["unit_offset"], data.get("window_rows"), None if resized is None else tuple(resized)
        )

    def check(self, where: str) -> None:
        if not self.unit_open and self.unit_offset != 0:
            raise ResumeError(f"{where}: field 'packer.unit_offset' is {self.unit_offset} with no open unit")
        if self.window_rows is not None and not (self.unit_open and self.window_rows >= 1):
            raise ResumeError(
                f"{where}: field 'packer.window_rows' is {self.window_rows} with {'an' if self.unit_open else 'no'} "
                "open unit (a best_fit window's rows before the next phase, >= 1); the checkpoint is damaged"
            )
        if self.resized is not None and not self.unit_open:
            raise ResumeError(f"{where}: field 'packer.resized' is set with no open unit; the checkpoint is damaged")


CLOSED = PackerState(unit_open=False)


@dataclass(frozen=True, kw_only=True, slots=True)
class LaneState:
    lane_id: int
    rows: int
    """Rows the consumer has taken from this lane."""
    feed: FeedState
    """At the start of the open unit (packer), or where the feed stands when none is open."""
    packer: PackerState

    def with_sources(self, saved: list[str], names: list[str]) -> LaneState:
        """This state (saved with the sources `saved`) for a run with the sources `names`, matched by name:
        an added source starts at its beginning. A removed one is refused: its open document (a piece of
        the open unit) could not be replayed, and its position would be lost."""
        refuse_removed_sources(saved, names)
        at = {name: i for i, name in enumerate(saved)}
        feed = self.feed
        start = SourceCursor(window=0, position=0, tokens=0)
        cursors = tuple(feed.cursors[at[n]] if n in at else start for n in names)
        mix = feed.mixing
        bases = tuple(mix.bases[at[n]] if n in at else 0 for n in names)
        # Added sources move no other source's mixing phase (mixing.py): the open unit replays as it was drawn.
        # Only a unit drawn before an earlier release added sources (which re-phased them) keeps its replay.
        before = feed.replay
        replay = before and Replay(before.num_sources, tuple(before.indices[at[n]] if n in at else -1 for n in names))
        moved = FeedState(cursors, MixState(mix.segment, bases), replay, feed.excluding, feed.era)
        return LaneState(lane_id=self.lane_id, rows=self.rows, feed=moved, packer=self.packer)

    @classmethod
    def initial(cls, lane_id: int, num_sources: int) -> LaneState:
        """The state of a lane before its first row (no data needs to be read to know it)."""
        return cls(lane_id=lane_id, rows=0, feed=FeedState(initial_cursors(num_sources)), packer=CLOSED)

    def to_dict(self) -> dict[str, object]:
        return {
            "version": LANE_FORMAT,
            "lane_id": self.lane_id,
            "rows": self.rows,
            "feed": self.feed.to_dict(),
            "packer": self.packer.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: object, where: str = "lane state") -> LaneState:
        """Parse and check a saved state (either layout): exact keys, integer fields >= 0, and the fields consistent
        with each other (check_consistent). Checks against the data (an offset within its document or window) are
        the restore's: packing.py, source_reader.py."""
        if isinstance(data, dict) and "version" in data and data["version"] not in READ_FORMATS:
            raise ResumeError(
                f"{where}: version {data['version']!r} is not supported by this zephon_titan (it reads versions "
                f"{', '.join(map(str, READ_FORMATS))}); resume with the release that wrote it"
            )
        if isinstance(data, dict) and data.get("version") == 2:
            data = _nested(data, where)
        _keys(data, {"version", "lane_id", "rows", "feed", "packer"}, set(), "", where)
        assert isinstance(data, dict)
        for name in ("lane_id", "rows"):
            _count(data[name], name, where)
        for name in ("feed", "packer"):
            if not isinstance(data[name], dict):
                raise ResumeError(f"{where}: field {name!r} must be an object, got {data[name]!r:.80}")
        state = cls(
            lane_id=data["lane_id"],
            rows=data["rows"],
            feed=FeedState.from_dict(data["feed"], where),
            packer=PackerState.from_dict(data["packer"], where),
        )
        state.check_consistent(where)
        return state

    def check_consistent(self, where: str = "lane state") -> None:
        """What every state a lane writes satisfies (ResumeError naming the field otherwise):

        - a source's `tokens` count the taken part (`offset`) of its open document;
        - the mix's `bases` are tokens counted when its segment began: at most the source's tokens now;
        - how a unit was drawn (the feed's replay, excluding, era) and the packer's window_rows and resized are kept
          only while a unit is open; replay's indices are the checkpoint's S sources, each once, and a source added
          since (-1) has not been read in the open unit (its cursor is at the start).
        """
        self.packer.check(where)
        self.feed.check(where, self.packer.unit_open)


# The flat layout (version 2) by stage: each stage's fields, as (flat key, the stage's key).
_FLAT = {
    "feed": (
        ("cursors", "cursors"),
        ("mix", "mix"),
        ("replay", "replay"),
        ("excluding", "excluding"),
        ("pipeline_era", "era"),
    ),
    "packer": (
        ("unit_open", "unit_open"),
        ("unit_offset", "unit_offset"),
        ("window_rows", "window_rows"),
        ("resized", "resized"),
    ),
}


def _nested(flat: dict[str, Any], where: str) -> dict[str, Any]:
    """A version-2 (flat) state in the stages' layout; what the flat form allowed, and only that, is read."""
    owned = {flat_key for fields in _FLAT.values() for flat_key, _ in fields}
    _keys(flat, {"version", "lane_id", "rows", "cursors", "unit_open", "unit_offset"}, owned, "", where)
    stages = {stage: {key: flat[old] for old, key in fields if old in flat} for stage, fields in _FLAT.items()}
    return {"version": 2, "lane_id": flat["lane_id"], "rows": flat["rows"], **stages}


def _keys(data: object, required: set[str], optional: set[str], stage: str, where: str) -> None:
    if not isinstance(data, dict) or not required <= set(data) or set(data) - required - optional:
        got = sorted(data) if isinstance(data, dict) else type(data).__name__
        name = f"field {stage!r}" if stage else "the state"
        raise ResumeError(
            f"{where}: {name} must have keys {sorted(required)}"
            + (f" (and optionally {sorted(optional)})" if optional else "")
            + f", got {got}"
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
        raise ResumeError(f"{where}: field 'feed.mix' must be [segment, [one base per source]], got {value!r:.80}")
    _count(value[0], "feed.mix.segment", where)
    for base in value[1]:
        _count(base, "feed.mix.bases", where)
    if value[0] < 1:
        raise ResumeError(f"{where}: field 'feed.mix.segment' must be a step >= 1, got {value[0]}")
    return MixState(value[0], tuple(value[1]))


def _replay_from(value: object, num_sources: int, where: str) -> Replay:
    ok = isinstance(value, list) and len(value) == 2 and isinstance(value[1], list) and len(value[1]) == num_sources
    if not ok or not all(type(i) is int for i in [value[0], *value[1]]):  # type: ignore[index]
        raise ResumeError(f"{where}: field 'feed.replay' must be [sources, [one index per source]], got {value!r:.80}")
    count, indices = value[0], value[1]  # type: ignore[index]
    if not 1 <= count <= 1 << 16 or not all(-1 <= i < count for i in indices):
        raise ResumeError(f"{where}: field 'feed.replay' has indices outside [-1, {count}); the checkpoint is damaged")
    return Replay(count, tuple(indices))


def initial_cursors(num_sources: int) -> tuple[SourceCursor, ...]:
    return tuple(SourceCursor(window=0, position=0, tokens=0) for _ in range(num_sources))


def _count(value: object, name: str, where: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 63:
        raise ResumeError(f"{where}: field {name!r} must be an integer >= 0, got {value!r}")
