"""Token batches and rows live in an Arrow memory pool, not in the C heap (engine/buffers.py, issue 28): jemalloc's
where the wheel has it (issue 47: mimalloc faulted big batches in anew), else the one ARROW_DEFAULT_MEMORY_POOL
names."""

import os
import pickle

import numpy as np
from helpers import make_spec

from zephon_titan.engine.buffers import POOL, lasting_array
from zephon_titan.engine.rows import Piece, RowShape


def test_a_lasting_array_is_its_own_writable_memory_from_arrows_pool():
    before = POOL.bytes_allocated()
    a = lasting_array(1000, np.dtype("<i4"))
    b = lasting_array(1000, np.dtype("<i4"))
    assert POOL.bytes_allocated() - before >= 2 * 4000
    a[:] = np.arange(1000)
    b[:] = -1
    assert a.dtype == np.dtype("<i4") and a.shape == (1000,) and a.flags.writeable
    assert a.tolist() == list(range(1000)) and not np.shares_memory(a, b)
    assert pickle.loads(pickle.dumps(a[10:20], protocol=5)).tolist() == list(range(10, 20))
    del a, b
    assert POOL.bytes_allocated() <= before
    assert lasting_array(0, np.dtype("<i4")).shape == (0,)
    # Negative control: numpy's own arrays are not counted by the pool.
    before = POOL.bytes_allocated()
    c = np.empty(1 << 16, dtype=np.int32)
    assert POOL.bytes_allocated() == before
    del c


def _pool_bytes_held_by(make):
    """Bytes of Arrow's pool that what `make()` returns holds (allocated with it, freed with it)."""
    before = POOL.bytes_allocated()
    made = make()
    held = POOL.bytes_allocated() - before
    del made
    assert POOL.bytes_allocated() - before <= 0, "freed with the arrays"
    return held


def test_rows_and_token_batches_live_in_arrows_pool(corpus_dir, tokenizer_dir):
    spec = make_spec(corpus_dir, tokenizer_dir, seq_len=64)
    texts = ["a document of a few words", "another one, longer than the first one"]
    spec.tokenizer.encode(texts[:1])  # the backend loaded (its memory is not a batch's)
    encoded = spec.tokenizer.encode(texts)
    assert _pool_bytes_held_by(lambda: spec.tokenizer.encode(texts)) >= sum(d.nbytes for d in encoded)
    grouped = spec.tokenizer.encode(texts, groups=[1, 1])  # readers of a shared call: a buffer each
    assert _pool_bytes_held_by(lambda: spec.tokenizer.encode(texts, groups=[1, 1])) >= sum(d.nbytes for d in encoded)
    assert [d.tolist() for d in grouped] == [d.tolist() for d in encoded]
    assert grouped[0].base is not grouped[1].base and encoded[0].base is encoded[1].base  # control: one group, one
    shape = RowShape.of(spec)
    row_bytes = 3 * shape.slots * 4
    assert _pool_bytes_held_by(lambda: shape.make_row([(encoded[1], Piece(0, "f", 0, 0, 5))])) >= row_bytes
    # Negative control: numpy's own concatenation is not counted by Arrow's pool.
    assert _pool_bytes_held_by(lambda: np.concatenate(encoded)) == 0


def test_the_pool_is_jemalloc_unless_arrow_is_told_otherwise():
    import subprocess
    import sys

    code = "from zephon_titan.engine.buffers import POOL; print(POOL.backend_name)"
    for env, expected in (({}, "jemalloc"), ({"ARROW_DEFAULT_MEMORY_POOL": "system"}, "system")):
        run = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True)
        assert run.stdout.strip() == expected, run.stderr
