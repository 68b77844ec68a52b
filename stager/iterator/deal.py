"""Dealing an epoch's positions to ranks and DataLoader workers, and re-dealing what is left.

The positions still to be read in an epoch form a :class:`Remainder`: a short
sorted list of stray positions (``leftover``) followed by the run
``tail .. end``. A fresh epoch is the run ``0 .. total``. The remainder is
cut into chunks of ``batch`` positions, and chunks are dealt in the order
the training loop consumes them: step ``t`` of rank ``r`` takes chunk
``t * world + r``, and step ``t`` of a rank comes from DataLoader worker
``t % workers`` (the loader asks its workers in turn). So worker ``k`` of
rank ``r`` reads chunks ``(j * workers + k) * world + r`` for ``j = 0, 1, ...``,
and after every rank has taken ``n`` steps the positions read are exactly the
first ``n * world * batch`` of the remainder: a prefix, whatever the world
size. The last chunk of an epoch may be short.

Progress is counted per worker, in samples, and is the same on every rank
(ranks step together). :func:`redeal` turns a remainder and such progress
into the remainder of what no consumer has read yet, which a different
world size, worker count or batch size then deals afresh: that is how a job
resumed on another shape still reads every sample of the epoch exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError


@dataclass(frozen=True, slots=True)
class Layout:
    """One consumer among all: rank of world, DataLoader worker of workers, and the chunk size."""

    world: int = 1
    rank: int = 0
    workers: int = 1
    worker: int = 0
    batch: int = 1

    def __post_init__(self) -> None:
        for name in ("world", "workers", "batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if not 0 <= self.rank < self.world:
            raise ConfigError(f"rank {self.rank} is outside a world of {self.world}")
        if not 0 <= self.worker < self.workers:
            raise ConfigError(f"worker {self.worker} is outside {self.workers} workers")

    @property
    def shape(self) -> tuple[int, int, int]:
        """What the dealing depends on: (world, workers, batch)."""
        return (self.world, self.workers, self.batch)


@dataclass(frozen=True, slots=True, eq=False)
class Remainder:
    """The positions of an epoch not dealt yet: ``leftover`` (sorted), then ``tail .. end``."""

    leftover: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    tail: int = 0
    end: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "leftover", np.asarray(self.leftover, dtype=np.int64))
        lo = self.leftover
        if not 0 <= self.tail <= self.end:
            raise ConfigError(f"remainder: tail {self.tail} must lie in [0, end {self.end}]")
        if lo.size and (lo.min() < 0 or lo.max() >= self.tail or (lo.size > 1 and (np.diff(lo) <= 0).any())):
            raise ConfigError("remainder: leftover positions must be distinct, sorted and before the tail")

    @classmethod
    def whole(cls, total: int) -> "Remainder":
        return cls(np.zeros(0, np.int64), 0, total)

    def __len__(self) -> int:
        return len(self.leftover) + self.end - self.tail

    def positions(self, indexes: np.ndarray) -> np.ndarray:
        """The epoch positions at ``indexes`` of this remainder (each in ``[0, len(self))``)."""
        i = np.asarray(indexes, dtype=np.int64)
        n = len(self.leftover)
        if n == 0:
            return self.tail + i
        return np.where(i < n, self.leftover[np.minimum(i, n - 1)], self.tail + i - n)

    def truncated(self, multiple: int) -> "Remainder":
        """Only the first ``len - len % multiple`` positions (every rank then gets whole batches)."""
        keep = len(self) - len(self) % multiple
        n = len(self.leftover)
        if keep <= n:
            edge = int(self.leftover[keep - 1]) + 1 if keep else 0
            return Remainder(self.leftover[:keep], edge, edge)
        return Remainder(self.leftover, self.tail, self.tail + keep - n)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Remainder) and self.tail == other.tail and self.end == other.end \
            and np.array_equal(self.leftover, other.leftover)


class Slice:
    """The positions one consumer reads from a remainder, in its reading order."""

    def __init__(self, remainder: Remainder, layout: Layout) -> None:
        self.remainder = remainder
        self.layout = layout
        w, k, b = layout.world, layout.workers, layout.batch
        n = len(remainder)
        self._first = layout.worker * w + layout.rank  # the consumer's chunk for j = 0
        self._stride = w * k
        chunks = -(-n // b)
        mine = max(0, -(-(chunks - self._first) // self._stride))
        short = 0
        last = chunks - 1
        if chunks and last >= self._first and (last - self._first) % self._stride == 0:
            short = chunks * b - n  # this consumer holds the epoch's last, short chunk
        self.length = mine * b - short

    def __len__(self) -> int:
        return self.length

    def remainder_indexes(self, start: int, stop: int) -> np.ndarray:
        """Remainder indexes of this consumer's samples ``start .. stop`` (clipped to its length)."""
        b = self.layout.batch
        i = np.arange(max(start, 0), min(stop, self.length), dtype=np.int64)
        return (self._first + (i // b) * self._stride) * b + i % b

    def positions(self, start: int, stop: int) -> np.ndarray:
        """Epoch positions of this consumer's samples ``start .. stop``."""
        return self.remainder.positions(self.remainder_indexes(start, stop))


def redeal(remainder: Remainder, shape: tuple[int, int, int], progress: dict[int, int]) -> Remainder:
    """What is left of ``remainder`` once each worker ``k`` of every rank read ``progress[k]`` samples.

    Args:
        remainder: the remainder those consumers were dealt.
        shape: their (world, workers, batch).
        progress: samples read by worker k (the same on every rank), for every worker.

    Raises:
        ConfigError: progress is missing for a worker, or is negative.
    """
    world, workers, batch = shape
    missing = [k for k in range(workers) if k not in progress]
    if missing:
        raise ConfigError(f"the saved state holds the progress of {len(progress)} of {workers} workers "
                          f"(missing: {missing[:8]}); load the whole DataLoader state, not one worker's")
    done = np.array([progress[k] for k in range(workers)], dtype=np.int64)
    if (done < 0).any():
        raise ConfigError("the saved state has a negative progress")
    n = len(remainder)
    full, part = done // batch, done % batch
    per_step = workers * world
    lo_chunk = int(full.min()) * per_step
    hi_chunk = int((full + (part > 0)).max()) * per_step
    chunks = np.arange(lo_chunk, hi_chunk, dtype=np.int64)
    k = (chunks // world) % workers
    j = chunks // (world * workers)
    read = np.where(j < full[k], batch, np.where(j == full[k], part[k], 0))
    b = np.arange(batch, dtype=np.int64)
    idx = chunks[:, None] * batch + b[None, :]
    keep = (b[None, :] >= read[:, None]) & (idx < n)
    stray = remainder.positions(idx[keep])
    n_left = len(remainder.leftover)
    cut = min(hi_chunk * batch, n)
    leftover = np.concatenate([stray, remainder.leftover[cut:]]) if cut < n_left else stray
    tail = remainder.tail + max(0, cut - n_left)
    return Remainder(leftover, tail, remainder.end)
