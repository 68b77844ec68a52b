"""BandwidthLimiter: the average rate holds, bursts are bounded, cancellation refunds."""

from __future__ import annotations

import asyncio

import pytest

from stager.store.bandwidth import BandwidthLimiter


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept = 0.0

    def clock(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.slept += delay
        self.now += delay


async def test_average_rate_holds_for_large_requests():
    t = FakeTime()
    limiter = BandwidthLimiter(1000, burst=100, clock=t.clock, sleep=t.sleep)
    for _ in range(10):
        await limiter.acquire(500)
    # 5000 bytes at 1000 B/s, less the initial burst of 100
    assert t.now == pytest.approx(4.9)


async def test_burst_passes_without_waiting():
    t = FakeTime()
    limiter = BandwidthLimiter(1000, burst=300, clock=t.clock, sleep=t.sleep)
    await limiter.acquire(100)
    await limiter.acquire(200)
    assert t.slept == 0.0
    await limiter.acquire(100)
    assert t.slept == pytest.approx(0.1)


async def test_idle_time_refills_only_up_to_the_burst():
    t = FakeTime()
    limiter = BandwidthLimiter(1000, burst=100, clock=t.clock, sleep=t.sleep)
    t.now += 60.0
    await limiter.acquire(1100)
    assert t.slept == pytest.approx(1.0)


async def test_concurrent_callers_queue_in_arrival_order():
    waits: list[float] = []

    async def sleep(delay: float) -> None:
        waits.append(delay)

    limiter = BandwidthLimiter(1000, burst=0.001, clock=lambda: 0.0, sleep=sleep)
    await asyncio.gather(*(limiter.acquire(250) for _ in range(4)))
    # all ask at the same instant: each waits for its own bytes and everyone's before it
    assert waits == pytest.approx([0.25, 0.5, 0.75, 1.0], rel=1e-3)


async def test_cancelled_caller_refunds():
    t = FakeTime()
    started = asyncio.Event()

    async def sleep(delay: float) -> None:
        started.set()
        await asyncio.sleep(10)

    limiter = BandwidthLimiter(1000, burst=0.001, clock=t.clock, sleep=sleep)
    task = asyncio.create_task(limiter.acquire(5000))
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    limiter._sleep = t.sleep
    await limiter.acquire(1000)
    assert t.slept == pytest.approx(1.0, rel=1e-3)


async def test_real_clock_caps_the_rate():
    limiter = BandwidthLimiter(2_000_000, burst=1)
    loop = asyncio.get_running_loop()
    started = loop.time()
    for _ in range(4):
        await limiter.acquire(100_000)
    assert loop.time() - started >= 0.18


def test_rate_must_be_positive():
    with pytest.raises(ValueError):
        BandwidthLimiter(0)
