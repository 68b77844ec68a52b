"""A keyed pseudo-random permutation of ``[0, n)``, evaluated pointwise and vectorised.

Why not ``numpy.random.permutation``: the iterator needs ``pi(x)`` for the few
positions one consumer reads, in every shuffle window of the epoch, for
datasets whose epochs hold billions of samples. Materialising each window's
permutation costs memory and time proportional to the window for every
consumer; this costs time proportional to the positions asked for, and the
result depends only on ``(key, n, x)`` (not on NumPy's generator algorithms,
which may change between releases).

How: a balanced Feistel network on ``2 * half`` bits, the smallest even bit
width that covers ``n``, with a splitmix64-style round function keyed per
round; values that land outside ``[0, n)`` are walked through the network
again (cycle walking), which keeps the map a bijection on ``[0, n)``. Since
``2 ** (2 * half) < 4 * n``, a walk takes under four rounds on average.
Every argument may be an array, so one call serves positions from many
windows at once, each with its own ``n`` and key.
"""

from __future__ import annotations

import numpy as np
import xxhash

ROUNDS = 6

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_ROUND_CONSTANTS = tuple((0x9E3779B97F4A7C15 * (r + 1)) % (1 << 64) for r in range(ROUNDS))


def mix64(z: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser: a bijective, well-mixing map of uint64 arrays (wraps on overflow)."""
    z = np.array(z, dtype=np.uint64)  # a copy: the steps below work in place
    z ^= z >> _S30
    z *= _M1
    z ^= z >> _S27
    z *= _M2
    z ^= z >> _S31
    return z


def derive_key(*parts: int | str) -> int:
    """A 64-bit key from a few integers or strings (e.g. seed, epoch, a purpose tag)."""
    return xxhash.xxh3_64_intdigest(":".join(str(p) for p in parts).encode())


def window_keys(base: int, windows: np.ndarray) -> np.ndarray:
    """One key per window index, derived from ``base`` (vectorised)."""
    w = np.asarray(windows, dtype=np.uint64)
    return mix64(np.full(w.shape, base, dtype=np.uint64) ^ mix64(w + _GOLDEN))


def _half_bits(n: np.ndarray) -> np.ndarray:
    # bit length of n - 1 via frexp; a float rounding up only widens the domain, which stays valid.
    _, exponent = np.frexp(np.maximum(n - 1, 1).astype(np.float64))
    return np.maximum((exponent.astype(np.int64) + 1) // 2, 1).astype(np.uint64)


def permute(x: np.ndarray | int, n: np.ndarray | int, key: np.ndarray | int) -> np.ndarray:
    """``pi_key(x)`` for the permutation ``pi_key`` of ``[0, n)``; arguments broadcast together.

    Args:
        x: values in ``[0, n)``.
        n: domain sizes (>= 1).
        key: 64-bit keys (Python ints or a uint64 array).

    Returns:
        An int64 array of the permuted values, each in ``[0, n)``.

    Raises:
        ValueError: a value is outside its domain.
    """
    if np.ndim(n) == 0 and np.ndim(key) == 0:
        return _permute_one_domain(np.asarray(x, dtype=np.int64), int(n), int(key))
    x_arr = np.asarray(x, dtype=np.int64)
    n_arr = np.asarray(n, dtype=np.int64)
    key_arr = np.asarray(key, dtype=np.uint64) if not isinstance(key, int) else np.array(key, dtype=np.uint64)
    x_arr, n_arr, key_arr = np.broadcast_arrays(x_arr, n_arr, key_arr)
    if x_arr.size == 0:
        return np.zeros(x_arr.shape, dtype=np.int64)
    if (n_arr < 1).any() or (x_arr < 0).any() or (x_arr >= n_arr).any():
        raise ValueError("permute: every value must lie in [0, n) with n >= 1")
    flat_n = n_arr.astype(np.uint64).ravel()
    keys = key_arr.astype(np.uint64).ravel()
    if bool((flat_n == flat_n[0]).all() and (keys == keys[0]).all()):
        return _permute_one_domain(x_arr, int(flat_n[0]), int(keys[0]))
    half = _half_bits(flat_n)
    mask = (np.uint64(1) << half) - np.uint64(1)
    round_keys = [mix64(keys + np.uint64(c)) for c in _ROUND_CONSTANTS]
    out = _feistel(x_arr.astype(np.uint64).ravel(), half, mask, round_keys)
    todo = np.flatnonzero(out >= flat_n)
    while todo.size:  # cycle walking: ends because the walk stays on x's cycle, which holds x itself
        out[todo] = _feistel(out[todo], half[todo], mask[todo], [rk[todo] for rk in round_keys])
        todo = todo[out[todo] >= flat_n[todo]]
    return out.astype(np.int64).reshape(x_arr.shape)


def _permute_one_domain(x: np.ndarray, n: int, key: int) -> np.ndarray:
    """`permute` for one domain and key (the common case: positions of one shuffle window).

    The same values as with per-element domains and keys, without their arrays.
    """
    if x.size == 0:
        return np.zeros(x.shape, dtype=np.int64)
    if n < 1 or x.min() < 0 or x.max() >= n:
        raise ValueError("permute: every value must lie in [0, n) with n >= 1")
    half = _half_bits(np.array([n], dtype=np.int64))[0]
    mask = (np.uint64(1) << half) - np.uint64(1)
    base = np.array([key % (1 << 64)], dtype=np.uint64)
    round_keys = [mix64(base + np.uint64(c))[0] for c in _ROUND_CONSTANTS]
    limit = np.uint64(n)
    out = _feistel(x.astype(np.uint64).ravel(), half, mask, round_keys)
    todo = np.flatnonzero(out >= limit)
    while todo.size:  # cycle walking, as in `permute`
        out[todo] = _feistel(out[todo], half, mask, round_keys)
        todo = todo[out[todo] >= limit]
    return out.astype(np.int64).reshape(x.shape)


def _feistel(v: np.ndarray, half, mask, round_keys) -> np.ndarray:
    """One pass of the Feistel network over ``v`` (uint64); ``half``, ``mask`` and keys broadcast with it."""
    left, right = v >> half, v & mask
    for rk in round_keys:
        f = mix64(right ^ rk)
        f &= mask
        f ^= left
        left, right = right, f
    left <<= half
    left |= right
    return left
