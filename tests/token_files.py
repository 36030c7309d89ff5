"""Writers of token-file fixtures: Megatron indexed datasets (`.bin` + `.idx`) and OLMo token files.

`write_megatron` lays the files out as megatron-core's IndexedDatasetBuilder does (the layout is quoted in
zephon_titan/engine/sources/megatron.py); tests/unit/test_token_files.py's slow test checks its bytes against
megatron-core's own writer and reads them back with megatron-core's reader.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

DTYPE_CODES = {
    np.uint8: 1,
    np.int8: 2,
    np.int16: 3,
    np.int32: 4,
    np.int64: 5,
    np.float64: 6,
    np.float32: 7,
    np.uint16: 8,
}


def write_megatron(
    prefix: str,
    documents: Sequence[Sequence[int]],
    dtype: type = np.uint16,
    split: int = 0,
) -> tuple[str, str]:
    """`<prefix>.bin` and `<prefix>.idx` holding `documents`; with `split` > 0 each document is stored as
    sequences of at most `split` tokens (as Megatron's --split-sentences stores sentences). Returns both paths."""
    lengths: list[int] = []
    doc_indices = [0]
    with open(prefix + ".bin", "wb") as out:
        for doc in documents:
            ids = np.asarray(doc, dtype=dtype)
            cuts = range(0, len(ids), split) if split and len(ids) else [0]
            for at in cuts:
                part = ids[at : at + split] if split else ids
                out.write(part.tobytes(order="C"))
                lengths.append(len(part))
            doc_indices.append(len(lengths))
    itemsize = np.dtype(dtype).itemsize
    pointers = np.concatenate([[0], np.cumsum(lengths[:-1], dtype=np.int64)]) * itemsize if lengths else []
    with open(prefix + ".idx", "wb") as idx:
        idx.write(b"MMIDIDX\x00\x00")
        idx.write(struct.pack("<Q", 1))
        idx.write(struct.pack("<B", DTYPE_CODES[dtype]))
        idx.write(struct.pack("<Q", len(lengths)))
        idx.write(struct.pack("<Q", len(doc_indices)))
        idx.write(np.asarray(lengths, dtype="<i4").tobytes(order="C"))
        idx.write(np.asarray(pointers, dtype="<i8").tobytes(order="C"))
        idx.write(np.asarray(doc_indices, dtype="<i8").tobytes(order="C"))
    return prefix + ".bin", prefix + ".idx"


def write_olmo(path: str, documents: Sequence[Sequence[int]], eos: int, dtype: type = np.uint16) -> str:
    """An OLMo token file: the documents' ids, each followed by `eos`, as one flat raw memmap (what
    OLMo-core's data guide writes with np.memmap, and `dolma tokens` writes)."""
    ids = [t for doc in documents for t in (*doc, eos)]
    out = np.memmap(path, mode="w+", dtype=dtype, shape=(len(ids),)) if ids else None
    if out is None:
        open(path, "wb").close()
        return path
    out[:] = ids
    out.flush()
    del out
    return path


def write_dolma_metadata(npy_path: str, documents: Sequence[Sequence[int]], ids: Sequence[str] = ()) -> str:
    """The `<name>.csv.gz` `dolma tokens` writes beside `<name>.npy` for documents written by write_olmo
    (each followed by its EOS): per document, start,end (token offsets, end exclusive),id,src,loc."""
    import csv
    import gzip
    import io

    out, at = io.StringIO(), 0
    rows = csv.writer(out)
    for i, doc in enumerate(documents):
        rows.writerow([at, at + len(doc) + 1, ids[i] if ids else f"doc-{i}", "fixture.jsonl", i])
        at += len(doc) + 1
    path = npy_path[: -len(".npy")] + ".csv.gz"
    with open(path, "wb") as f:
        f.write(gzip.compress(out.getvalue().encode("utf-8")))
    return path
