"""Pure, stateless shuffling: the position of item i is a function of (key, n, i).

A permutation is never materialized or stored. `Permutation(n, key)[i]` is a
keyed bijection on [0, n) built from a balanced Feistel network with cycle
walking, so a lane can ask "which block is my k-th?" in O(1) and a checkpoint
needs no RNG state. Only stdlib integer arithmetic and BLAKE2b are used, so the
result never changes with the NumPy, Python or platform version.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterator

import numpy as np

_MASK64 = (1 << 64) - 1
_ROUNDS = 6


def derive_key(seed: int, *path: object) -> int:
    """A 64-bit key for one use of randomness, e.g. derive_key(seed, "blocks", "code", epoch).

    Each distinct path gets an independent key, so adding a source or a lane never
    shifts the randomness of another.
    """
    text = "/".join([str(int(seed))] + [str(p) for p in path]).encode("utf-8")
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def _mix64(x: int) -> int:
    # splitmix64 finalizer: a strong, cheap 64-bit mixing function.
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK64
    return x ^ (x >> 31)


def _round_keys(key: int) -> tuple[int, ...]:
    return tuple(_mix64((key + (r + 1) * 0x9E3779B97F4A7C15) & _MASK64) for r in range(_ROUNDS))


class Permutation:
    """A keyed pseudo-random bijection on range(n); `perm[i]` is the item at position i."""

    __slots__ = ("n", "_half_bits", "_half_mask", "_keys")

    def __init__(self, n: int, key: int):
        if n < 0:
            raise ValueError(f"permutation size must be >= 0, got {n}")
        self.n = n
        bits = max(2, (max(n - 1, 1)).bit_length())
        bits += bits & 1  # the Feistel network needs an even number of bits
        self._half_bits = bits // 2
        self._half_mask = (1 << self._half_bits) - 1
        self._keys = _round_keys(key)

    def _encrypt(self, x: int) -> int:
        half, mask = self._half_bits, self._half_mask
        left, right = x >> half, x & mask
        for k in self._keys:
            # _mix64(right ^ k), written out: every document a lane takes and every block it is dealt
            # passes here several times, and the call was a third of the time.
            y = right ^ k
            y = (y ^ (y >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
            y = (y ^ (y >> 27)) * 0x94D049BB133111EB & _MASK64
            left, right = right, left ^ ((y ^ (y >> 31)) & mask)
        return (left << half) | right

    def __getitem__(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(f"position {i} outside permutation of size {self.n}")
        # Cycle walking: the domain is at most 4n, so the expected number of steps is < 4.
        x = self._encrypt(i)
        while x >= self.n:
            x = self._encrypt(x)
        return x

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        return (self[i] for i in range(self.n))

    def table(self) -> array[int]:
        """perm[i] for every i at once, as an array of integers (8 bytes each): the same bijection as
        __getitem__, computed over numpy uint64 arrays (their products wrap mod 2^64, as `& _MASK64` does), so a
        lane that takes every document of a window pays a few array operations per round, not a Python loop
        per document."""
        x = self._encrypt_array(np.arange(self.n, dtype=np.uint64))
        walking = np.flatnonzero(x >= self.n)
        while walking.size:  # cycle walking, only where still outside [0, n)
            x[walking] = self._encrypt_array(x[walking])
            walking = walking[x[walking] >= self.n]
        return array("Q", x.tobytes())

    def _encrypt_array(self, x: np.ndarray) -> np.ndarray:
        half, mask = np.uint64(self._half_bits), np.uint64(self._half_mask)
        left, right = x >> half, x & mask
        for k in self._keys:
            y = right ^ np.uint64(k)
            y = (y ^ (y >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            y = (y ^ (y >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            left, right = right, left ^ ((y ^ (y >> np.uint64(31))) & mask)
        return (left << half) | right
