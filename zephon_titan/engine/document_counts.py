"""What happened to each source's documents, per row: read, repeated, and dropped by which stage.

A lane's feed counts as it reads (feed.py), and the lane hands each row the counts since its previous row
(stream.py: `Row.documents`), so a step's counts are a sum over its rows, the same for every W, worker count and
restore: a restore replays its open unit from the unit's start (the replay recounts what it reads again, and the
first row after it counts from where the replay left off, which is where the saved row left off).

Per source, in this order (COUNTS):
- read: documents whose first copy the lane passed, trained or not (each document once per pass);
- repeated: further copies trained (a repeat above 1: the second and third copies of a document);
- dropped_by_keep: documents read that the source's keep drops;
- dropped_by_repeat: documents kept but sampled out this pass (a repeat below 1, or 0);
- dropped_by_transform: documents read whose transforms return None;
- excluded: documents read that `[dataloader] exclude` leaves out (from exclude_from_step on);
- dropped_by_mask, dropped_too_long, truncated: chat sources' conversations whose loss mask cannot be exact, that
  are longer than a row under too_long = "drop", or cut to a row under too_long = "truncate" (chat.py).
A unit drawn before an exclusion or a new keep began, whose rest is left out after it, is not counted again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol


class Counted(Protocol):
    """A row, as far as counting goes (rows.py's Row)."""

    @property
    def documents(self) -> tuple[int, ...] | None: ...


COUNTS = (
    "read",
    "repeated",
    "dropped_by_keep",
    "dropped_by_repeat",
    "dropped_by_transform",
    "excluded",
    "dropped_by_mask",
    "dropped_too_long",
    "truncated",
)
(
    READ,
    REPEATED,
    DROPPED_BY_KEEP,
    DROPPED_BY_REPEAT,
    DROPPED_BY_TRANSFORM,
    EXCLUDED,
    DROPPED_BY_MASK,
    DROPPED_TOO_LONG,
    TRUNCATED,
) = range(len(COUNTS))
PER_SOURCE = len(COUNTS)


def count_documents(rows: Iterable[Counted], num_sources: int) -> list[int]:
    """The rows' counts, PER_SOURCE per source (source-major); rows made without counts add nothing."""
    total = [0] * (num_sources * PER_SOURCE)
    for row in rows:
        if row.documents is not None:
            total = [a + b for a, b in zip(total, row.documents)]
    return total


def by_source(counts: Sequence[int], names: Sequence[str]) -> dict[str, dict[str, int]]:
    """Flat counts as {source: {count name: n}} (the ledger's `documents`)."""
    return {
        name: dict(zip(COUNTS, (int(n) for n in counts[s * PER_SOURCE : (s + 1) * PER_SOURCE])))
        for s, name in enumerate(names)
    }


def document_metrics(names: Sequence[str], counts: Sequence[int], every_count: bool) -> dict[str, float]:
    """Metrics of counts since the previous log: `zephon/documents/<source>/read` for every run, and each other
    count where documents may be dropped or repeated (`every_count`: EngineSpec.counts_documents)."""
    kept = COUNTS if every_count else COUNTS[:1]
    return {
        f"zephon/documents/{name}/{count}": counts[s * PER_SOURCE + k]
        for s, name in enumerate(names)
        for k, count in enumerate(COUNTS)
        if count in kept
    }


def documents_line(names: Sequence[str], counts: Sequence[int]) -> str:
    """The counts as one log line's text: per source its documents read and, where not zero, the others."""
    parts = []
    for name, per in by_source(counts, names).items():
        others = ", ".join(f"{count.replace('_', ' ')} {n}" for count, n in per.items() if n and count != "read")
        parts.append(f"{name} read {per['read']}" + (f" ({others})" if others else ""))
    return "; ".join(parts)
