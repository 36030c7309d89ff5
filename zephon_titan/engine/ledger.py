"""The batch ledger: one JSON line per optimizer step, to prove two runs saw the same data.

    {"step": 3, "sha256": "...", "rows": 16, "tokens": {"code": 610, "prose": 1454}, "padding": 0}

`sha256` is the global batch digest of engine/digest.py (over the ordered lane
digests), so it can be computed without gathering tokens, and predicted offline.
`tokens` counts the step's tokens per source (inputs and the last label of each
row: row_tokens per row), `padding` its padding tokens.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    step: int
    sha256: str
    rows: int
    tokens: dict[str, int]
    padding: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def read_ledger(path: str) -> list[LedgerEntry]:
    entries = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                entries.append(LedgerEntry(**json.loads(line)))
    return entries


class LedgerWriter:
    """Appends entries; on resume keeps only the steps up to the checkpoint's step."""

    def __init__(self, path: str, resume_step: int):
        self.path = path
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        kept = [e for e in read_ledger(path) if e.step <= resume_step] if os.path.exists(path) else []
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(e.to_json() + "\n" for e in kept)

    def write(self, entry: LedgerEntry) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(entry.to_json() + "\n")
