"""Memory for the arrays that outlive many documents: token batches and rows.

A process running thousands of lanes holds thousands of such arrays at once, each tens of KB (a reader's batch of
tokens, a lane's rows made ahead), and frees them in an order unrelated to the one they were made in. In glibc's
heap they leave holes between live blocks, and every later medium-sized malloc (a document's JSON text growing by
realloc, a bytes object per line) searches longer lists of free chunks: one rank with 1,024 lanes spent 1.5 s of
16 s in `_int_malloc` against 0.24 s with 8 lanes for the same rows (issue 28, docs/performance.md). These
arrays come from an Arrow memory pool instead, which keeps blocks of one size class together, and glibc's heap is
left to the short-lived objects. Only where bytes live changes, never their values.

The pool is Arrow's jemalloc where the wheel has it, else Arrow's default (mimalloc); `ARROW_DEFAULT_MEMORY_POOL`,
when set, chooses. Arrow's mimalloc hands freed pages back to the system after 10 ms, so each token batch of
long documents (megabytes, freed as the next one is made) faulted its pages in anew: 4 MB cost ~2.5-5 ms to
allocate against ~0.24 ms from jemalloc, and the loader spent over half its CPU there on long documents
(benchmarks/document_cost.py: 4.6 M tokens per CPU-second with mimalloc, 25 M with jemalloc; docs/performance.md).
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa


def _pool() -> pa.MemoryPool:
    if not os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        try:
            return pa.jemalloc_memory_pool()
        except NotImplementedError:  # a pyarrow built without jemalloc (not the Linux wheels)
            pass
    return pa.default_memory_pool()


POOL = _pool()


def lasting_array(length: int, dtype: np.dtype) -> np.ndarray:
    """An uninitialized, writable 1-D array of `length` items in a buffer of its own from the pool above (64-byte
    aligned), freed when the last array viewing it is."""
    return np.frombuffer(pa.allocate_buffer(length * dtype.itemsize, memory_pool=POOL), dtype=dtype, count=length)
