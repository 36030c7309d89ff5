"""The train/eval split of a source: a keyed hash of each document's identity (file name, row).

A source with `eval_fraction = f` holds out the documents whose hash, read as a number in
[0, 1), is below f. The training loader skips them; the validator's loader reads only them.
No second copy of the data is needed, and the split is a pure function of (split_seed, file
name, row): the same on every W, for every worker count, across resumes. It uses the file's
name, not its directory, so data moved elsewhere ([dataloader] resume_allow = ["locations"])
keeps its split. Raising f only adds documents to the eval part (the test is `hash < f`).
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence

import numpy as np

from zephon_titan.engine.shuffle import derive_key

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer over an array (uint64 arithmetic wraps, as the algorithm wants)."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    out: np.ndarray = x ^ (x >> np.uint64(31))
    return out


def _top53(key: int, rows: Sequence[int] | np.ndarray) -> np.ndarray:
    """A keyed hash of each row, as its top 53 bits: an integer in [0, 2^53) (uint64)."""
    with np.errstate(over="ignore"):
        h = _mix(np.asarray(rows, dtype=np.uint64) * _GOLDEN + np.uint64(key))
    out: np.ndarray = h >> np.uint64(11)
    return out


def uniform53(key: int, rows: Sequence[int] | np.ndarray) -> np.ndarray:
    """Per row, u * 2^53 for u uniform in [0, 1) from a keyed hash (float64, exact: 53 bits fit). Compared with
    p * 2^53 it is true with probability p (engine/pipeline.py: a repeat's fractional copy)."""
    return _top53(key, rows).astype(np.float64)


def held_out(split_seed: int, file: str, rows: Sequence[int], fraction: float) -> np.ndarray:
    """A bool per row of `file`: is that document in the eval part?"""
    if fraction <= 0.0 or not len(rows):
        return np.zeros(len(rows), dtype=bool)
    # The top 53 bits as an integer compared with f * 2^53: exact, no float rounding of the hash.
    key = derive_key(split_seed, "split", posixpath.basename(file))
    return _top53(key, rows) < np.uint64(int(fraction * (1 << 53)))


def kept(split: str, split_seed: int, file: str, rows: Sequence[int], fraction: float) -> np.ndarray:
    """A bool per row: does a loader reading `split` ("train" or "eval") take that document?"""
    out = held_out(split_seed, file, rows, fraction)
    return out if split == "eval" else ~out
