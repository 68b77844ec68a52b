"""An async token bucket that caps the bytes per second of one store.

Every request of the store asks for its bytes before it is sent. A request
larger than the bucket still goes through: the bucket goes into debt and
later callers wait it off, so the average rate holds for any request size
and callers are served in arrival order (each one's wait is fixed when it
asks). A cancelled caller gives back the bytes it did not use.
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable


class BandwidthLimiter:
    """Cap the average rate at ``rate_bytes_per_s``, with bursts up to ``burst`` bytes.

    Args:
        rate_bytes_per_s: the average rate, > 0.
        burst: bytes that may go at once after an idle period (default: 1/4 s worth).
        clock, sleep: injectable for tests.
    """

    __slots__ = ("_rate", "_burst", "_tokens", "_stamp", "_clock", "_sleep")

    def __init__(
        self,
        rate_bytes_per_s: float,
        *,
        burst: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        if rate_bytes_per_s <= 0:
            raise ValueError(f"bandwidth must be > 0 bytes/s, got {rate_bytes_per_s}")
        self._rate = float(rate_bytes_per_s)
        self._burst = float(burst if burst is not None else rate_bytes_per_s / 4)
        self._tokens = self._burst
        self._clock = clock
        self._sleep = sleep
        self._stamp = clock()

    @property
    def rate(self) -> float:
        """Bytes per second."""
        return self._rate

    async def acquire(self, nbytes: int) -> None:
        """Wait until ``nbytes`` may be transferred under the cap."""
        if nbytes <= 0:
            return
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._stamp) * self._rate)
        self._stamp = now
        self._tokens -= nbytes
        if self._tokens >= 0:
            return
        try:
            await self._sleep(-self._tokens / self._rate)
        except asyncio.CancelledError:
            self._tokens += nbytes
            raise
