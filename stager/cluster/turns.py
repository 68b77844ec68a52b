"""Turns at a shared resource, given to the waiter whose key is least *when a turn frees up*.

The engine's :class:`~stager.engine.gate.PriorityGate` fixes a waiter's
priority when it starts waiting. The cluster's send queues need keys that
move while their waiters wait: a block's copy count grows as other peers
are sent it, a request becomes urgent when a consumer blocks on it. So
:class:`Turns` evaluates every waiter's key each time it hands out a turn
(the queues are short: at most a few per peer), ties by arrival.

A low priority must not mean never: a waiter passed over ``max_overtaken``
times, or waiting ``max_wait`` seconds, goes next (those overdue in arrival
order). The bound keeps a request that became urgent after it was sent,
and any request behind a stream of fresher work, within its asker's
deadlines. Cancellation is safe: a cancelled waiter leaves the queue, and
a turn handed to one cancelled at that moment is passed on.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any


class _Waiter:
    __slots__ = ("key", "arrival", "since", "future", "overtaken")

    def __init__(self, key: Callable[[], Any], arrival: int, since: float, future: asyncio.Future[None]) -> None:
        self.key = key
        self.arrival = arrival
        self.since = since
        self.future = future
        self.overtaken = 0


class Turns:
    """At most ``limit`` holders at once; a freed turn goes to the waiter with the least ``key()`` now.

    Args:
        limit: holders at once (>= 1).
        max_overtaken: turns a waiter lets others take before it goes next (None: no bound).
        max_wait: seconds after which a waiter goes next (None: no bound).
        clock: for tests.
    """

    def __init__(self, limit: int, *, max_overtaken: int | None = None, max_wait: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.limit = limit
        self.max_overtaken = max_overtaken
        self.max_wait = max_wait
        self._clock = clock
        self._holders = 0
        self._waiters: list[_Waiter] = []
        self._arrivals = itertools.count()
        self.granted = 0  # turns handed out in all (for tests)
        self.overdue_grants = 0  # of which to a waiter that had waited its bound

    @property
    def holders(self) -> int:
        return self._holders

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiters if not w.future.done())

    @asynccontextmanager
    async def turn(self, key: Callable[[], Any]) -> AsyncIterator[None]:
        """Hold a turn for the body of the ``async with``; ``key()`` orders the waiters (least first)."""
        await self.acquire(key)
        try:
            yield
        finally:
            self.release()

    async def acquire(self, key: Callable[[], Any]) -> None:
        """Wait for a turn; pair with :meth:`release`."""
        if self._holders < self.limit and not self.waiting:
            self._take()
            return
        waiter = _Waiter(key, next(self._arrivals), self._clock(), asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        try:
            await waiter.future
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled():
                self.release()  # granted just as we were cancelled: pass the turn on
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        """Give a turn back; the waiter that ranks first now gets it."""
        self._holders -= 1
        self._grant()

    def _take(self) -> None:
        self._holders += 1
        self.granted += 1

    def _overdue(self, waiter: _Waiter, now: float) -> bool:
        return (self.max_overtaken is not None and waiter.overtaken >= self.max_overtaken) \
            or (self.max_wait is not None and now - waiter.since >= self.max_wait)

    def _grant(self) -> None:
        while self._holders < self.limit:
            self._waiters = [w for w in self._waiters if not w.future.done()]
            if not self._waiters:
                return
            now = self._clock()
            overdue = [w for w in self._waiters if self._overdue(w, now)]
            if overdue:
                chosen = min(overdue, key=lambda w: w.arrival)
                self.overdue_grants += 1
            else:
                chosen = min(self._waiters, key=lambda w: (w.key(), w.arrival))
            self._waiters.remove(chosen)
            for other in self._waiters:
                other.overtaken += 1
            self._take()
            chosen.future.set_result(None)
