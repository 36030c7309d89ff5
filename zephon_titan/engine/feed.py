"""One lane's mixed stream of document pieces: its readers of every source (source_reader.py), mixed by tokens.

A piece is at most `mix_chunk_tokens` tokens of one document; the mixer (mixing.py) picks the source of each
piece. The feed's state (FeedState) is each source's cursor, under a mixture schedule the segment it mixes, and
how the lane's open unit was drawn (another release's phases, an exclusion in force, a pipeline era).
From `exclude_from_step` on (the lane says when: `excluding`), a listed document is skipped where it is read; in
a pipeline era (pipeline.py), a slot its pass does not train is skipped, and a unit drawn in an earlier era leaves
out the documents the new keep drops (`pruning`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from zephon_titan.engine.chat import MASKED, REFUSED
from zephon_titan.engine.document_counts import (
    DROPPED_BY_MASK,
    DROPPED_TOO_LONG,
    EXCLUDED,
    PER_SOURCE,
    READ,
    REPEATED,
    TRUNCATED,
)
from zephon_titan.engine.encode_calls import EncodeBatcher
from zephon_titan.engine.mixing import choose_source, lane_phases
from zephon_titan.engine.pipeline import DROPPED
from zephon_titan.engine.source_reader import Document, LaneSourceReader
from zephon_titan.engine.spec import EngineSpec
from zephon_titan.engine.state import FeedState, MixState, Replay, SourceCursor, initial_cursors
from zephon_titan.errors import DataError, ResumeError

__all__ = ["Document", "DocumentFeed"]


class DocumentFeed:
    """One lane's mixed stream of document pieces; its state is the per-source cursors, under a mixture schedule
    the segment it mixes, and how the open unit was drawn (FeedState)."""

    def __init__(
        self, spec: EngineSpec, lane_id: int, state: FeedState | None = None, batcher: EncodeBatcher | None = None
    ):
        """`batcher`: shared by the lanes of a group (their readers encode together); None: the lane's own."""
        self.spec = spec
        self.lane_id = lane_id
        batcher = batcher if batcher is not None else EncodeBatcher()
        self.readers = [LaneSourceReader(spec, s, lane_id, batcher) for s in range(len(spec.sources))]
        if state is None:
            state = FeedState(initial_cursors(len(spec.sources)))
        self.cursors = list(state.cursors)
        self.mix = state.mixing
        self.weights = spec.schedule.segment(self.mix.segment).weights
        self.phases = lane_phases(spec.source_names, lane_id, spec.num_lanes, spec.phase_offsets)
        self._scheduled = spec.schedule.scheduled
        self._eras = spec.pipelines_change
        self.replay = state.replay
        """Set while the unit a restore replays was drawn before an earlier release added sources: the feed mixes
        with the phases it was drawn with (end_replay puts this run's back)."""
        if self.replay is not None:
            self.phases = _replay_phases(self.replay, lane_id, spec.num_lanes)
        self.chunk = spec.mix_chunk_tokens
        # Tokens a document needs to put anything in a row: an (input, label) pair under labels = "document".
        self.placeable = 2 if spec.config.labels == "document" else 1
        self._has_document: list[bool | None] = [None] * len(spec.sources)
        """Per source, whether its cursor (normalized) stands at a document; None: not normalized since it moved.
        Only the source a piece came from moves, so a piece normalizes one cursor, not every source's."""
        self._by_targets = [spec.config.mix_by == "targets" and source.chat is not None for source in spec.sources]
        """Per source, whether its share counts trained targets (mix_by = "targets", a chat source)."""
        self.counted = [0] * (len(spec.sources) * PER_SOURCE)
        """What the feed did with documents since it was made, PER_SOURCE per source (document_counts.py)."""
        self._barren_since: list[tuple[int, int] | None] = [None] * len(spec.sources)
        """Per source, the (window, position) where its run of documents that place nothing began."""
        self.excluding = False
        """The next pieces are for a row at or after exclude_from_step: listed documents are skipped."""
        self.era = 0
        """The pipeline era of the next pieces (engine/pipeline.py; set_era)."""
        self.pruning = False
        """The open unit was drawn in an earlier pipeline era: its documents this era's keep drops are left out
        (stream.py sets it; the packers ask `dropped`, as for an exclusion)."""
        self._run_source = -1
        """The source of the piece next_document returned last when that piece was a whole document (following()
        may go on from it); -1: none."""
        self._restore_drawing(state)
        for reader, cursor, weight in zip(self.readers, self.cursors, self.weights):
            if weight > 0:  # lanes created together fetch their first windows together (next_document's)
                reader.prefetch(cursor.window)

    def _restore_drawing(self, state: FeedState) -> None:
        """Draw the restored unit as it was drawn: in its pipeline era, under the exclusion if it was."""
        if state.era is not None and state.era >= len(self.spec.pipeline_eras):
            raise ResumeError(
                f"lane {self.lane_id}: the state's open unit was drawn in pipeline era {state.era}, but the run has "
                f"{len(self.spec.pipeline_eras)}; the checkpoint is damaged or belongs to another run"
            )
        if state.era is not None and self._eras:
            self.set_era(state.era)
        if state.excluding:
            if self.spec.exclusion is None:
                raise ResumeError(
                    f"lane {self.lane_id}: the state's open unit was drawn under [dataloader] exclude, which this "
                    "config lacks; keep the exclude settings of the run"
                )
            self.excluding = True

    def end_replay(self) -> None:
        """The restored unit is drawn again: the next units mix with this run's phases."""
        if self.replay is not None:
            self.replay = None
            self.phases = lane_phases(
                self.spec.source_names, self.lane_id, self.spec.num_lanes, self.spec.phase_offsets
            )

    def state(self, cursors: tuple[SourceCursor, ...] | None = None) -> FeedState:
        """Where the feed stands, and how a unit drawn from here is drawn (the packers keep it for their unit);
        `cursors`: where it stood before the last piece of a run (following())."""
        return FeedState(
            tuple(self.cursors) if cursors is None else cursors,
            self.mix if self._scheduled else None,
            self.replay,
            self.excluding,
            self.era if self._eras else None,
        )

    def at_step(self, step: int) -> None:
        """The next pieces are for a row of optimizer step `step`: mix with that step's segment, counting
        tokens from where the segment began (the first time the lane meets it)."""
        segment = self.spec.schedule.segment(step)
        if segment.start != self.mix.segment:
            self.mix = MixState(segment.start, tuple(c.tokens for c in self.cursors))
            self.weights = segment.weights
        self.set_era(self.spec.pipeline_era_of(step))

    @property
    def leaving_out(self) -> bool:
        """Whether pieces drawn before may be left out now (`dropped`): an exclusion in force, or a unit drawn in an
        earlier pipeline era."""
        return self.excluding or self.pruning

    def set_era(self, era: int) -> None:
        """The next pieces are drawn in pipeline era `era`: each reader decides with its keep and repeat."""
        if era != self.era:
            self.era = era
            for reader in self.readers:
                reader.set_era(era)
            self._has_document = [None] * len(self.readers)  # a window's trained slots changed

    def dropped(self, source: int, file: str, row: int) -> bool:
        """Whether the document's pieces are left out now (the exclusion is in force and lists it, or it was drawn in
        an earlier pipeline era and this era's keep drops it)."""
        if self.pruning and not self.readers[source].keeps(file, row):
            return True
        exclusion = self.spec.exclusion
        if not self.excluding or exclusion is None:
            return False
        return exclusion.excludes(source, file, row) or (file, row) in self.readers[source].listed_by_text

    def _watch_barren(self, s: int, cursor: SourceCursor, n: int) -> None:
        """Count the windows of source s read whole while its documents place nothing (met_barren's guard)."""
        if n >= self.placeable:
            if self._barren_since[s] is not None or self.readers[s].barren:
                self._barren_since[s] = None
                self.readers[s].barren.clear()
                self.readers[s].barren_streak = 0
            return
        since = self._barren_since[s]
        if since is None:
            since = self._barren_since[s] = (cursor.window, cursor.position)
        window = self.readers[s].window(cursor.window)
        if window is not None and cursor.position == len(window) - 1 and (since[0] != cursor.window or since[1] == 0):
            self.readers[s].met_barren(cursor.window)  # the whole window, from its first document, placed nothing

    def _count(self, s: int, cursor: SourceCursor, tokens: np.ndarray, excluded: bool, too_long: bool) -> None:
        """Count the document slot at the cursor, met at its start (document_counts.py)."""
        reader = self.readers[s]
        copy, stage = reader.fate(cursor, tokens is DROPPED)
        at = s * PER_SOURCE
        chat = reader.chat
        if copy == 0:
            self.counted[at + READ] += 1
            if stage >= 0:
                self.counted[at + stage] += 1
            elif tokens is REFUSED:
                self.counted[at + DROPPED_BY_MASK] += 1
            elif excluded:
                self.counted[at + EXCLUDED] += 1
            elif too_long and chat is not None:
                self.counted[at + (TRUNCATED if chat.too_long == "truncate" else DROPPED_TOO_LONG)] += 1
        elif tokens is not DROPPED and tokens is not REFUSED and not excluded:
            if not (too_long and chat is not None and chat.too_long == "drop"):
                self.counted[at + REPEATED] += 1

    def _taken(self, s: int, doc: Document, start: int, stop: int) -> int:
        """What the piece tokens[start:stop] counts for toward its source's share: its tokens, or under mix_by =
        "targets" a chat source's trained targets in it (its tokens after the first not carrying chat.MASKED)."""
        if not self._by_targets[s]:
            return stop - start
        return int(np.count_nonzero((doc.tokens[start + 1 : stop + 1] & MASKED) == 0))

    def _too_long(self, s: int, doc: Document) -> bool:
        """Whether a chat source's conversation is longer than a row (its (input, label) pairs past the piece size,
        which is the row's: chat sources take whole documents); too_long = "error" stops here."""
        chat = self.readers[s].chat
        if chat is None or doc.tokens is DROPPED or doc.tokens is REFUSED or len(doc.tokens) - 1 <= self.chunk:
            return False
        if chat.too_long == "error":
            raise DataError(
                f"{doc.file} {self.readers[s].source.row_unit} {doc.row} (source {self.spec.source_names[s]!r}): the "
                f"conversation is {len(doc.tokens):,} tokens, longer than a row of {self.chunk:,}; set too_long = "
                '"drop" or "truncate", or a longer seq_len'
            )
        return True

    def next_document(self) -> Document | None:
        """The lane's next piece (at most `mix_chunk_tokens` tokens of one document, never empty),
        or None when every source with a weight in the current segment is exhausted."""
        self._run_source = -1
        while True:
            # Keep normalized cursors so no finished window is ever read again; only a cursor that moved to
            # another document since is normalized again. In place: a list made per document would live until
            # the lane's next row, and at thousands of lanes objects that live that long make the garbage
            # collector run full collections (issue 28).
            has = self._has_document
            for i, (reader, weight) in enumerate(zip(self.readers, self.weights)):
                if weight > 0 and has[i] is None:
                    self.cursors[i], has[i] = reader.normalize(self.cursors[i])
            active = [weight > 0 and bool(h) for weight, h in zip(self.weights, has)]
            taken = [c.tokens - base for c, base in zip(self.cursors, self.mix.bases)]
            s = choose_source(self.weights, taken, active, self.phases, self.chunk)
            if s < 0:
                return None
            cursor = self.cursors[s]
            doc = self.readers[s].document(cursor)
            too_long = self._too_long(s, doc)
            if too_long and self.readers[s].chat.too_long == "truncate":  # type: ignore[union-attr]
                doc = Document(doc.source, doc.tokens[: self.chunk + 1], doc.file, doc.row, 0, self.chunk + 1)
            n = len(doc.tokens)
            if cursor.offset > n and doc.tokens is not DROPPED:  # (the rest of a document a new keep drops: skipped)
                raise DataError(
                    f"{doc.file} {self.readers[s].source.row_unit} {doc.row}: the lane's state is {cursor.offset} "
                    f"tokens into this document, which has {n}; was the data changed?"
                )
            excluded = doc.tokens is not DROPPED and self.excluding and self.dropped(s, doc.file, doc.row)
            skipped = doc.tokens is DROPPED or doc.tokens is REFUSED or (too_long and n - 1 > self.chunk)
            dropped = excluded or skipped
            if cursor.offset == 0:
                self._count(s, cursor, doc.tokens, excluded, too_long)
            self._watch_barren(s, cursor, 0 if dropped else n)
            if dropped:  # the document, or its rest, is skipped
                self._has_document[s] = None  # its cursor moves to the next document
                self.cursors[s] = SourceCursor(window=cursor.window, position=cursor.position + 1, tokens=cursor.tokens)
                continue
            stop = min(cursor.offset + self.chunk, n)
            done = stop == n  # the document's last piece: the cursor moves to the next document
            if done:
                self._has_document[s] = None
            self.cursors[s] = SourceCursor(
                window=cursor.window,
                position=cursor.position + done,
                tokens=cursor.tokens + self._taken(s, doc, cursor.offset, stop),
                offset=0 if done else stop,
            )
            if n:  # an empty text without BOS/EOS has nothing to emit
                if done and cursor.offset == 0:
                    self._run_source = s
                return Document(doc.source, doc.tokens, doc.file, doc.row, cursor.offset, stop)

    def following(self, slots: int, pairs: bool) -> Run | None:
        """The whole documents next_document would return next, one call after it returned a whole document, until
        they hold `slots` slots (a document of n tokens is n - 1 slots with `pairs`, else n) or the run ends, with the
        feed's state before the last of them; None: no document.

        The same pieces and the same state, drawn without next_document's general bookkeeping (issue 47: on short
        documents that bookkeeping, not the tokenizer, was most of a lane's time): the run goes on only while
        nothing can differ from it, i.e. documents of the same source, each one whole piece (no longer than the
        piece size, enough tokens to place), in the reader's batch already tokenized, no document left out
        (exclusions, pruning, dropped slots), no chat source, and the mixer choosing that source again by its own
        rule (the same float expressions). Anything else ends the run; next_document takes it from there."""
        s = self._run_source
        self._run_source = -1
        if s < 0 or self.leaving_out or self._by_targets[s]:
            return None
        reader = self.readers[s]
        if reader.chat is not None or self._barren_since[s] is not None or reader.barren:
            return None
        cursor = self.cursors[s]
        found = reader.batch_at(cursor)
        if found is None:
            return None
        window, first, (_, tokens, files, rows) = found
        # The mixer takes source s again while its due is below every other active source's (ties: the lower
        # index), exactly as choose_source compares them; only s's tokens move during the run.
        chunk, weights, bases, phases, has = self.chunk, self.weights, self.mix.bases, self.phases, self._has_document
        below, at_most = float("inf"), float("inf")  # s must be below the earlier sources, at most the later ones
        for r, (c, weight) in enumerate(zip(self.cursors, weights)):
            if r != s and weight > 0 and has[r]:
                due = (c.tokens - bases[r] + phases[r] * chunk) / weight
                if r < s:
                    below = min(below, due)
                else:
                    at_most = min(at_most, due)
        weight, base, lead = weights[s], bases[s], phases[s] * chunk
        placeable, least = self.placeable, 1 if pairs else 0
        copies, order, documents = window.copies, window.order, window.documents
        counted, at = self.counted, s * PER_SOURCE
        position, taken = cursor.position, cursor.tokens
        got, last, i = 0, (position, taken), first
        while got < slots and i < len(tokens):
            ids = tokens[i]
            if ids is DROPPED:
                break
            n = len(ids)
            if n < placeable or n > chunk:
                break
            due = (taken - base + lead) / weight
            if not (due < below and due <= at_most):
                break
            if copies == 1 or order[position] // documents == 0:
                counted[at + READ] += 1
            else:
                counted[at + REPEATED] += 1
            last = (position, taken)
            position, taken, got, i = position + 1, taken + n, got + n - least, i + 1
        if i == first:
            return None
        self.cursors[s] = SourceCursor(window=cursor.window, position=position, tokens=taken)
        before = list(self.cursors)
        before[s] = SourceCursor(window=cursor.window, position=last[0], tokens=last[1])
        return Run(s, tokens[first:i], files[first:i], rows[first:i], self.state(tuple(before)))


class Run(NamedTuple):
    """Whole documents of one source that follow one another (DocumentFeed.following): each one's tokens, file and
    row, as tuples (no object per document: on short documents those were a tenth of a lane's time)."""

    source: int
    tokens: tuple[np.ndarray, ...]
    files: tuple[str, ...]
    rows: tuple[int, ...]
    before_last: FeedState
    """The feed's state before the last document (a packer's open unit when that one is not placed whole)."""


def _replay_phases(replay: Replay, lane_id: int, num_lanes: int) -> tuple[float, ...]:
    """The lane's mixing phases as they were when its open unit was drawn, for this run's sources; an
    added source gets 0 (it had no weight then, so it is never drawn in the replay)."""
    then = lane_phases(["_"] * replay.num_sources, lane_id, num_lanes)  # phi depends on the index and S only
    return tuple(then[i] if i >= 0 else 0.0 for i in replay.indices)
