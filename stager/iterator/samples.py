"""The global index space of samples: fixed windows of tokens over every token shard.

A sample is ``sample_len`` consecutive tokens of one shard, starting at a
multiple of ``seq_len`` (the stride). ``sample_len`` is ``seq_len``, or
``seq_len + 1`` for input/label pairs: then consecutive samples share one
token, so every token of a shard is a label exactly once. Samples never span
two shards; the tail of a shard too short for another sample is skipped.

The counts come from the manifest alone (its token counts), so every rank
and worker computes the same index space without opening a shard. Shards
that are not token shards (no token count) or too short for one sample hold
no samples and are never read; but a ``.bin`` file without a token count is
refused by name (:func:`refuse_plain_bin_files`): silently skipping it would
train on less data than the user thinks.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa
import xxhash

try:  # the kernels themselves, as manifest/validate.py takes them (pyarrow.compute costs start-up time)
    from pyarrow._compute import MatchSubstringOptions, call_function
except ImportError:  # pragma: no cover - a pyarrow that moved them
    from pyarrow.compute import MatchSubstringOptions, call_function

from ..errors import ConfigError
from ..manifest import Manifest


@dataclass(frozen=True, slots=True)
class SampleSpec:
    """How samples are cut from a shard's tokens."""

    seq_len: int
    with_labels: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.seq_len, bool) or not isinstance(self.seq_len, int) or self.seq_len < 1:
            raise ConfigError(f"seq_len must be a positive integer, got {self.seq_len!r}")

    @property
    def sample_len(self) -> int:
        """Tokens in one sample: ``seq_len``, plus one when labels are the inputs shifted by one."""
        return self.seq_len + 1 if self.with_labels else self.seq_len

    @property
    def stride(self) -> int:
        return self.seq_len

    def count(self, tokens: np.ndarray) -> np.ndarray:
        """Samples in shards of ``tokens`` tokens (negative counts: not a token shard, no samples)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        fits = tokens >= self.sample_len
        return np.where(fits, (tokens - self.sample_len) // self.stride + 1, 0).astype(np.int64)


def refuse_plain_bin_files(manifest: Manifest, name: str) -> None:
    """Raise :class:`ConfigError` naming the ``.bin`` files the manifest records as plain files.

    A ``.bin`` file has no header: without a token count it is model weights, or a token shard
    indexed with ``--dtype none`` or cut short. Skipping it would train on less data than the
    user thinks, without a word.
    """
    plain = manifest.tokens < 0
    if not plain.any():  # the usual token dataset: no path is looked at
        return
    paths = manifest.table.column("path")
    is_bin = call_function("ends_with", [paths], MatchSubstringOptions(".bin")).to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(plain & np.asarray(is_bin, dtype=bool))
    if len(rows):
        first = paths[int(rows[0])].as_py()
        raise ConfigError(f"{name}: {first} is not a token shard ({len(rows)} .bin file(s) have no token count: "
                          "not whole tokens of the dtype, or indexed with --dtype none); index it with the "
                          "right --dtype, or --exclude it")


class SampleIndex:
    """Per-shard sample counts of one manifest under one :class:`SampleSpec`.

    Raises:
        ConfigError: no shard holds even one sample.
    """

    def __init__(self, manifest: Manifest, spec: SampleSpec, name: str = "dataset") -> None:
        self.manifest = manifest
        self.spec = spec
        refuse_plain_bin_files(manifest, name)
        self.counts = spec.count(manifest.tokens)
        self.total = int(self.counts.sum())
        if self.total == 0:
            token_shards = int((manifest.tokens >= 0).sum())
            raise ConfigError(f"{name}: no samples of {spec.sample_len} tokens: {token_shards} of {len(manifest)} "
                              f"shards are token shards, none with {spec.sample_len} tokens or more")

    @cached_property
    def shards(self) -> np.ndarray:
        """Manifest indexes of the shards that hold samples, in manifest order."""
        return np.flatnonzero(self.counts > 0).astype(np.int64)

    @cached_property
    def fingerprint(self) -> str:
        """Identifies the index space: the shards' digests, their sample counts and the spec.

        A saved iterator state only resumes over the same fingerprint, so a
        changed dataset or ``seq_len`` is refused instead of yielding another stream.
        """
        h = xxhash.xxh3_64()
        h.update(f"{self.spec.seq_len}:{self.spec.with_labels}".encode())
        digests = self.manifest.table.column("digest").take(pa.array(self.shards)).combine_chunks()
        h.update(memoryview(digests.buffers()[1])[digests.offset * 16:(digests.offset + len(digests)) * 16])
        h.update(self.counts[self.shards].astype("<i8").tobytes())
        return h.hexdigest()

    @cached_property
    def token_bytes(self) -> tuple[np.ndarray, np.ndarray]:
        """Per manifest shard, where its tokens start in the file the reader maps (bytes) and each token's
        size, from the manifest alone: the tokens are taken to be the file's last ``tokens * itemsize``
        bytes (exact for flat ``.bin`` and ``.npy`` files, whose header is what comes before them; an
        estimate for the column formats). A compressed shard's file is its decompressed form."""
        m = self.manifest
        itemsize = np.array([np.dtype(d).itemsize if d else 4 for d in m.dtypes], dtype=np.int64)
        codecs = np.array([c is not None for c in m.codecs], dtype=bool)
        size = np.where(codecs, m.raw_sizes, m.sizes).astype(np.int64)
        tokens = np.maximum(m.tokens, 0).astype(np.int64)
        return np.maximum(size - tokens * itemsize, 0), itemsize

    def token_offset(self, local: np.ndarray) -> np.ndarray:
        """The first token of local sample ``local`` inside its shard."""
        return np.asarray(local, dtype=np.int64) * self.spec.stride

    def __len__(self) -> int:
        return self.total
