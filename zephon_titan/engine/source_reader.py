"""What one lane reads of one source: its shuffle windows (shuffle_windows.py) read, ahead where that hides
latency, their slots' documents read in batches and tokenized, the cursor moved past windows that hold none.

Skipping. A slot its pass does not train (keep and repeat: shuffle_windows.py) is skipped where it is read; so,
from `exclude_from_step` on (the lane says when: `excluding`), is a listed document, the rest of it too if it was
partly read (exclusion.py). The other documents keep their order.
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import accumulate

import numpy as np

from zephon_titan.engine import chat
from zephon_titan.engine.chat import ChatSetup
from zephon_titan.engine.encode_calls import (
    _NO_BATCH,
    FIRST_TOKENIZE_BATCH,
    TOKENIZE_BATCH,
    EncodeBatcher,
    _Batch,
    _batch_of,
    _index_in,
    _live_readers,
    _Text,
    tokenize_batch_chars,
)
from zephon_titan.engine.exclusion import text_sha256
from zephon_titan.engine.pipeline import DROPPED
from zephon_titan.engine.shuffle_windows import LaneWindows, Window
from zephon_titan.engine.sources.base import Source, file_blocks
from zephon_titan.engine.sources.block_documents import BlockDocuments
from zephon_titan.engine.spec import EngineSpec
from zephon_titan.engine.state import SourceCursor
from zephon_titan.engine.tokenize import DocumentProblem, check_encodable
from zephon_titan.errors import DataError, ResumeError

# A lane that meets only blocks without a document (a file's tail block often holds no line start) reads on
# until it finds one. The source holds none when every one of its B blocks was met empty (exact), or when the
# lane met MAX_EMPTY_STREAK x B of its blocks in a row without one: with even one block of B holding a document
# that happens with probability below (1 - 1/B)^(100 B) < e^-100 (block orders are keyed shuffles), and
# unshuffled it means the lane's share of the blocks holds none. Counted in the lane's own blocks: with
# thousands of lanes and a few blocks, one lane's window may well be 4 empty blocks (issue 28).
MAX_EMPTY_STREAK = 100
# Sources in object storage: while a lane tokenizes window w, the blocks of window w+1 are
# fetched by background threads (all of a window's blocks at once), hiding request latency.
# Rows are unchanged (blocks are pure functions of the files); memory grows by one window.
READ_AHEAD_REMOTE = True
READ_THREADS = 8
_read_pool: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _read_pool
    if _read_pool is None:
        _read_pool = ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="zephon-read")
    return _read_pool


def _forget_pool() -> None:
    global _read_pool
    _read_pool = None  # a forked child has none of the parent's threads: a new pool, if it needs one


os.register_at_fork(after_in_child=_forget_pool)


@dataclass(frozen=True, slots=True)
class Document:
    """A piece of a document: tokens[start:stop] of the whole document's `tokens` (mixing.py)."""

    source: int
    tokens: np.ndarray
    file: str
    row: int
    start: int
    stop: int


class LaneSourceReader:
    """The documents one lane reads from one source, in order."""

    def __init__(self, spec: EngineSpec, source_index: int, lane_id: int, batcher: EncodeBatcher | None = None):
        self.spec = spec
        self.source = spec.sources[source_index]
        self.source_index = source_index
        self.lane_id = lane_id
        self.windows = LaneWindows(spec, source_index, lane_id)
        """Which blocks and slots the lane meets in each window (shuffle_windows.py)."""
        self._window: Window | None = None
        self.era = 0
        """The pipeline era of the documents the reader reads now (set_era)."""
        self._current: _Batch = _NO_BATCH
        self._batch = FIRST_TOKENIZE_BATCH
        self._ahead_batch: _Batch | None = None
        """The next batch's tokens and (file, row), when it was encoded with another reader's batch."""
        self.batcher = batcher if batcher is not None else EncodeBatcher()
        self.queued = False
        self.ref = weakref.ref(self)  # one for the reader's life (EncodeBatcher): not one object per batch
        self._read_ahead = READ_AHEAD_REMOTE and self.source.remote
        self._ahead: tuple[int, list[Future[BlockDocuments]]] | None = None
        self._texts = spec.exclusion.texts if spec.exclusion is not None else frozenset()
        self.listed_by_text: set[tuple[str, int]] = set()
        """(file, row) of the documents read so far whose text's SHA-256 is on the exclusion list."""
        self.barren: set[int] = set()
        """Blocks the lane met whole since this source last gave it a token it can place (a guard only)."""
        self.barren_streak = 0
        """And how many of the lane's blocks that was (a block met again counts again)."""
        _live_readers.add(self)

    def window(self, w: int) -> Window | None:
        """Window w of this lane (None if it has no block: the source is exhausted)."""
        if self._window is not None and self._window.index == w:
            return self._window
        self._current, self._ahead_batch = _NO_BATCH, None
        self._window = None
        blocks = self._read_window_blocks(w)
        if blocks is None:
            return None
        self._window = self.windows.window(w, blocks, self.era)
        if self._read_ahead:
            self._ahead = (w + 1, self._fetch(w + 1))
        return self._window

    @property
    def chat(self) -> ChatSetup | None:
        """The source's chat setup in the reader's era (None: not a chat source)."""
        return self.source.era_chats[self.era] if self.source.era_chats else self.source.chat

    def set_era(self, era: int) -> None:
        """The pipeline era of the next documents (engine/pipeline.py): the open window's counts are those of the
        era, and documents read ahead under another are read again."""
        if era == self.era:
            return
        self.era = era
        window = self._window
        if window is not None and window.counts is not None:
            counts = self.windows.counts(window.index, window.blocks, window.kept, era)
            self._window = dataclasses.replace(window, counts=counts)
        if window is not None:  # its texts too, where transforms change
            self._current, self._ahead_batch = _NO_BATCH, None

    def keeps(self, file: str, row: int) -> bool:
        """Whether the reader's era keeps the document at (file, row): its keep condition holds and its transforms
        do not drop it (True without either)."""
        pipeline = self.source.era_pipelines[self.era] if self.source.era_pipelines else None
        by_keep = pipeline is not None and pipeline.keep is not None
        if not by_keep and not self.source.era_transforms:
            return True
        for block in file_blocks(self.source, file):
            if len(block.rows) and block.rows[0] <= row <= block.rows[-1]:
                i = bisect.bisect_left(block.rows, row)
                if i < len(block.rows) and block.rows[i] == row:
                    if by_keep and not block.eras[self.era][0][i]:
                        return False
                    return not block.era_texts or block.era_texts[self.era][i] is not DROPPED
        return True

    def _split_note(self) -> str:
        fraction = self.spec.config.sources[self.source_index].eval_fraction
        if fraction <= 0.0:
            return ""
        return f" in the {self.spec.config.split} part of its split (eval_fraction = {fraction})"

    def prefetch(self, w: int) -> None:
        """Start fetching window w in the background, unless something is ahead: remote sources, and the
        first windows of sources that decode without the GIL (Parquet: the first step waits for their row
        groups, read in parallel threads and once per process; the memory is that of the blocks the first
        step reads anyway)."""
        if (self._read_ahead or self.source.decodes_in_threads) and self._ahead is None:
            self._ahead = (w, self._fetch(w))

    def _fetch(self, w: int) -> list[Future[BlockDocuments]]:
        """Start reading window w's blocks in the background."""
        return [self.source.read_block_soon(b, _pool()) for b in self.windows.window_block_ids(w)]

    def _read_window_blocks(self, w: int) -> list[BlockDocuments] | None:
        """The documents of each block of window w (None if it has none), read ahead or now."""
        if self._ahead is not None and self._ahead[0] == w:
            futures, self._ahead = self._ahead[1], None
            blocks = [f.result() for f in futures]  # a read error surfaces here, where the data is needed
        elif self._read_ahead:
            blocks = [f.result() for f in self._fetch(w)]  # all of the window's requests at once
        else:
            blocks = [self.source.read_block(b) for b in self.windows.window_block_ids(w)]
        return blocks or None

    def normalize(self, cursor: SourceCursor) -> tuple[SourceCursor, bool]:
        """The cursor moved past finished windows, and whether a document is there
        (False: the source is exhausted for this lane)."""
        w, p = cursor.window, cursor.position
        empty_blocks: set[int] = set()  # the distinct blocks of the empty windows met in a row
        streak = 0  # and how many of the lane's blocks they were
        while True:
            window = self.window(w)
            if window is not None and p > len(window):  # a run only ever moves a cursor to a window's end
                raise ResumeError(
                    f"lane {self.lane_id}, source {self.source.name!r}: the restored cursor stands at document {p} of "
                    f"window {w}, which holds {len(window)}; the checkpoint does not belong to these files (or was "
                    "edited): resume with the data it was saved with, or from another checkpoint"
                )
            if window is None or p < len(window):
                moved = cursor if w == cursor.window else SourceCursor(window=w, position=p, tokens=cursor.tokens)
                return moved, window is not None
            if not len(window):
                ids = self.windows.window_block_ids(w)
                empty_blocks.update(ids)
                streak += len(ids)
                num_blocks = self.source.num_blocks
                if len(empty_blocks) == num_blocks or streak > MAX_EMPTY_STREAK * num_blocks:
                    met = f"all {num_blocks}" if len(empty_blocks) == num_blocks else f"{streak} in a row"
                    raise DataError(
                        f"source {self.source.name!r}: lane {self.lane_id} found no document in its blocks ({met} of "
                        f"the source's {num_blocks} met empty); its files hold (almost) no non-empty "
                        f"lines/rows in field {self.source.text_field!r}{self._split_note()}"
                    )
                self.met_barren(w)  # beside windows of documents without a token (DocumentFeed._watch_barren)
            w, p = w + 1, 0

    def met_barren(self, w: int) -> None:
        """Window w was read whole without a document that gives the lane a token it can place (empty texts
        without BOS/EOS, one-token documents under labels = "document", excluded ones). An endless run raises once
        every block of the source was met so, or MAX_EMPTY_STREAK x B of the lane's blocks in a row (unshuffled, a
        lane meets only its share of the blocks): the lane would read on forever. Only a guard: rows never depend
        on it."""
        if not self.spec.repeat:
            return  # a finite source ends by itself
        ids = self.windows.window_block_ids(w)
        self.barren.update(ids)
        self.barren_streak += len(ids)
        num_blocks = self.source.num_blocks
        if len(self.barren) == num_blocks or self.barren_streak > MAX_EMPTY_STREAK * num_blocks:
            met = (
                f"all {num_blocks} of its blocks"
                if len(self.barren) == num_blocks
                else f"{self.barren_streak} of its {num_blocks} blocks in a row"
            )
            raise DataError(
                f"source {self.source.name!r}: lane {self.lane_id} met {met} "
                "without a document that gives a row a token (every text empty, one token long under labels = "
                f'"document", excluded, left out by its keep or repeat, or a conversation longer than a row or whose '
                f"mask cannot be exact){self._split_note()}; check field "
                f"{self.source.text_field!r}, the add_bos/add_eos settings and its keep and repeat, or give this "
                "source weight 0"
            )

    def document(self, cursor: SourceCursor) -> Document:
        """The document at a normalized cursor."""
        window = self.window(cursor.window)
        assert window is not None, "document() needs a normalized cursor"  # normalize() checked it has a window
        p = cursor.position
        i = _index_in(self._current, p)
        if i < 0:
            ahead, self._ahead_batch = self._ahead_batch, None
            if ahead is not None and _index_in(ahead, p) >= 0:
                self._current = ahead  # encoded with another reader's batch
            else:
                self._current = _NO_BATCH  # the previous batch is consumed: let it go
                self._current = self._encode_batch(window, p)
            if self._batch >= 4 * FIRST_TOKENIZE_BATCH and self.batch_end < len(window) and self.source.chat is None:
                # Its next batch may join another reader's encode call; not the first two (a lane's first rows
                # wait for its first documents only).
                self.batcher.wants(self)
            i = _index_in(self._current, p)
        _, tokens, files, rows = self._current
        return Document(self.source_index, tokens[i], files[i], rows[i], 0, len(tokens[i]))

    def batch_at(self, cursor: SourceCursor) -> tuple[Window, int, _Batch] | None:
        """The open window, the batch of documents already read and tokenized that holds the one at the cursor,
        and its index there; None when that batch is not the current one (DocumentFeed.following)."""
        window, batch = self._window, self._current
        i = _index_in(batch, cursor.position)
        if window is None or window.index != cursor.window or i < 0:
            return None
        return window, i, batch

    def fate(self, cursor: SourceCursor, dropped: bool) -> tuple[int, int]:
        """The copy of the slot at a normalized cursor and, for a dropped first copy, the stage that dropped it."""
        window = self.window(cursor.window)
        assert window is not None, "fate() needs a normalized cursor"
        return window.fate(cursor.position, dropped, self.era)

    @property
    def batch_end(self) -> int:
        """The window position after the current batch's last document."""
        start, tokens, _, _ = self._current
        return start + len(tokens)

    def _read_batch(self, window: Window, p: int) -> list[_Text]:
        """The window's next documents from position p: up to the batch size, and up to the characters a
        reader tokenizes at a time."""
        stop = min(p + self._batch, len(window))
        self._batch = min(2 * self._batch, TOKENIZE_BATCH)
        docs: list[_Text] = []
        chars, most = 0, tokenize_batch_chars()
        # The batch ends at the document that reaches `most` characters; documents are read a few at a time (each
        # block's in one call), as many as the characters per document so far say fit, so at most a few are read
        # past that end and dropped.
        i = p
        while i < stop and chars < most:
            fit = (most - chars) * len(docs) // chars if chars else 1
            slots = [window.order[q] for q in range(i, min(stop, i + max(1, fit)))]
            every = window.counts is None  # no keep or repeat: every slot is trained
            trained = slots if every else [slot for slot in slots if window.trained(slot)]
            try:
                texts = iter(window.read_documents(trained, self.era))
            except DataError:  # the first bad document in window order raises, as one by one
                texts = iter([window.document(slot, self.era) for slot in trained])
            for slot in slots:
                docs.append(next(texts) if every or window.trained(slot) else (DROPPED, "", -1))
                chars += len(docs[-1][0])
                i += 1
                if chars >= most:
                    break
        for item, file, row in docs:  # a listed text is noted when read (a set: reading ahead changes nothing)
            if isinstance(item, str) and self._texts and text_sha256(item) in self._texts:
                self.listed_by_text.add((file, row))
        return docs

    def next_batch_texts(self) -> tuple[int, list[_Text]] | None:
        """The batch after the current one (its first window position, its texts), read now for another
        reader's encode call; None
        when there is none to read ahead (the window's end, or a document that is not text, or one that
        cannot be read: its error comes when the lane reaches it)."""
        window = self._window
        if window is None or self._ahead_batch is not None or not self._current[1] or self.batch_end >= len(window):
            return None
        start = self.batch_end
        try:
            docs = self._read_batch(window, start)
        except Exception:  # read again, and raised, when the lane reaches that document
            return None
        return (start, docs) if all(_textual(item) for item, _, _ in docs) else None

    def take_ahead(self, start: int, docs: list[_Text], encoded: list[np.ndarray]) -> None:
        """Keep the next batch (documents from window position `start`), encoded in another reader's call."""
        self._ahead_batch = _batch_of(start, docs, encoded)

    def _encode_batch(self, window: Window, p: int) -> _Batch:
        """Read and encode the batch from position p, with the next batches of readers about to need theirs."""
        docs = self._read_batch(window, p)
        for item, file, row in docs:
            if not isinstance(item, str) and item is not DROPPED:
                check_token_ids(self.source, item, file, row, self.spec.tokenizer.vocab_size)
        shared = self.source.chat is None and all(_textual(d[0]) for d in docs)  # conversations encode apart
        others = self.batcher.join(self, docs) if shared else []
        texts = [item for item, _, _ in docs] + [item for _, _, more in others for item, _, _ in more]
        groups = [len(docs), *(len(more) for _, _, more in others)] if others else []
        try:
            encoded = self._encode(texts, groups)
        except DocumentProblem as e:  # the e.index-th text of the batch, not counting dropped slots
            if e.index < sum(item is not DROPPED for item, _, _ in docs) or not others:  # one of this reader's
                raise self._mismatch(e, docs) from None
            encoded = self._encode([item for item, _, _ in docs])
            others = []  # the other readers meet their document when it is due
        at = len(docs)
        for reader, start, more in others:  # each reader's documents in a buffer of its own (groups)
            reader.take_ahead(start, more, encoded[at : at + len(more)])
            at += len(more)
        return _batch_of(p, docs, encoded[: len(docs)])

    def _encode(self, items: list[str | np.ndarray], groups: list[int] | None = None) -> list[np.ndarray]:
        """Each document's ids; a dropped slot stays DROPPED (never encoded). A chat source's conversations carry
        their masks (chat.py), REFUSED where a mask cannot be exact. `groups`: how many of the items, in order,
        belong to each reader of a shared call (each reader's ids in a buffer of its own: a shared buffer would live
        while the slowest of them holds a document, tens of times the tokens held ahead at thousands of lanes)."""
        if self.source.chat is not None:
            tokenizer = self.spec.tokenizer
            conversations = [i for i in items if i is not DROPPED]
            try:
                ids = iter(chat.encode(tokenizer.tokenizer, conversations, tokenizer.bos_id, tokenizer.eos_id))  # type: ignore[arg-type]
            except Exception:
                check_encodable(conversations)  # type: ignore[arg-type]  # the one that is no Unicode text, named
                raise
            return [DROPPED if item is DROPPED else next(ids) for item in items]
        cuts = [0, *accumulate(groups or [])]
        strings = [sum(item is not DROPPED for item in items[a:b]) for a, b in zip(cuts, cuts[1:])]
        if not any(item is DROPPED for item in items):
            return self.spec.tokenizer.encode(items, self.source.specials_in_tokens, strings)
        encoded = iter(
            self.spec.tokenizer.encode([i for i in items if i is not DROPPED], self.source.specials_in_tokens, strings)
        )
        return [DROPPED if item is DROPPED else next(encoded) for item in items]

    def _mismatch(self, e: DocumentProblem, docs: list[_Text]) -> DataError:
        _, file, row = [doc for doc in docs if isinstance(doc[0], str)][e.index]
        return e.at(file, self.source.row_unit, row, self.source.name)


def _textual(item: str | np.ndarray) -> bool:
    """A text to encode, or a dropped slot (which another reader's encode call may carry along)."""
    return isinstance(item, str) or item is DROPPED


def check_token_ids(source: Source, ids: np.ndarray, file: str, row: int, vocab: int) -> None:
    """A pre-tokenized document's ids must be in the vocabulary (the lanes check each; so does `validate`)."""
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
        raise DataError(
            f"{file} {source.row_unit} {row}: token id {bad} is outside the tokenizer's vocabulary of {vocab}; "
            f"source {source.name!r} must be pre-tokenized with this run's tokenizer"
        )
