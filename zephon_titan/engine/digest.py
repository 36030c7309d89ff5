"""SHA-256 of a step's global batch, computable on every rank from its own lanes.

lane digest   = SHA-256(bytes of the lane's R rows of the step, in order)
batch digest  = SHA-256(lane 0 digest || lane 1 digest || ... || lane L-1 digest)

Row bytes are inputs, labels and positions as little-endian int32. Only the
32-byte lane digests need to cross ranks, never tokens.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from zephon_titan.engine.rows import Row


def lane_digest(rows: Iterable[Row]) -> bytes:
    h = hashlib.sha256()
    for row in rows:
        h.update(row.to_bytes())
    return h.digest()


def batch_digest(lane_digests: Iterable[bytes]) -> str:
    h = hashlib.sha256()
    for d in lane_digests:
        h.update(d)
    return h.hexdigest()
