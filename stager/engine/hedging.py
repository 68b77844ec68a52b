"""Hedged requests: race a straggler with a second request, keep the first answer.

Object stores have long tails: most block GETs take about the same time, and a
few take ten times longer for no reason of ours. :class:`LatencyTracker` keeps
the recent request durations, normalised per MiB (so requests of different
size compare) and per request in flight beside it (its *sharing*: where the
link or our own CPU is the bottleneck, three times the requests take three
times as long each, and none of them is a straggler); when a request has run
longer than ``p95 * factor`` (never less than ``min_delay``), :func:`hedged`
starts a second, identical request and returns whichever finishes first,
cancelling the other. The delay is asked again when it runs out, so a request
whose neighbours multiplied meanwhile (the concurrency controller's slow
start) is given the longer delay they brought. Until enough samples exist
nothing is hedged, so a cold start does not double the load.

A false hedge is not free: it moves the same bytes twice, holds them in memory
until the first request has stopped, and takes CPU and link from the requests
that were merely sharing them (measured on loopback, before the sharing was
counted: 10 to 25 hedges per GiB, the runs with them 20 to 30% slower).
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections import deque
from typing import Awaitable, Callable, TypeVar

T = TypeVar("T")

MiB = 1 << 20
#: An urgent request's hedge delay, per MiB, while there are too few samples for a percentile.
COLD_URGENT_SECONDS_PER_MIB = 0.5


class LatencyTracker:
    """Recent per-MiB request durations and their 95th percentile."""

    def __init__(self, samples: int = 256, min_samples: int = 16) -> None:
        self._recent: deque[float] = deque(maxlen=samples)
        self._sorted: list[float] = []
        self._min_samples = min_samples

    def record(self, seconds: float, nbytes: int, sharing: float = 1.0) -> None:
        """A request of ``nbytes`` took ``seconds`` beside ``sharing`` requests in flight (itself included)."""
        value = seconds / max(nbytes / MiB, 1 / 64) / max(1.0, sharing)
        if len(self._recent) == self._recent.maxlen:
            old = self._recent[0]
            del self._sorted[bisect.bisect_left(self._sorted, old)]
        self._recent.append(value)
        bisect.insort(self._sorted, value)

    def p95(self) -> float | None:
        if len(self._sorted) < self._min_samples:
            return None
        return self._sorted[min(len(self._sorted) - 1, int(len(self._sorted) * 0.95))]

    def hedge_delay(self, nbytes: int, factor: float, min_delay: float, *, urgent: bool = False,
                    sharing: float = 1.0) -> float | None:
        """Seconds after which a request of ``nbytes`` beside ``sharing`` requests in flight (itself
        included) counts as a straggler; None: do not hedge yet.

        Before enough samples exist, only an ``urgent`` request (a consumer blocked on it) is hedged,
        after :data:`COLD_URGENT_SECONDS_PER_MIB` a MiB: a cold start served block by block as it
        arrives has its consumer waiting on its very first requests, where one latency spike or
        retried error would otherwise stall it for all of its length.
        """
        p95 = self.p95()
        if p95 is None:
            return max(min_delay, COLD_URGENT_SECONDS_PER_MIB * max(nbytes / MiB, 1 / 64)) if urgent else None
        return max(min_delay, p95 * max(nbytes / MiB, 1 / 64) * max(1.0, sharing) * factor)


async def hedged(make: Callable[[], Awaitable[T]], delay: float | None | Callable[[], float | None],
                 on_hedge: Callable[[], None] | None = None, *,
                 make_hedge: Callable[[], Awaitable[T]] | None = None) -> tuple[T, bool]:
    """Run ``make()``; if it is still running after ``delay`` seconds, race a second request.

    ``delay`` may be a function, asked at the start and again each time the delay it gave
    runs out (from the start of the request): the request is hedged once it has run longer
    than the latest answer; None at any point means not to hedge it.

    The second request is ``make_hedge()`` if given (a request that must not
    collide with the first, e.g. one that keeps its bytes in memory while the
    first writes them to disk), else ``make()`` again. Returns the first
    successful result and whether the hedge won. If one attempt fails, the
    other is still awaited; if both fail, the first error is raised. The loser
    is cancelled and awaited to its end before this returns (cancelling the
    caller cancels both, and also waits for them), so nothing it started is
    still running afterwards.
    """
    due = delay if callable(delay) else (lambda: delay)
    began = time.monotonic()
    first = asyncio.ensure_future(make())
    tasks = [first]
    try:
        while True:  # each round either ends, hedges, or waits out a longer delay than the last
            wait = due()
            if wait is None:
                return await first, False
            remaining = wait - (time.monotonic() - began)
            if remaining <= 0:
                break
            done, _ = await asyncio.wait({first}, timeout=remaining)
            if done:
                return first.result(), False
        if on_hedge:
            on_hedge()
        second = asyncio.ensure_future((make_hedge or make)())
        tasks.append(second)
        pending = {first, second}
        error: BaseException | None = None
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task.exception() is None:
                    return task.result(), task is second
                error = error or task.exception()
        assert error is not None
        raise error
    finally:
        await _cancel_and_wait([task for task in tasks if not task.done()])


async def _cancel_and_wait(tasks: list[asyncio.Future]) -> None:
    """Cancel ``tasks`` and wait until they have ended, even if the caller is cancelled meanwhile."""
    if not tasks:
        return
    for task in tasks:
        task.cancel()
    try:
        await asyncio.wait(tasks)
    except asyncio.CancelledError:
        await asyncio.wait(tasks)
        raise
    finally:
        for task in tasks:
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: a loser's failure is not an unhandled error
