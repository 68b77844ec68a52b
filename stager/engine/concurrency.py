"""Adaptive concurrency: how many requests to keep in flight, learned from the origin.

A loopback origin is fastest with a few requests in flight; a real object
store caps each connection (tens of MB/s) and takes tens of milliseconds to
the first byte, so filling a fast link needs many more; and a store that
answers ``503 SlowDown`` needs fewer. No fixed number is right everywhere, so
the engine's :class:`~.gate.PriorityGate` (and each side of replicate's
copier) is driven by a :class:`ConcurrencyController`, a gradient controller
in the manner of TCP Vegas:

* Each finished request reports how long it held its slot and how many bytes
  it moved. Its *seconds per byte* is the signal: while the bottleneck is each
  connection, adding requests leaves it flat; once the link (or the origin, or
  our own CPU and disk) is the bottleneck, it rises in proportion. Only
  requests of at least half the full request size count this way; shorter
  ones (a blob's tail, one urgent block, replicate's small objects) are
  judged apart by their seconds alone, so their first-byte latency is not
  mistaken for a queue.
* ``base`` is the lowest seconds-per-byte seen (drifting upwards while the
  limit is at its floor, so it can follow an origin that got slower) and
  ``recent`` a moving average. Real hold times are noisy (a tenth of a second
  either way on a busy host), so queueing only counts once ``recent`` exceeds
  ``TOLERANCE * base``: the gradient is ``min(1, TOLERANCE * base / recent)``.
* Slow start: from ``initial``, the limit grows by ``SLOW_START_GAIN`` per
  finished request (tripling each round trip) while the gate is saturated
  and the gradient stays 1; where the bytes are counted as they arrive
  (:meth:`ConcurrencyController.count_bytes`, the engine's verified blocks),
  it grows by one per ``SLOW_START_BYTES`` that arrive instead (doubling
  each time those in flight have delivered a block each), so a request of
  several seconds pays for more of them from its first block. After that, the limit
  moves towards ``limit * gradient + sqrt(limit)``: it keeps probing upwards
  while the latency does not rise, and backs off when it does.
* Slow start also ends when growing stopped paying: over windows in which
  each request in flight delivers a block (and at least
  ``SLOW_START_WINDOW``), the limit doubles; a window whose throughput is
  not ``SLOW_START_PAYOFF`` times the previous one's ends slow start, the
  limit going back to what that window began with (scaled by the little it
  gained). A bottleneck shared by all requests (the origin's CPU,
  a proxy, the link) stops them there instead of at the ceiling: a request
  takes long to end, so the latency signal alone came too late, after the
  bytes of one request had added dozens more.
* Where the :class:`MemoryBound` sees bytes queueing on this host (requests
  holding more than a couple of MiB each, or many connections paused for
  their consumer), the disk or the CPU here is the bottleneck: slow start
  ends and probing stops, since more requests would add memory, not bytes.
* A throttled attempt (``SlowDown``, counted by the store's retry policy)
  cuts the limit by ``THROTTLE_CUT`` at once, at most once per recent request
  duration, and ends slow start.
* Throughput is measured too, in windows of ``RATE_WINDOW``: rising latency
  is only a reason to back off where it brought no throughput, so latency
  never cuts the limit below the one at which the best throughput was seen
  (a host whose CPU is the bottleneck makes every request slower yet still
  moves more bytes with more of them).

The limit never exceeds ``ceiling`` (the user's ``--concurrency``) nor what a
:class:`MemoryBound` allows: the receive buffers that requests in flight hold
are measured, not assumed, so a capped link (where each request holds about a
buffer) gets many more requests than loopback (where each holds several,
queued for the disk) within the same budget. Latency alone never pushes the
limit below ``initial``; only throttling does (down to one). Everything is a few float operations per
finished request (or verified block) on the event loop, and the memory bound a
look at the receive pools' reference counts (a few microseconds): no per-byte
work, no task, no timer.
"""

from __future__ import annotations

import math
import time
from typing import Callable

#: Where the limit starts (or the ceiling, if lower).
INITIAL = 16
#: Bytes of receive buffers that requests in flight may hold together (see MemoryBound).
MEMORY_BUDGET = 192 << 20
#: What a request is taken to hold at least: its receive buffer.
MIN_FOOTPRINT = 1 << 20
#: Held per request beyond this, bytes queue on this host (for the disk or the CPU): more requests would
#: add memory, not throughput, so slow start ends. Measured: 1.3-1.5 MiB on links capped per connection,
#: about 5 on loopback.
QUEUED_FOOTPRINT = 2 << 20
#: At least this share of the connections receiving paused for their consumer (their answer queued a
#: couple of MiB): this host is the bottleneck, and slow start ends.
QUEUED_PAUSED = 0.25
#: Requests may take this much longer per byte than the best seen before it counts as a queue we cause.
TOLERANCE = 1.5
#: Slow start adds this many per finished request: the limit triples each round trip. Requests to an
#: object store take a second or more each, so a staging run lasts only a few round trips.
SLOW_START_GAIN = 2.0
#: Where bytes are counted as they arrive, slow start adds one request per this many bytes instead (as
#: TCP adds a segment per segment acknowledged; or SLOW_START_GAIN per request's worth, if requests are
#: smaller): the limit doubles each time those in flight have each delivered a block's worth, half a
#: second on a link of 2 MB/s per connection, not a whole request's.
SLOW_START_BYTES = 1 << 20
#: Slow start's throughput is compared over windows of at least this many seconds (and a block per request).
SLOW_START_WINDOW = 0.1
#: A slow-start window must bring this much more throughput than the one before, or slow start ends.
SLOW_START_PAYOFF = 1.25
#: Lowest gradient: one sample never cuts the limit by more than this factor.
MIN_GRADIENT = 0.5
#: On a throttled attempt the limit is multiplied by this.
THROTTLE_CUT = 0.5
#: Weight of a new target in the limit (and of a new duration in the mean duration).
SMOOTHING = 0.25
#: Weight of a new sample in ``recent``.
RECENT_SMOOTHING = 0.1
#: At the floor, ``base`` rises by this fraction per sample, so it forgets a faster past.
BASE_DRIFT = 0.01
#: A window's throughput must beat the best by this factor to move the latency floor up to its limit.
BEST_GAIN = 1.1
#: Seconds over which ``throughput_bps`` is measured.
RATE_WINDOW = 1.0


class MemoryBound:
    """What requests in flight cost in memory, measured: the bound on their number, and a sign of queueing.

    ``in_use`` tells the bytes of receive buffers held now (by requests filling
    them and by views on their way to the disk); ``receiving`` the requests
    holding them (not those still waiting for their first byte, which would
    make each look cheaper than it is); ``paused`` the connections paused for
    their consumer. The ratio of the first two is what one request costs here: about a buffer
    on a link capped per connection, several where bytes arrive faster than
    this host writes them (each connection pauses once its answer has queued
    a couple of MiB), so the same budget allows many more requests to a slow
    origin than to a fast one.
    """

    def __init__(self, budget: int, in_use: Callable[[], int], receiving: Callable[[], int],
                 paused: Callable[[], int] = lambda: 0) -> None:
        if budget <= 0:
            raise ValueError(f"memory budget must be > 0 bytes, got {budget}")
        self.budget = budget
        self._in_use = in_use
        self._receiving = receiving
        self._paused = paused

    def footprint(self) -> float:
        """Bytes held per request receiving now (at least a buffer's worth, MIN_FOOTPRINT)."""
        return max(MIN_FOOTPRINT, self._in_use() / max(1, self._receiving()))

    def cap(self) -> int:
        """Requests allowed by memory now (at least one)."""
        return max(1, int(self.budget // self.footprint()))

    def queueing(self) -> bool:
        """Bytes arrive faster than this host takes them: requests hold more than ``QUEUED_FOOTPRINT``
        each, or at least ``QUEUED_PAUSED`` of the connections receiving are paused for their consumer."""
        paused = self._paused()
        if paused and paused >= QUEUED_PAUSED * max(1, self._receiving()):
            return True
        return self.footprint() > QUEUED_FOOTPRINT


class ConcurrencyController:
    """Learns the number of requests to keep in flight; see the module docstring.

    Args:
        ceiling: never more than this many.
        initial: where to start (capped by ``ceiling``); latency alone never goes below it.
        slow_start: False: grow only by probing (``limit + sqrt(limit)`` while the latency holds),
            for a limit whose every slot costs something of its own (replicate's parts held).
        full_request: the size of a full request in bytes; shorter requests are judged apart, by
            their seconds alone (their first-byte latency would look like a queue per byte).
        throttled: returns the number of throttled attempts so far (a counter that only grows).
        memory: bounds the limit by the memory requests in flight hold (None: only ``ceiling`` does).
        clock: injectable for tests.
    """

    def __init__(self, ceiling: int, *, initial: int = INITIAL, full_request: int = 0,
                 throttled: Callable[[], int] = lambda: 0, memory: MemoryBound | None = None,
                 clock: Callable[[], float] = time.monotonic, slow_start: bool = True) -> None:
        if ceiling < 1:
            raise ValueError(f"concurrency ceiling must be >= 1, got {ceiling}")
        self.ceiling = ceiling
        self.initial = max(1, min(initial, ceiling))
        self._limit = float(self.initial)
        self._floor = float(self.initial)
        self._full_request = full_request
        self._throttled = throttled
        self._memory = memory
        self._clock = clock
        self._seen_throttles = throttled()
        self._cut_until = 0.0
        self._slow_start = slow_start
        # one more request per block's worth of bytes, or per half a request if requests are smaller
        self._slow_start_bytes = min(SLOW_START_BYTES, full_request / SLOW_START_GAIN) or SLOW_START_BYTES
        self._full = _Lane()  # requests of at least half the full size: seconds per byte
        self._short = _Lane()  # shorter ones (tails, single blocks, small objects): seconds
        self._duration = 0.0  # moving average of a request's seconds
        self._window_start = clock()
        self._window_bytes = 0
        self._last_done = self._window_start
        self._rate = 0.0
        self._fed = False  # bytes come through count_bytes (as they arrive), not at the end of requests
        self._best_rate = 0.0  # the highest throughput seen in one window...
        self._best_limit = 0.0  # ...and the limit it was seen at: latency alone never cuts below it
        self.peak = self.initial
        self.throttle_cuts = 0
        self._window = _SlowStartWindow(None, self._limit)

    @property
    def limit(self) -> int:
        """Requests to allow in flight now."""
        limit = min(self.ceiling, int(self._limit))
        if self._memory is not None:
            cap = self._memory.cap()
            if cap < limit:
                limit = cap
                self._limit = min(self._limit, cap + 1.0)  # growth is not banked above what memory allows
        return max(1, limit)

    @property
    def slow_start(self) -> bool:
        return self._slow_start

    @property
    def throughput_bps(self) -> float:
        """Bytes per second finished over the last second or so (0 once nothing finished for a while)."""
        if self._clock() - self._last_done > 2 * RATE_WINDOW:
            return 0.0
        return self._rate

    def on_done(self, seconds: float, nbytes: int, saturated: bool, ok: bool = True) -> int:
        """A request that held a slot ``seconds`` and moved ``nbytes`` ended; return the new limit.

        ``saturated``: every slot was taken (or someone waited) when it ended, so more
        requests could have run. ``ok`` false: it failed or was cancelled (only throttling counts).
        """
        now = self._clock()
        if not self._fed:
            self._count_bytes(now, nbytes if ok else 0)
        if self._throttle_seen(now):
            return self.limit
        if not ok or seconds <= 0 or nbytes < 0:
            return self.limit
        self._duration = seconds if not self._duration else self._duration + SMOOTHING * (seconds - self._duration)
        full = nbytes > 0 and nbytes * 2 >= self._full_request
        lane = self._full if full else self._short
        gradient = lane.gradient(seconds / nbytes if full else seconds, at_floor=self._limit <= self._floor)
        if self._slow_start:
            if gradient < 1.0:
                self._slow_start = False
            elif saturated and not self._fed:  # (fed: it grew with the bytes already)
                self._limit = min(float(self.ceiling), self._limit + SLOW_START_GAIN)
        if not self._slow_start:
            probe = saturated and not self._queueing()  # more requests would only queue on this host
            target = self._limit * gradient + (math.sqrt(self._limit) if probe else 0.0)
            self._limit += SMOOTHING * (target - self._limit)
        self._limit = min(float(self.ceiling), max(self._floor, self._best_limit, self._limit))
        self.peak = max(self.peak, self.limit)
        return self.limit

    def count_bytes(self, nbytes: int, saturated: bool = False) -> int:
        """Count ``nbytes`` that just arrived (smoother than counting whole requests as they end); return the limit.

        In slow start the growth then follows the bytes too (one request per ``SLOW_START_BYTES``): a
        request of several seconds starts paying for more of them with its first block, not its last.
        """
        self._fed = True
        now = self._clock()
        self._count_bytes(now, nbytes)
        if self._slow_start and saturated:
            if self._queueing():
                self._slow_start = False  # the bottleneck is this host: more requests would only queue
            else:
                self._limit = min(float(self.ceiling), self._limit + nbytes / self._slow_start_bytes)
                self._judge_growth(now, nbytes)
            self.peak = max(self.peak, self.limit)
        elif self._slow_start and self._window.start is not None:
            self._window = _SlowStartWindow(None, self._limit)  # not saturated: no throughput to judge it by
        return self.limit

    def _judge_growth(self, now: float, nbytes: int) -> None:
        """End slow start once a window's throughput did not pay for the doubling before it."""
        window = self._window
        if window.start is None:  # the first bytes of a window: it begins now (not with the connections'
            window.start = now    # set-up and first-byte wait, which would make the requests look slow)
            return
        window.nbytes += nbytes
        elapsed = now - window.start
        if elapsed < SLOW_START_WINDOW or window.nbytes < window.limit * self._slow_start_bytes:
            return
        rate = window.nbytes / elapsed
        if window.previous_rate and rate < window.previous_rate * SLOW_START_PAYOFF:
            self._slow_start = False  # the requests added brought no bytes: something they share is full
            self._limit = min(self._limit, window.limit * max(1.0, rate / window.previous_rate))
            return
        self._window = _SlowStartWindow(now, self._limit, rate)

    def _queueing(self) -> bool:
        return self._memory is not None and self._memory.queueing()

    def on_throttle(self) -> int:
        """Look for new throttled attempts now (a request is still waiting out its backoff); return the limit."""
        self._throttle_seen(self._clock())
        return self.limit

    def _throttle_seen(self, now: float) -> bool:
        count = self._throttled()
        if count <= self._seen_throttles:
            return False
        self._seen_throttles = count
        if now >= self._cut_until:  # one cut per round trip: the throttles of one burst arrive together
            self._limit = max(1.0, self._limit * THROTTLE_CUT)
            self._floor = min(self._floor, self._limit)
            self._best_limit = min(self._best_limit, self._limit)
            self._best_rate = 0.0  # what was best before the origin pushed back no longer holds
            self._slow_start = False
            self._cut_until = now + max(0.05, self._duration)
            self.throttle_cuts += 1
        return True

    def _count_bytes(self, now: float, nbytes: int) -> None:
        self._window_bytes += nbytes
        if nbytes:
            self._last_done = now
        elapsed = now - self._window_start
        if elapsed >= RATE_WINDOW:
            self._rate = self._window_bytes / elapsed
            self._window_start = now
            self._window_bytes = 0
            if self._rate > self._best_rate * BEST_GAIN:
                self._best_rate = self._rate
                self._best_limit = self._limit


class _SlowStartWindow:
    """One window of slow start: when it began, the limit then, the bytes since, the window before's rate."""

    __slots__ = ("start", "limit", "nbytes", "previous_rate")

    def __init__(self, start: float | None, limit: float, previous_rate: float = 0.0) -> None:
        self.start = start
        self.limit = limit
        self.nbytes = 0
        self.previous_rate = previous_rate


class _Lane:
    """The latency signal of one kind of request: its best (``base``) and its moving average (``recent``)."""

    __slots__ = ("base", "recent")

    def __init__(self) -> None:
        self.base: float | None = None
        self.recent: float | None = None

    def gradient(self, sample: float, at_floor: bool) -> float:
        """Take ``sample`` and return ``min(1, TOLERANCE * base / recent)`` (at least ``MIN_GRADIENT``)."""
        self.recent = sample if self.recent is None else self.recent + RECENT_SMOOTHING * (sample - self.recent)
        if self.base is None or sample < self.base:
            self.base = sample
        elif at_floor:
            # At the floor the latency is as good as we can make it: let the base follow a slower
            # origin. Nowhere else, or our own queue would creep into the base and the limit with it.
            self.base *= 1 + BASE_DRIFT
        if self.recent <= 0:
            return 1.0
        return max(MIN_GRADIENT, min(1.0, TOLERANCE * self.base / self.recent))
