import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stager.iterator.permutation import derive_key, permute, window_keys


@given(st.integers(1, 5000), st.integers(0, 2**64 - 1))
@settings(max_examples=60, deadline=None)
def test_is_a_permutation_of_the_domain(n, key):
    values = permute(np.arange(n), n, key)
    assert np.array_equal(np.sort(values), np.arange(n))


def test_depends_on_key_and_is_deterministic():
    a = permute(np.arange(1000), 1000, derive_key("x", 1))
    assert np.array_equal(a, permute(np.arange(1000), 1000, derive_key("x", 1)))
    b = permute(np.arange(1000), 1000, derive_key("x", 2))
    assert (a != b).mean() > 0.9
    assert (a != np.arange(1000)).mean() > 0.9  # it shuffles


def test_pointwise_and_mixed_domains_agree_with_whole_permutations():
    n1, n2 = 37, 1000
    k1, k2 = window_keys(7, np.array([0, 1]))
    whole1 = permute(np.arange(n1), n1, int(k1))
    whole2 = permute(np.arange(n2), n2, int(k2))
    x = np.array([5, 999, 0, 36, 17])
    n = np.array([n1, n2, n2, n1, n2])
    k = np.array([k1, k2, k2, k1, k2], dtype=np.uint64)
    got = permute(x, n, k)
    assert got.tolist() == [whole1[5], whole2[999], whole2[0], whole1[36], whole2[17]]


def test_refuses_values_outside_the_domain():
    with pytest.raises(ValueError):
        permute(np.array([3]), 3, 1)


@given(st.integers(1, 70_000), st.integers(0, 2**64 - 1), st.integers(0, 2**32))
@settings(max_examples=60, deadline=None)
def test_one_domain_gives_what_per_element_domains_give(n, key, seed):
    # permute() takes a shorter path when the domain and key are scalars; the values are the same.
    x = np.random.default_rng(seed).integers(0, n, 500)
    per_element = permute(x, np.full(x.shape, n), np.full(x.shape, key, dtype=np.uint64))
    mixed = permute(np.append(x, 0), np.append(np.full(x.shape, n), n + 1),
                    np.append(np.full(x.shape, key, dtype=np.uint64), np.uint64(1)))[:-1]
    assert np.array_equal(permute(x, n, key), per_element)
    assert np.array_equal(permute(x, n, key), mixed)
