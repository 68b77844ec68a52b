"""Choosing which blobs to evict, in which order.

The engine knows the future: it may pass ``rank(digest) -> float | None``,
higher meaning "evict first" (the distance to the blob's next use in the
active plans, ``inf`` for a blob no plan needs). ``None`` (or NaN) means the
engine has no use for the blob either, and ranks like ``inf``. Ties, and
every blob when there is no rank, go consumed first (blobs that every local
consumer has read this epoch), then least recently used.

Never candidates: pinned blobs (filtered in SQL), blobs held by a live
process, blobs the caller protects. A blob whose lock is held (being fetched
or evicted elsewhere) is skipped by the tier when it tries the lock.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Container, Iterable

from .blob_index import Candidate

Rank = Callable[[str], "float | None"]


def is_consumed(candidate: Candidate, consumed: Container[str] | None) -> bool:
    """Whether ``candidate`` counts as consumed: any mark, or one of the ``consumed`` tokens if given."""
    if candidate.consumed is None:
        return False
    return consumed is None or candidate.consumed in consumed


def eviction_order(candidates: Iterable[Candidate], *, rank: Rank | None = None,
                   exclude: Container[str] = frozenset(),
                   consumed: Container[str] | None = None) -> list[Candidate]:
    """The candidates not in ``exclude``, first victim first."""
    keyed = []
    for c in candidates:
        if c.digest in exclude:
            continue
        r = rank(c.digest) if rank is not None else None
        if r is None or math.isnan(r):
            r = math.inf
        # Sort ascending: higher rank first, then consumed first, then oldest access first.
        keyed.append(((-r, not is_consumed(c, consumed), c.last_access, c.digest), c))
    keyed.sort(key=lambda kc: kc[0])
    return [c for _, c in keyed]


class VictimQueue:
    """An eviction order reused for a short while: ranking every blob is the costly part.

    Ordering 50,000 blobs (and calling ``rank`` on each) takes a good part of a
    second, and a cache that streams a dataset evicts before nearly every new
    blob. So the order is kept for ``ttl`` seconds (for the same ``rank`` and
    ``consumed``) and walked again, skipping blobs already gone; the tier
    re-checks every victim under its lock before removing it, so a stale order
    can only pick a slightly different victim, never a protected one. When the
    kept order runs dry, the tier asks for a fresh one.
    """

    def __init__(self, ttl: float = 1.0) -> None:
        self.ttl = ttl
        self.lock = threading.Lock()  # held by the tier for a whole eviction
        self._order: list[Candidate] = []
        self._key: tuple[object, object] | None = None
        self._built = -math.inf
        self._gone: set[tuple[str, str]] = set()

    def get(self, load: Callable[[], Iterable[Candidate]], rank: Rank | None,
            consumed: Container[str] | None, *, fresh: bool = False) -> tuple[list[Candidate], bool]:
        """The current order and whether it was just built (call with :attr:`lock` held)."""
        key = (rank, consumed)
        if fresh or key != self._key or time.monotonic() - self._built > self.ttl:
            self._order = eviction_order(load(), rank=rank, consumed=consumed)
            self._key = key
            self._built = time.monotonic()
            self._gone.clear()
            return self._order, True
        return self._order, False

    def is_gone(self, candidate: Candidate) -> bool:
        return (candidate.digest, candidate.gen) in self._gone

    def mark_gone(self, candidate: Candidate) -> None:
        self._gone.add((candidate.digest, candidate.gen))
