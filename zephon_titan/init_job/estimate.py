"""How many documents and tokens `zephon-titan init` finds in a text source: documents spread over each sampled
file, read as the trainer reads them (the source's own blocks), and tokenized with the job's tokenizer.

The first documents of a file are no sample of it: an ordered file (short documents first, long ones last, as in
a code benchmark) gave an estimate 30 % low, and so weights that do not make the sources run out together (issue
46). So each sampled file is opened as a source of its own, cut into small blocks (JSONL byte ranges of
SAMPLE_BLOCK_BYTES, Lance blocks of SAMPLE_BLOCK_ROWS rows, Parquet row groups), and a seeded, stratified sample of
its blocks is read: one block from each of k equal stretches of the file, k from the file's byte budget. A file
within its budget is read whole, every document tokenized: its counts are exact (as `validate` counts them).
A block's documents are all tokenized, or (a block much larger than its budget: a big Parquet row group) a seeded
sample of them. A file's counts are the sampled blocks' sums divided by the share of the file those blocks are
(by rows where the format knows them, else by bytes).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from zephon_titan.config import SourceConfig
from zephon_titan.engine.sources import open_source
from zephon_titan.engine.sources.base import FileBlocks, Source
from zephon_titan.engine.sources.storage import FileStat
from zephon_titan.engine.tokenize import DocumentProblem

SOURCE_BUDGET_BYTES = 16 << 20  # bytes of a source's files read (and tokenized) at most, spread over its samples
FILE_BUDGET_BYTES = 2 << 20  # ... and at least this many per sampled file: smaller files are counted whole
SAMPLE_BLOCK_BYTES = 64 << 10  # JSONL byte ranges read for the sample (many small ones: spread over the file)
SAMPLE_BLOCK_ROWS = 64  # Lance rows per sampled block


@dataclass
class Count:
    """A file's documents, tokens and characters, counted whole (exact) or estimated from `tokenized` of them."""

    documents: float = 0.0
    tokens: float = 0.0
    characters: float = 0.0
    tokenized: int = 0  # documents tokenized
    exact: bool = True

    def add(self, other: Count) -> None:
        self.documents += other.documents
        self.tokens += other.tokens
        self.characters += other.characters
        self.tokenized += other.tokenized
        self.exact = self.exact and other.exact


def file_budget(files: int) -> int:
    """The bytes read of each of a source's `files` sampled files."""
    return max(FILE_BUDGET_BYTES, SOURCE_BUDGET_BYTES // max(1, files))


def count_file(
    file: FileStat, name: str, format_: str, text_field: str, tokenizer, budget: int, seed: int = 0
) -> Count:
    """One file (or Lance dataset): whole if within `budget` bytes, else a stratified sample of its blocks."""
    config = SourceConfig(
        name=name,
        paths=[file.path],
        format=format_,
        text_field=text_field,
        block_bytes=SAMPLE_BLOCK_BYTES,
        block_rows=SAMPLE_BLOCK_ROWS,
    )
    source = open_source(config, use_index=False)
    shares, sizes = block_shares(source)
    if not shares:
        return Count()
    rng = random.Random(f"{seed}:{file.path}")
    whole = file.size <= budget
    chosen = range(len(shares)) if whole else stratified(len(shares), _blocks_in(budget, sizes), rng)
    per_block = budget / max(1, len(chosen))
    found = Count()
    for block in chosen:
        found.add(_count_block(source, block, tokenizer, per_block / max(1, sizes[block]), rng))
    covered = sum(shares[b] for b in chosen)
    if not whole and covered < 1:
        scale = 1 / max(covered, 1e-12)
        found.documents, found.tokens, found.characters = (
            found.documents * scale,
            found.tokens * scale,
            found.characters * scale,
        )
        found.exact = False
    return found


def block_shares(source: Source) -> tuple[list[float], list[float]]:
    """Each block's share of the opened file (rows where known, else bytes) and its bytes, in block order."""
    files: list[FileBlocks] = source.files
    total = sum(f.size for f in files) or 1
    shares: list[float] = []
    sizes: list[float] = []
    step = getattr(source, "block_bytes", 0)
    weights = getattr(source, "block_weights", None)  # a format whose block_rows are not rows per block says them
    for f in files:
        part = f.size / total if total else 1 / len(files)
        if weights is not None:
            rows = weights(f)
            within = [r / (sum(rows) or 1) for r in rows]
        elif f.block_rows:
            rows = sum(f.block_rows) or 1
            within = [r / rows for r in f.block_rows]
        elif step and f.num_blocks > 1:
            within = [(min((b + 1) * step, f.size) - b * step) / f.size for b in range(f.num_blocks)]
        else:
            within = [1 / f.num_blocks] * f.num_blocks if f.num_blocks else []
        shares += [part * w for w in within]
        sizes += [f.size * w for w in within]
    return shares, sizes


def _blocks_in(budget: int, sizes: Sequence[float]) -> int:
    """How many blocks of these sizes a budget reads (at least one, at most all)."""
    mean = sum(sizes) / max(1, len(sizes))
    return max(1, min(len(sizes), math.floor(budget / max(mean, 1))))


def stratified(n: int, k: int, rng: random.Random) -> list[int]:
    """k of the indices 0..n-1: one drawn from each of k equal stretches (every part of the file has its say)."""
    return [rng.randrange(i * n // k, max((i + 1) * n // k, i * n // k + 1)) for i in range(k)]


def _count_block(source: Source, block: int, tokenizer, fraction: float, rng: random.Random) -> Count:
    """A block's documents, and its tokens and characters: all of its documents tokenized, or a seeded sample
    of about `fraction` of them (scaled up) where the block is bigger than its share of the budget."""
    documents = source.read_block(block)
    texts = documents.texts
    n = len(texts)
    if n == 0:
        return Count()
    take = n if fraction >= 1 else max(1, round(n * fraction))
    picked = range(n) if take == n else sorted(rng.sample(range(n), take))
    strings = [texts[i] for i in picked]
    try:
        ids = tokenizer.encode(strings)
    except DocumentProblem as e:  # named as the run would name it
        rows = [documents.rows[i] for i, text in zip(picked, strings) if isinstance(text, str)]
        raise e.at(documents.file, source.row_unit, rows[e.index], source.name) from None
    scale = n / take
    return Count(
        documents=n,
        tokens=sum(len(i) for i in ids) * scale,
        characters=sum(len(s) for s in strings if isinstance(s, str)) * scale,
        tokenized=take,
        exact=take == n,
    )
