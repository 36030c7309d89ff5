from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_titan.engine.shuffle import Permutation, _mix64, derive_key


@given(n=st.integers(0, 3000), key=st.integers(0, 2**64 - 1))
@settings(max_examples=60, deadline=None)
def test_permutation_is_a_bijection(n, key):
    assert sorted(Permutation(n, key)) == list(range(n))


def test_permutation_is_a_pure_function_of_key_and_index():
    a = Permutation(1000, derive_key(3, "blocks", "code", 0))
    b = Permutation(1000, derive_key(3, "blocks", "code", 0))
    assert list(a) == list(b)
    assert [a[i] for i in (999, 0, 500)] == [b[i] for i in (999, 0, 500)]


def test_other_keys_give_other_orders():
    # Negative control: the shuffle actually depends on seed, purpose and epoch.
    base = list(Permutation(1000, derive_key(3, "blocks", "code", 0)))
    assert base != list(range(1000))
    for other in (
        derive_key(4, "blocks", "code", 0),
        derive_key(3, "blocks", "code", 1),
        derive_key(3, "blocks", "prose", 0),
        derive_key(3, "docs", "code", 0),
    ):
        assert list(Permutation(1000, other)) != base


def test_derive_key_separates_paths():
    assert derive_key(1, "a", 12) != derive_key(1, "a1", 2)
    assert derive_key(1, "a") == derive_key(1, "a")


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 1 << 40), key=st.integers(0, (1 << 64) - 1), i=st.integers(0, (1 << 40) - 1))
def test_the_rounds_are_splitmix64_feistel_rounds(n, key, i):
    """Permutation._encrypt writes _mix64 out inline (speed); it must stay the network it was, so the
    orders of old runs (step hashes, checkpoints) hold. Negative control: another key's round differs."""
    perm = Permutation(n, key)
    x = i & ((1 << (2 * perm._half_bits)) - 1)

    def reference(keys):
        left, right = x >> perm._half_bits, x & perm._half_mask
        for k in keys:
            left, right = right, left ^ (_mix64(right ^ k) & perm._half_mask)
        return (left << perm._half_bits) | right

    assert perm._encrypt(x) == reference(perm._keys)
    if perm._half_bits >= 16:
        assert perm._encrypt(x) != reference(Permutation(n, key ^ 1)._keys)


@given(n=st.integers(0, 5000), key=st.integers(0, 2**64 - 1))
@settings(max_examples=60, deadline=None)
def test_the_table_is_the_permutation_index_by_index(n, key):
    """Permutation.table computes every position at once over numpy uint64 (a window's order): it must be the
    scalar network's bijection, position by position, or old runs' rows would move. Negative control: another
    key's table differs (n large enough to have more than one order)."""
    perm = Permutation(n, key)
    assert list(perm.table()) == [perm[i] for i in range(n)]
    if n > 8:
        assert list(Permutation(n, key ^ 1).table()) != list(perm.table())


def test_the_table_at_sizes_where_cycle_walking_goes_far():
    # Just above a power of two the domain is ~4n: most positions walk; at 2^k - 1 and 2^k almost none do.
    for n in (2, 3, 4, 5, 17, 257, 4097, 65537, 65536, 65535):
        perm = Permutation(n, derive_key(9, "docs", n))
        assert list(perm.table()) == list(perm)
