"""Retrying origin operations: exponential backoff with full jitter, a deadline, per-attempt timeouts.

:class:`RetryPolicy` is the only place in stager that retries an origin, so
the lower libraries' own retries are turned off (see ``fsspec_store``). One
call to :meth:`RetryPolicy.run` is one logical operation (a block, a HEAD, a
PUT); each attempt runs under ``request_timeout`` and all attempts together
under ``deadline``. What is retried, and how:

- :class:`~stager.errors.Throttled`: backoff with a longer base (the origin
  asked us to slow down), or the origin's ``Retry-After`` if it gave one;
- :class:`~stager.errors.TransientOriginError` and an attempt that timed out:
  backoff ``uniform(0, min(backoff_max, backoff_base * 2**n))``;
- :class:`~stager.errors.CorruptData` (``check`` rejected the body): the same;
  if the budget runs out on it, :class:`~stager.errors.OriginChanged`;
- anything else (not found, denied, invalid range, a final error raised by a
  nested policy, a bug) propagates at once.

Cancellation is never caught: a cancelled caller stops at once, mid-attempt
or mid-sleep.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Awaitable, Callable, TypeVar

from ..config import RetryConfig
from ..errors import (
    AccessDenied,
    CorruptData,
    OriginChanged,
    OriginError,
    OriginUnavailable,
    ShardNotFound,
    Throttled,
    TransientOriginError,
)
from .stats import OriginStats

T = TypeVar("T")

#: Throttling backs off this many times longer than other transient failures.
THROTTLE_FACTOR = 4.0


class RetryPolicy:
    """Run origin operations under a :class:`~stager.config.RetryConfig`.

    Args:
        config: attempts, backoff, deadline, per-request timeout.
        stats: counters to update (one per attempt, plus retries and give-ups).
        sleep, random, clock: injectable for tests (``random()`` in [0, 1)).
    """

    __slots__ = ("config", "stats", "limit", "_sleep", "_random", "_clock")

    def __init__(
        self,
        config: RetryConfig | None = None,
        *,
        stats: OriginStats | None = None,
        concurrency: int | None = None,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        random: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config or RetryConfig()
        self.stats = stats if stats is not None else OriginStats()
        # Attempts in flight at once. Taken *before* an attempt's timeout starts,
        # so waiting for a free connection or thread never counts as a slow origin.
        self.limit = asyncio.Semaphore(concurrency) if concurrency else None
        self._sleep = sleep
        self._random = random
        self._clock = clock

    def backoff(self, attempt: int, error: BaseException) -> float:
        """The delay before retrying after failed attempt number ``attempt`` (1-based)."""
        cfg = self.config
        base = cfg.backoff_base * (THROTTLE_FACTOR if isinstance(error, Throttled) else 1.0)
        ceiling = min(cfg.backoff_max, base * 2 ** (attempt - 1))
        delay = self._random() * ceiling
        retry_after = getattr(error, "retry_after", None)
        if isinstance(error, Throttled) and retry_after:
            delay = max(delay, min(float(retry_after), cfg.backoff_max))
        return delay

    async def run(self, op: Callable[[], Awaitable[T]], *, what: str) -> T:
        """Await ``op()`` until it succeeds, fails for good, or the budget runs out.

        Args:
            op: makes one attempt; called anew for each attempt. It must not itself
                wait on this policy: it holds one of the ``concurrency`` slots.
            what: names the operation in errors (``"data/shard-7.bin [0, 8388608)"``).

        Raises:
            ShardNotFound, AccessDenied, and any non-transient error of ``op``: at once.
            OriginUnavailable: transient failures or timeouts outlasted the attempts or the deadline.
            OriginChanged: as above, and the last failure was a body that failed ``check``.
        """
        cfg = self.config
        stats = self.stats
        started = self._clock()
        deadline = started + cfg.deadline
        last: BaseException | None = None
        attempt = 0
        while attempt < cfg.attempts:
            if deadline - self._clock() <= 0:
                break
            attempt += 1
            try:
                if self.limit is None:
                    result = await self._attempt(op, deadline)
                else:
                    async with self.limit:
                        result = await self._attempt(op, deadline)
            except Throttled as exc:
                stats.throttled += 1
                last = exc
            except TransientOriginError as exc:
                stats.transient += 1
                last = exc
            except _AttemptTimedOut as exc:
                stats.transient += 1
                # An attempt the deadline cut short says nothing an earlier failure did not: that one,
                # not "no answer within 0.0008s", is what the final error names.
                if last is None or exc.timeout >= cfg.request_timeout:
                    last = TransientOriginError(f"{what}: no answer within {exc.timeout:.3g}s")
                    last.__cause__ = exc.__cause__
            except OriginChanged:
                stats.corrupt += 1
                raise
            except CorruptData as exc:
                stats.corrupt += 1
                last = exc
            except ShardNotFound:
                stats.not_found += 1
                raise
            except AccessDenied:
                stats.denied += 1
                raise
            except OriginError:
                stats.failed += 1
                raise
            else:
                stats.ok += 1
                return result
            if attempt >= cfg.attempts:
                break
            delay = self.backoff(attempt, last)
            if self._clock() + delay >= deadline:
                break
            stats.retries += 1
            await self._sleep(delay)
        stats.gave_up += 1
        elapsed = self._clock() - started
        summary = f"{what}: gave up after {attempt} attempt(s) in {elapsed:.1f}s"
        if isinstance(last, CorruptData):
            raise OriginChanged(f"{summary}; the origin keeps sending bytes that fail verification: {last}") from last
        if last is None:
            raise OriginUnavailable(f"{summary}: retry deadline of {cfg.deadline:g}s already spent")
        raise OriginUnavailable(f"{summary}; last error: {last}") from last

    async def _attempt(self, op: Callable[[], Awaitable[T]], deadline: float) -> T:
        timeout = min(self.config.request_timeout, deadline - self._clock())
        if timeout <= 0:
            raise _AttemptTimedOut(0.0)
        try:
            async with asyncio.timeout(timeout):
                return await op()
        except TimeoutError as exc:
            # Only our own timeout can land here: stores translate the ones of their libraries.
            raise _AttemptTimedOut(timeout) from exc


class _AttemptTimedOut(Exception):
    """An attempt ran out of time (internal to :class:`RetryPolicy`)."""

    def __init__(self, timeout: float) -> None:
        super().__init__(timeout)
        self.timeout = timeout
