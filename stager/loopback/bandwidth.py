"""A shared bandwidth cap for the fault proxy.

How it works: a virtual clock. Each chunk about to be sent reserves the time
slot ``nbytes / rate`` right after the previous reservation (or now, if the
link has been idle: no burst credit is saved up), and the sender sleeps until
its slot ends. All connections of one proxy share one limiter and one event
loop, so together they never exceed the rate. The rate is passed per call, so
a plan change takes effect on the next chunk.
"""

from __future__ import annotations

import asyncio


class BandwidthLimiter:
    """Cap the combined throughput of callers on one event loop."""

    def __init__(self) -> None:
        self._next_free = 0.0

    @staticmethod
    def chunk_size(rate_bps: float | None, default: int = 64 * 1024) -> int:
        """A chunk size that keeps the shaped stream smooth (about 20 slots/s)."""
        if not rate_bps:
            return default
        return int(min(default, max(1024, rate_bps / 20)))

    async def consume(self, nbytes: int, rate_bps: float | None) -> None:
        """Wait until ``nbytes`` may be sent at ``rate_bps`` (None: no wait)."""
        if not rate_bps or nbytes <= 0:
            return
        now = asyncio.get_running_loop().time()
        start = max(now, self._next_free)
        self._next_free = start + nbytes / rate_bps
        await asyncio.sleep(self._next_free - now)


class TransferShaper:
    """One transfer's shaping: its own cap (``connection_bps``) and the proxy's shared one.

    Each transfer gets its own :class:`BandwidthLimiter` for the per-connection
    cap, so one slow stream never holds back another, while the shared limiter
    keeps their sum under the aggregate cap.
    """

    def __init__(self, shared: BandwidthLimiter, aggregate_bps: float | None, connection_bps: float | None) -> None:
        self._shared = shared
        self._own = BandwidthLimiter()
        self._aggregate = aggregate_bps
        self._connection = connection_bps
        rates = [r for r in (aggregate_bps, connection_bps) if r]
        self.chunk_size = BandwidthLimiter.chunk_size(min(rates) if rates else None)

    async def consume(self, nbytes: int) -> None:
        """Wait until ``nbytes`` may be sent under both caps."""
        await self._own.consume(nbytes, self._connection)
        await self._shared.consume(nbytes, self._aggregate)
