"""Memory for the arrays that outlive many documents: token batches and rows.

A process running thousands of lanes holds thousands of such arrays at once, each tens of KB (a reader's batch of
tokens, a lane's rows made ahead), and frees them in an order unrelated to the one they were made in. In glibc's
heap they leave holes between live blocks, and every later medium-sized malloc (a document's JSON text growing by
realloc, a bytes object per line) searches longer lists of free chunks: one rank with 1,024 lanes spent 1.5 s of
16 s in `_int_malloc` against 0.24 s with 8 lanes for the same rows (issue 28, docs/performance.md). These
arrays come from Arrow's memory pool instead (mimalloc by default; jemalloc or the system allocator with
`ARROW_DEFAULT_MEMORY_POOL`), which keeps blocks of one size class together, and glibc's heap is left to the
short-lived objects. Only where bytes live changes, never their values.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def lasting_array(length: int, dtype: np.dtype) -> np.ndarray:
    """An uninitialized, writable 1-D array of `length` items in a buffer of its own from Arrow's memory pool
    (64-byte aligned), freed when the last array viewing it is."""
    return np.frombuffer(pa.allocate_buffer(length * dtype.itemsize), dtype=dtype, count=length)
