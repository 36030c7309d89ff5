"""A lane's shuffle windows of one source: which of its blocks the lane is dealt, and each window's slots in a
keyed order.

Dealing. Source s has B blocks. Its infinite block sequence is epoch 0's blocks in
a shuffled order, then epoch 1's in a fresh order, and so on; position j of that
sequence is block perm_e[j mod B] with e = j div B. Lane l takes positions
l, l + L, l + 2L, ... (L lanes), so every epoch's blocks are dealt to the lanes
exactly once, and a source with fewer blocks than lanes still feeds every lane
(in later epochs). Under `redistribute` only epoch 0 exists.

Shuffling. A lane's blocks of a source are grouped into windows of K consecutive
blocks (K = shuffle_window_blocks); the documents of a window are read together
and taken in a keyed shuffled order, so documents of different files interleave.
Everything is a pure function of (seed, source, epoch or lane and window, index).

Splitting. A source with an eval_fraction has its held-out documents removed from each
block before the window is shuffled (split.py); the validator's loader keeps only them.

Keeping and repeating. A source with `keep` or `repeat` (pipeline.py) has `copies` slots per document in each
window, copy c of document d at slot c * n + d (n documents in the window): the window's first n positions are
first copies in the window's shuffled order, the next n second copies in another order (CopyMajor); a slot its
pass does not train is skipped where it is read, so the documents kept keep their order.

Which block and which document a lane meets where is a pure function of (seed, source, lane, window, index) and
of the pipeline's decisions, never of how or when the blocks are read: that is source_reader.py's (reading
ahead, batches, tokenizing), so this bookkeeping stands apart from it.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate

import numpy as np

from zephon_titan.engine.document_counts import DROPPED_BY_KEEP, DROPPED_BY_REPEAT, DROPPED_BY_TRANSFORM
from zephon_titan.engine.shuffle import Permutation, derive_key
from zephon_titan.engine.sources.block_documents import BlockDocuments, LazyTexts
from zephon_titan.engine.spec import EngineSpec
from zephon_titan.engine.split import kept


@dataclass(frozen=True, slots=True)
class Window:
    """A lane's window of one source: its blocks' documents in this loader's part, and its slots in keyed order."""

    index: int
    blocks: list[BlockDocuments]
    kept: list[range | np.ndarray]
    """Per block, the indices of its documents in this loader's part (all of them, without a split)."""
    ends: list[int]
    """Documents of the window up to and including each block (block order). Not a list of every
    document's (block, index): a window of Parquet row groups may hold ~10^5 documents per lane."""
    order: Sequence[int] | CopyMajor
    """The window's slots in shuffled order (a whole table: a lane takes every slot of its window)."""
    counts: np.ndarray | None = None
    """With a pipeline: how many of each document's slots are trained (block order); None: one each."""
    copies: int = 1
    """Slots per document."""

    @property
    def documents(self) -> int:
        return self.ends[-1] if self.ends else 0

    def __len__(self) -> int:
        return self.documents * self.copies

    def trained(self, slot: int) -> bool:
        """Whether the slot's pass trains it (copy slot // n of document slot % n)."""
        if self.counts is None:
            return True
        copy, i = divmod(slot, self.documents)
        return bool(self.counts[i] > copy)

    def document(self, slot: int, era: int) -> tuple[str | np.ndarray, str, int]:
        """The document of a slot (its copy 0 is document `slot` in block order): its text in pipeline era `era` or
        its token ids (read or decoded now), file and row."""
        block, j = self._locate(slot % self.documents if self.copies > 1 else slot)
        texts = block.era_texts[era] if block.era_texts else block.texts
        return texts[j], block.file, block.rows[j]

    def read_documents(self, slots: list[int], era: int) -> list[tuple[str | np.ndarray, str, int]]:
        """[self.document(slot, era) for slot in slots], each block's documents read in one call (LazyTexts.many)."""
        n = self.documents
        indices = [slot % n for slot in slots] if self.copies > 1 else slots
        by_block: dict[int, list[int]] = {}  # block -> the places in `slots` of its documents
        for k, b in enumerate(np.searchsorted(self.ends, indices, side="right").tolist()):
            by_block.setdefault(b, []).append(k)
        out: list[tuple[str | np.ndarray, str, int]] = [("", "", -1)] * len(slots)
        for b, places in by_block.items():
            block, kept, first = self.blocks[b], self.kept[b], self.ends[b - 1] if b else 0
            js = [int(kept[indices[k] - first]) for k in places]
            texts = block.era_texts[era] if block.era_texts else block.texts
            read = texts.many(js) if isinstance(texts, LazyTexts) else [texts[j] for j in js]
            for k, j, text in zip(places, js, read):
                out[k] = (text, block.file, block.rows[j])
        return out

    def _locate(self, i: int) -> tuple[BlockDocuments, int]:
        """Document i of the window (block order): its block and its index there."""
        b = bisect.bisect_right(self.ends, i)
        return self.blocks[b], int(self.kept[b][i - (self.ends[b - 1] if b else 0)])

    def fate(self, position: int, dropped: bool, era: int) -> tuple[int, int]:
        """The slot at a window position, for the feed's counts (document_counts.py): its copy, and the stage
        that dropped it when it is a document's first copy and `dropped` (-1: none)."""
        if self.copies == 1 and not dropped:
            return 0, -1
        copy, d = divmod(self.order[position], self.documents)
        if not dropped or copy > 0:  # a copy not drawn, or one whose document was counted at its first copy
            return copy, -1
        if self.counts is None or self.counts[d] > 0:  # trained: its transforms dropped it
            return 0, DROPPED_BY_TRANSFORM
        block, j = self._locate(d)
        kept_by_keep = bool(block.eras[era][0][j]) if block.eras else True
        return 0, DROPPED_BY_REPEAT if kept_by_keep else DROPPED_BY_KEEP


class CopyMajor:
    """A window's slot order with copies: its first n positions are the documents' first copies in their
    shuffled order, the next n their second copies in another order, and so on (slot c * n + d: copy c of document
    d). Copy 0 is the window's order without copies, and more copies only add positions after it."""

    __slots__ = ("orders", "n")

    def __init__(self, orders: list[Sequence[int]]):
        self.orders, self.n = orders, len(orders[0])

    def __len__(self) -> int:
        return self.n * len(self.orders)

    def __getitem__(self, q: int) -> int:
        c, r = divmod(q, self.n)
        return c * self.n + self.orders[c][r]


@lru_cache(maxsize=1024)
def _block_order(seed: int, shuffle: bool, source: str, num_blocks: int, epoch: int) -> Permutation | range:
    """A source's block order in an epoch: the same for every lane, so the lanes of a process share
    it (thousands of lanes reach a source's epochs together: one permutation each, not one per lane)."""
    return Permutation(num_blocks, derive_key(seed, "blocks", source, epoch)) if shuffle else range(num_blocks)


class LaneWindows:
    """One lane's windows of one source: its k-th block, the blocks of its window w (each with its epoch), and
    window w built from their documents."""

    def __init__(self, spec: EngineSpec, source_index: int, lane_id: int):
        self.spec = spec
        self.source = spec.sources[source_index]
        self.source_index = source_index
        self.lane_id = lane_id

    def order(self, n: int, *path: object) -> Sequence[int]:
        """A keyed shuffle of range(n) as a table, or file order when `shuffle` is off."""
        return Permutation(n, derive_key(self.spec.seed, *path)).table() if self.spec.config.shuffle else range(n)

    def block_at(self, k: int) -> int | None:
        """The lane's k-th block of this source, or None past the end (non-repeating)."""
        num_blocks = self.source.num_blocks
        epoch, index = divmod(self.lane_id + k * self.spec.num_lanes, num_blocks)
        if epoch > 0 and not self.spec.repeat:
            return None
        return _block_order(self.spec.seed, self.spec.config.shuffle, self.source.name, num_blocks, epoch)[index]

    def window_blocks(self, w: int) -> list[tuple[int, int]]:
        """The blocks of window w, each with its pass over the source (its epoch)."""
        k0 = w * self.spec.config.shuffle_window_blocks
        out = []
        for k in range(k0, k0 + self.spec.config.shuffle_window_blocks):
            block = self.block_at(k)
            if block is None:
                break
            out.append((block, (self.lane_id + k * self.spec.num_lanes) // self.source.num_blocks))
        return out

    def window_block_ids(self, w: int) -> list[int]:
        return [block for block, _ in self.window_blocks(w)]

    def window(self, w: int, blocks: list[BlockDocuments], era: int) -> Window:
        """Window w from the documents of its blocks (window_blocks(w), read); its counts are pipeline era `era`'s."""
        kept = [self.split_rows(docs) for docs in blocks]
        ends = list(accumulate(len(k) for k in kept))
        counts = self.counts(w, blocks, kept, era)
        copies = self.copies if counts is not None else 1
        path = ("docs", self.source.name, self.lane_id, w)
        first = self.order(ends[-1], *path)
        order: Sequence[int] | CopyMajor = first
        if copies > 1:
            order = CopyMajor([first, *(self.order(ends[-1], *path, "copy", c) for c in range(1, copies))])
        return Window(w, blocks, kept, ends, order, counts, copies)

    @property
    def copies(self) -> int:
        """Slots per document in this loader's windows: the source's slots when training (an eval set takes each
        document it keeps once: repeat is how training samples a source)."""
        return self.source.slots if self.spec.config.split == "train" else 1

    def counts(
        self, w: int, blocks: list[BlockDocuments], kept: list[range | np.ndarray], era: int
    ) -> np.ndarray | None:
        """How many slots of each document of window w its pass trains in pipeline era `era` (block order); None
        without a pipeline in any era."""
        pipelines = self.source.era_pipelines
        if all(p is None for p in pipelines):
            return None
        pipeline = pipelines[era]
        counts = []
        for docs, k, (_, epoch) in zip(blocks, kept, self.window_blocks(w)):
            index = np.asarray(k, dtype=np.int64)
            if pipeline is None:  # none in this era: every document once
                counts.append(np.ones(len(index), dtype=np.int64))
                continue
            keep, repeat = docs.eras[era]
            if self.spec.config.split == "train":
                rows = np.asarray(docs.rows, dtype=np.int64)[index]
                count = pipeline.counts(keep[index], repeat[index], self.spec.seed, docs.file, rows, epoch)
            else:
                count = keep[index].astype(np.int64)
            counts.append(count)
        return np.concatenate(counts) if counts else np.zeros(0, dtype=np.int64)

    def split_rows(self, docs: BlockDocuments) -> range | np.ndarray:
        """Indices of the block's documents in this loader's part of the source (split.py)."""
        fraction = self.spec.config.sources[self.source_index].eval_fraction
        if fraction <= 0.0:
            return range(len(docs.texts))
        config = self.spec.config
        return np.flatnonzero(kept(config.split, config.split_seed, docs.file, docs.rows, fraction))
