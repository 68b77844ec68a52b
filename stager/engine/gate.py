"""A concurrency gate that lets the most urgent waiter in first.

The engine bounds how many block requests are in flight. When a slot frees up,
it goes to the waiter with the lowest priority value: a consumer blocked on a
block (priority 0) overtakes read-ahead for the distant future. Ties are served
in arrival order. Cancellation is safe: a cancelled waiter leaves the queue,
and a slot handed to a waiter that was cancelled at that moment is passed on.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from contextlib import asynccontextmanager
from typing import AsyncIterator


class PriorityGate:
    """At most ``limit`` holders at once; waiters enter by (priority, arrival)."""

    def __init__(self, limit: int) -> None:
        self._free = limit
        self._waiters: list[tuple[float, int, asyncio.Future[None], object]] = []
        self._arrivals = itertools.count()

    @property
    def waiting(self) -> int:
        return sum(1 for _, _, f, _ in self._waiters if not f.done())

    def boost(self, owner: object, priority: float) -> None:
        """Raise the priority of every waiter of ``owner`` (a consumer now blocks on it)."""
        changed = False
        for i, (old, seq, future, who) in enumerate(self._waiters):
            if who is owner and priority < old:
                self._waiters[i] = (priority, seq, future, who)
                changed = True
        if changed:
            heapq.heapify(self._waiters)

    async def acquire(self, priority: float = 0.0, owner: object = None) -> None:
        if self._free > 0 and not self.waiting:
            self._free -= 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (priority, next(self._arrivals), future, owner))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release_one()  # granted just as we were cancelled: pass the slot on
            raise

    def release(self) -> None:
        self._release_one()

    def _release_one(self) -> None:
        while self._waiters:
            _, _, future, _ = heapq.heappop(self._waiters)
            if not future.done():
                future.set_result(None)
                return
        self._free += 1

    @asynccontextmanager
    async def slot(self, priority: float = 0.0, owner: object = None) -> AsyncIterator[None]:
        await self.acquire(priority, owner)
        try:
            yield
        finally:
            self.release()
