"""Who still needs a blob: its last access (buffered), and the holds of live processes on it.

Eviction takes the least recently used blobs first and never a blob a live
process holds. :class:`AccessTimes` keeps the access times of reads in
memory and writes them to the index in batches (at most every
``touch_interval`` seconds, or every few thousand blobs), since a read is far
more frequent than an eviction; an eviction flushes them first.
:class:`Holds` records the blobs a process protects (its prefetch window) with
that process's identity, so a hold whose process died counts for nothing and
is swept away.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from .blob_index import BlobIndex
from .layout import check_digest
from .liveness import ProcessIdentity, current_process, is_alive

_TOUCH_BATCH = 4096


class AccessTimes:
    """Access times of blobs, buffered in memory and written to the index in batches."""

    def __init__(self, index: BlobIndex, interval: float) -> None:
        self._index = index
        self._lock = threading.Lock()
        self._touches: dict[str, float] = {}
        self._interval = interval
        self._flushed = time.monotonic()

    def touch(self, digest: str) -> None:
        """Note that a blob was just read (written at most every ``interval`` seconds)."""
        now = time.time()
        with self._lock:
            self._touches[digest] = now
            due = len(self._touches) >= _TOUCH_BATCH or time.monotonic() - self._flushed >= self._interval
        if due:
            self.flush()

    def last(self, digest: str, recorded: float) -> float:
        """The blob's last access: ``recorded`` (the index's) or a later one not written yet."""
        with self._lock:
            return max(recorded, self._touches.get(digest, 0.0))

    def flush(self) -> None:
        """Write the buffered access times to the index."""
        with self._lock:
            touches, self._touches = self._touches, {}
            self._flushed = time.monotonic()
        if touches:
            self._index.touch_many([(t, d) for d, t in touches.items()])


class Holds:
    """Blobs protected by live processes (their prefetch windows), kept in the index."""

    def __init__(self, index: BlobIndex, boot: str) -> None:
        self._index = index
        self._boot = boot

    def hold(self, owner_id: str, digests: Iterable[str]) -> None:
        """Protect ``digests`` for as long as this process lives (see :meth:`CacheTier.hold`)."""
        me = current_process()
        self._index.add_holds(owner_id, me.pid, me.start, me.boot, (check_digest(d) for d in digests))

    def release(self, owner_id: str, digests: Iterable[str] | None = None) -> None:
        self._index.release_holds(owner_id, None if digests is None else list(digests))

    def drop_dead_owners(self) -> tuple[list[str], int]:
        """The live owners' ids, and how many dead ones were removed with their holds."""
        live, dead = [], []
        for owner, pid, start, boot in self._index.owners():
            (live if self._alive(pid, start, boot) else dead).append(owner)
        if dead:
            self._index.drop_owners(dead)
        return live, len(dead)

    def is_held(self, digest: str) -> bool:
        """Whether a live process holds ``digest``."""
        return any(self._alive(pid, start, boot) for _, pid, start, boot in self._index.owners_holding(digest))

    def _alive(self, pid: int, start: int, boot: str) -> bool:
        return is_alive(ProcessIdentity(pid, start, boot), self._boot)
