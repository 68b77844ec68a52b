"""A plan: the ordered blobs one consumer will read, and its cursor.

The consumer (the token iterator, the mount's sequential reader, ``stage``)
knows its future order. The plan's prefetcher walks that order from the
cursor and asks the engine for every blob inside the window ahead of it,
nearest first; as the consumer advances, the window slides and the blobs left
behind are marked consumed so eviction takes them first. When the consumer
reaches a blob that is not there yet, :meth:`Plan.ready` makes it urgent.

The window is measured in time, not only bytes (:mod:`.read_ahead`): what the
consumer will read in the next ``ahead_seconds`` at its measured rate, past a
floor it asks for (the iterator: its current and next shuffle window) and
never past the byte window. A consumer that names no floor (``stage``, the
mount, a checkpoint restore: they never advance, or size their window by
their own reads) has its whole window as the floor, as before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

import numpy as np

from ..aio import wait_until_set
from ..cache import BlobState
from ..errors import CacheFull, DiskFull, StagerError
from .read_ahead import DEFAULT_AHEAD_SECONDS, ConsumptionRate, ReadAhead

if TYPE_CHECKING:
    from .context import FetchContext
    from .dataset import BlobRef, Dataset

log = logging.getLogger(__name__)

URGENT = -1.0  # gate priority of a block a consumer is blocked on


class PlanOwner(Protocol):
    """What a plan asks of the engine that runs it: blobs, room in the cache, and its leaving."""

    async def ensure(self, ref: "BlobRef", *, priority: float = 0.0) -> Path: ...

    def mark_consumed(self, digests: list[str], token: str) -> None: ...

    async def wait_for_room(self, timeout: float) -> None: ...

    def forget_plan(self, plan: "Plan") -> None: ...


class Plan:
    """One consumer's future reads of one dataset (positions index ``order``).

    ``window_bytes`` caps how far ahead of the cursor it stages, ``floor_bytes`` is staged ahead
    whatever the consumer's rate, and ``ahead_seconds`` of the consumer's rate past the floor in
    between; ``clock`` is the rate's time base (tests pass their own).
    """

    def __init__(self, ctx: "FetchContext", owner: PlanOwner, dataset: "Dataset",
                 order: Sequence[int] | np.ndarray | None, window_bytes: int, name: str, *,
                 floor_bytes: int = 0, ahead_seconds: float = DEFAULT_AHEAD_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        manifest = dataset.manifest
        self._ctx = ctx
        self._owner = owner
        self.dataset = dataset
        self.name = name
        self.order = np.arange(len(manifest), dtype=np.int64) if order is None else np.asarray(order, dtype=np.int64)
        if len(self.order) and (self.order.min() < 0 or self.order.max() >= len(manifest)):
            raise StagerError(f"plan {name}: positions outside the manifest's {len(manifest)} shards")
        try:
            self.bounds = ReadAhead(window_bytes, floor_bytes, ahead_seconds)
        except ValueError as exc:
            raise StagerError(f"plan {name}: {exc}") from None
        #: The most it stages ahead of its cursor (its byte window), the least, and the seconds of
        #: the consumer's reading it stages in between (see :mod:`.read_ahead`).
        self.window_bytes, self.floor_bytes = self.bounds.cap_bytes, self.bounds.floor_bytes
        self.ahead_seconds = self.bounds.seconds
        self.consumption = ConsumptionRate(clock)
        self.cursor = 0
        self._ends = np.cumsum(manifest.sizes[self.order]) if len(self.order) else np.zeros(0, np.int64)
        self._moved = asyncio.Event()
        #: Set by every move of the cursor and the end of every fetch the prefetcher started: what it
        #: waits for. (Waiting on all its fetches at once with ``asyncio.wait`` hooked and unhooked a
        #: callback on each of them at every wake-up: with a hundred or more in flight behind a slow
        #: origin, a scan per finished shard.)
        self._changed = asyncio.Event()
        #: Set while the prefetcher has asked for every blob of its window and none is in flight
        #: (cleared by a move of the cursor until the prefetcher has seen it).
        self.idle = asyncio.Event()
        self._positions_of: dict[str, int] | None = None
        self._window_digests: tuple[int, int, frozenset[str]] | None = None  # (cursor, end, digests)
        self._window_end = (-1, -1, 0)  # (cursor, ahead bytes, end): the last window_end, asked again and again
        self.last_error: BaseException | None = None
        self._task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self.order)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._prefetch(), name=f"prefetch {self.name}")

    @property
    def rate(self) -> float | None:
        """The consumer's measured rate, bytes of the order per second; None before the cursor has moved."""
        return self.consumption.rate

    @property
    def ahead_bytes(self) -> int:
        """How far ahead of the cursor the plan stages now: the effective window."""
        return self.bounds.bytes_for(self.consumption.rate)

    def window_end(self) -> int:
        """First position past the window that starts at the cursor (always past the cursor)."""
        cursor = self.cursor
        if cursor >= len(self.order):
            return len(self.order)
        ahead = self.ahead_bytes
        last_cursor, last_ahead, last_end = self._window_end
        if cursor == last_cursor and ahead == last_ahead:  # every blob's begin asks (protected_digests)
            return last_end
        base = self._ends[cursor - 1] if cursor else 0
        end = min(len(self.order), max(int(np.searchsorted(self._ends, base + ahead, side="right")), cursor + 1))
        self._window_end = (cursor, ahead, end)
        return end

    def window_digests(self) -> frozenset[str]:
        """The digests of the blobs in the window, made once per window (every blob's reservation of
        room asks for them: made anew each time, a plan of thousands of shards cost seconds of CPU)."""
        start, end = self.cursor, self.window_end()
        made = self._window_digests
        if made is None or made[0] != start or made[1] != end:
            m = self.dataset.manifest
            made = self._window_digests = (start, end, frozenset(m.digest(int(i)) for i in self.order[start:end]))
        return made[2]

    def next_use(self, digest: str) -> int | None:
        """Positions from the cursor to the next use of ``digest``; None if the plan no longer needs it."""
        if self._positions_of is None:  # built only when eviction needs it
            m = self.dataset.manifest
            self._positions_of = {}
            for pos in range(len(self.order) - 1, -1, -1):
                self._positions_of[m.digest(int(self.order[pos]))] = pos
        pos = self._positions_of.get(digest)
        return None if pos is None or pos < self.cursor else pos - self.cursor

    def advance(self, position: int) -> None:
        """The consumer is done with every position before ``position``."""
        position = min(position, len(self.order))
        if position <= self.cursor:
            return
        m = self.dataset.manifest
        consumed = [m.digest(int(i)) for i in self.order[self.cursor:position]]
        before = self._ends[self.cursor - 1] if self.cursor else 0
        self.consumption.passed(int(self._ends[position - 1] - before))
        self.cursor = position
        self._owner.mark_consumed(consumed, self.name)
        if self._task is not None and not self._task.done():  # one that has ended has staged the whole order
            self.idle.clear()  # until the prefetcher has looked at the moved window
        self._moved.set()
        self._changed.set()

    def ref(self, position: int):
        return self.dataset.ref(int(self.order[position]))

    async def ready(self, position: int, *, urgent: bool = True) -> Path:
        """The cache path of the blob at ``position``, fetching it urgently if needed.

        ``urgent=False``: a caller waiting for the plan to get there (``stager stage``) rather than
        blocked on it: the blob is fetched at its place in the plan's order, as the read-ahead would,
        so blobs complete one after the other instead of all together at the end.

        Raises:
            OriginError: the blob could not be fetched within the retry budget.
            DiskFull: the disk holding the cache is full (at once: waiting would not make room).
            CacheError: the cache cannot hold it.
        """
        ref = self.ref(position)
        cache = self._ctx.cache
        if cache.state(ref.digest) is BlobState.COMPLETE:
            return cache.complete_path(ref.digest)
        began = time.monotonic()
        deadline = began + self._ctx.config.retry.deadline
        try:
            while True:
                try:
                    return await self._owner.ensure(ref, priority=URGENT if urgent
                                                    else float(max(0, position - self.cursor)))
                except DiskFull as exc:
                    if str(cache.directory) in str(exc):
                        raise
                    raise DiskFull(f"{ref.path}: the disk holding the cache at {cache.directory} is full: "
                                   f"{exc}") from exc
                except CacheFull:
                    # The cache is full of blobs being fetched or still in use: wait for one to be
                    # done (or consumed) rather than fail the consumer, up to the retry deadline.
                    if time.monotonic() >= deadline:
                        raise
                    await self._owner.wait_for_room(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
        finally:
            self._ctx.stats.consumer_wait_seconds += time.monotonic() - began
            self._ctx.stats.consumer_waits += 1

    async def _prefetch(self) -> None:
        ctx, owner = self._ctx, self._owner
        cache = ctx.cache
        in_flight: dict[int, asyncio.Task] = {}
        next_pos = 0
        try:
            while True:
                self._moved.clear()
                next_pos = max(next_pos, self.cursor)
                end = self.window_end()
                limit = max(2, ctx.gate.limit * 2)  # blob jobs in flight: follows the adaptive limit
                while next_pos < end and len(in_flight) < limit:
                    ref = self.ref(next_pos)
                    if cache.state(ref.digest) is not BlobState.COMPLETE:
                        task = asyncio.create_task(owner.ensure(ref, priority=float(next_pos - self.cursor)))
                        task.add_done_callback(self._fetch_ended)
                        in_flight[next_pos] = task
                    next_pos += 1
                if in_flight:
                    self.idle.clear()
                else:  # the scheduling above stops early only with fetches in flight: the window is asked for
                    self.idle.set()
                if next_pos >= len(self.order) and not in_flight:
                    return
                await self._changed.wait()  # a fetch ended or the cursor moved (maybe before the wait began)
                self._changed.clear()  # before looking: what ends from here on sets it again
                for pos, task in list(in_flight.items()):
                    if not task.done():
                        continue
                    del in_flight[pos]
                    error = task.exception()
                    if isinstance(error, CacheFull) and pos >= self.cursor:
                        ctx.stats.cache_full_waits += 1
                        next_pos = min(next_pos, pos)  # retry once the consumer frees room
                        await self._wait_moved(timeout=1.0)
                    elif error is not None:
                        self.last_error = error
                        log.warning("prefetch of %s failed (the consumer will retry it): %s",
                                    self.ref(pos).path, error)
        finally:
            for task in in_flight.values():
                task.cancel()

    def _fetch_ended(self, _task: asyncio.Task) -> None:
        self._changed.set()

    async def _wait_moved(self, timeout: float) -> None:
        await wait_until_set(self._moved, timeout)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._owner.forget_plan(self)
