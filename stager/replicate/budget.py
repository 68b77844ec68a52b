"""A cap on the bytes that transfers in flight hold in memory.

Every object or part being copied holds its size from the moment its read
starts until the destination has it and the journal says so. The cap bounds
the process's buffers whatever the object count or sizes, and it is also the
most a killed run can have in flight, hence the most a rerun copies again.
Waiters are served first come, first served, so a large part is not starved
by a stream of small objects.
"""

from __future__ import annotations

import asyncio
from collections import deque


class ByteBudget:
    """At most ``capacity`` bytes held at once; a request larger than that takes the whole budget."""

    __slots__ = ("_used", "_waiters", "capacity")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"byte budget must be >= 1, got {capacity}")
        self.capacity = capacity
        self._used = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    @property
    def used(self) -> int:
        return self._used

    async def acquire(self, nbytes: int) -> int:
        """Wait until ``nbytes`` fit; return what was granted (pass it to :meth:`release`)."""
        n = max(0, min(nbytes, self.capacity))
        if not self._waiters and self._used + n <= self.capacity:
            self._used += n
            return n
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (n, future)
        self._waiters.append(entry)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(n)  # granted, then cancelled before the caller saw it
            else:
                self._waiters.remove(entry)
                self._wake()
            raise
        return n

    def release(self, granted: int) -> None:
        """Give back what :meth:`acquire` granted."""
        self._used -= granted
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            n, future = self._waiters[0]
            if future.done():
                self._waiters.popleft()
                continue
            if self._used + n > self.capacity:
                return
            self._waiters.popleft()
            self._used += n
            future.set_result(None)
