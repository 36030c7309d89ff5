"""Token batches and rows live in Arrow's memory pool, not in the C heap (engine/buffers.py, issue 28)."""

import pickle

import numpy as np
import pyarrow as pa
from helpers import make_spec

from zephon_titan.engine.buffers import lasting_array
from zephon_titan.engine.encode_calls import _own_buffer
from zephon_titan.engine.rows import Piece, RowShape


def test_a_lasting_array_is_its_own_writable_memory_from_arrows_pool():
    before = pa.total_allocated_bytes()
    a = lasting_array(1000, np.dtype("<i4"))
    b = lasting_array(1000, np.dtype("<i4"))
    assert pa.total_allocated_bytes() - before >= 2 * 4000
    a[:] = np.arange(1000)
    b[:] = -1
    assert a.dtype == np.dtype("<i4") and a.shape == (1000,) and a.flags.writeable
    assert a.tolist() == list(range(1000)) and not np.shares_memory(a, b)
    assert pickle.loads(pickle.dumps(a[10:20], protocol=5)).tolist() == list(range(10, 20))
    del a, b
    assert pa.total_allocated_bytes() <= before
    assert lasting_array(0, np.dtype("<i4")).shape == (0,)
    # Negative control: numpy's own arrays are not counted by Arrow's pool.
    before = pa.total_allocated_bytes()
    c = np.empty(1 << 16, dtype=np.int32)
    assert pa.total_allocated_bytes() == before
    del c


def _pool_bytes_held_by(make):
    """Bytes of Arrow's pool that what `make()` returns holds (allocated with it, freed with it)."""
    before = pa.total_allocated_bytes()
    made = make()
    held = pa.total_allocated_bytes() - before
    del made
    assert pa.total_allocated_bytes() - before <= 0, "freed with the arrays"
    return held


def test_rows_and_token_batches_live_in_arrows_pool(corpus_dir, tokenizer_dir):
    spec = make_spec(corpus_dir, tokenizer_dir, seq_len=64)
    texts = ["a document of a few words", "another one, longer than the first one"]
    spec.tokenizer.encode(texts[:1])  # the backend loaded (its memory is not a batch's)
    encoded = spec.tokenizer.encode(texts)
    assert _pool_bytes_held_by(lambda: spec.tokenizer.encode(texts)) >= sum(d.nbytes for d in encoded)
    assert _pool_bytes_held_by(lambda: _own_buffer(encoded)) >= sum(d.nbytes for d in encoded)
    shape = RowShape.of(spec)
    row_bytes = 3 * shape.slots * 4
    assert _pool_bytes_held_by(lambda: shape.make_row([(encoded[1], Piece(0, "f", 0, 0, 5))])) >= row_bytes
    # Negative control: numpy's own concatenation is not counted by Arrow's pool.
    assert _pool_bytes_held_by(lambda: np.concatenate(encoded)) == 0
