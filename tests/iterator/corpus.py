"""Token corpora whose every token names itself, so a sample proves where it came from.

Token ``t`` of the corpus (counting across shards in manifest order) has the
value ``t``: a sample is right if and only if it is ``arange(first, first + n)``
for a ``first`` that starts a sample, and its first token identifies it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from stager.write import write_token_shards


def write_counting_corpus(directory: Path, lengths: list[int], fmt: str = "bin", block_size: int = 1 << 16):
    """Shards of the given token counts, uint32 tokens counting up across shards; returns the manifest."""
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    arrays = [np.arange(s, s + n, dtype=np.uint32) for s, n in zip(starts, lengths)]
    return write_token_shards(directory, arrays, fmt=fmt, block_size=block_size)


def expected_firsts(manifest, seq_len: int, with_labels: bool = False) -> set[int]:
    """The first token of every sample of a counting corpus."""
    n = seq_len + 1 if with_labels else seq_len
    firsts: set[int] = set()
    base = 0
    for i in range(len(manifest)):
        tokens = int(manifest.tokens[i])
        if tokens >= n:
            firsts.update(range(base, base + (tokens - n) // seq_len * seq_len + 1, seq_len))
        base += tokens
    return firsts


def check_sample(sample: np.ndarray, n: int) -> int:
    """The sample's first token, after checking it is a run of ``n`` consecutive tokens."""
    assert sample.shape == (n,), sample.shape
    first = int(sample[0])
    assert np.array_equal(np.asarray(sample, dtype=np.int64), np.arange(first, first + n)), \
        f"wrong tokens in the sample starting at {first}"
    return first
