"""A concurrency gate that lets the most urgent waiter in first, with a limit that can move.

The engine bounds how many block requests are in flight. When a slot frees up,
it goes to the waiter with the lowest priority value: a consumer blocked on a
block (priority 0) overtakes read-ahead for the distant future. Ties are served
in arrival order. Cancellation is safe: a cancelled waiter leaves the queue,
and a slot handed to a waiter that was cancelled at that moment is passed on.

The limit is not fixed: given a :class:`~.concurrency.ConcurrencyController`,
the gate reports each finished slot (how long it was held, how many bytes it
moved) and takes the limit the controller answers. A higher limit lets waiters
in at once, still most urgent first; a lower one takes effect as holders leave
(nobody is interrupted). Whatever the limit, the queue order is the priority
order, so urgent reads overtake prefetch at any concurrency.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, AsyncIterator

if TYPE_CHECKING:
    from .concurrency import ConcurrencyController


class PriorityGate:
    """At most ``limit`` holders at once; waiters enter by (priority, arrival).

    Args:
        limit: the holders allowed at once (the controller's initial limit if one is given).
        controller: moves the limit as slots finish (None: the limit stays fixed).
    """

    def __init__(self, limit: int, controller: "ConcurrencyController | None" = None) -> None:
        self.controller = controller
        self._limit = controller.initial if controller is not None else limit
        self._holders = 0
        self._waiters: list[tuple[float, int, asyncio.Future[None], object]] = []
        #: Waiters still waiting: the heap also holds those cancelled, until a grant pops them. Counted,
        #: not summed over the heap: every acquire and every finished slot asks, and with hundreds of
        #: blob jobs queued (thousands of small shards) the sum was a scan per request.
        self._waiting = 0
        self._arrivals = itertools.count()
        self._frozen = False
        self.peak_holders = 0

    @property
    def limit(self) -> int:
        """Holders allowed at once now."""
        return self._limit

    @property
    def holders(self) -> int:
        """Slots taken now (requests in flight)."""
        return self._holders

    @property
    def waiting(self) -> int:
        return self._waiting

    def set_limit(self, limit: int) -> None:
        """Allow ``limit`` holders (at least 1); waiters enter at once if there is room now."""
        if self._frozen:
            return
        self._limit = max(1, int(limit))
        self._grant()

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
        """Wait for a slot (most urgent first); pair with :meth:`release`."""
        if self._holders < self._limit and not self.waiting:
            self._take()
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (priority, next(self._arrivals), future, owner))
        self._waiting += 1
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # granted just as we were cancelled: pass the slot on
            else:
                self._waiting -= 1  # its entry stays in the heap until a grant pops it
            raise

    def release(self) -> None:
        """Give a slot back; the most urgent waiter gets it if the limit allows."""
        self._holders -= 1
        self._grant()

    async def hold_all(self, priority: float = float("-inf")) -> None:
        """Freeze the limit and take every slot: requests in flight finish, none starts (for a drain)."""
        self._frozen = True
        for _ in range(self._limit):
            await self.acquire(priority)

    def _take(self) -> None:
        self._holders += 1
        self.peak_holders = max(self.peak_holders, self._holders)

    def _grant(self) -> None:
        while self._waiters and self._holders < self._limit:
            _, _, future, _ = heapq.heappop(self._waiters)
            if not future.done():
                self._waiting -= 1
                self._take()
                future.set_result(None)

    def _finished(self, seconds: float, nbytes: int, ok: bool) -> None:
        controller = self.controller
        if controller is None or self._frozen:
            return
        saturated = self._holders >= self._limit or bool(self.waiting)
        self.set_limit(controller.on_done(seconds, nbytes, saturated, ok))

    def release_after(self, seconds: float, nbytes: int, ok: bool) -> None:
        """Give back a slot taken with :meth:`acquire` that was held ``seconds`` and moved ``nbytes``
        (told to the controller, as :meth:`slot` does)."""
        self._finished(seconds, nbytes, ok)
        self.release()

    @asynccontextmanager
    async def slot(self, priority: float = 0.0, owner: object = None, nbytes: int = 0) -> AsyncIterator[None]:
        """Hold a slot for the body of the ``async with``; ``nbytes`` is what it moves (for the controller)."""
        await self.acquire(priority, owner)
        began = time.monotonic()
        ok = False
        try:
            yield
            ok = True
        finally:
            self.release_after(time.monotonic() - began, nbytes, ok)
