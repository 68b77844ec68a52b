"""Hedged requests race stragglers; the latency tracker decides when."""

from __future__ import annotations

import asyncio

import pytest

from stager.engine import LatencyTracker, hedged
from stager.engine.hedging import COLD_URGENT_SECONDS_PER_MIB


def test_no_hedging_before_enough_samples_then_p95_times_factor():
    tracker = LatencyTracker(samples=100, min_samples=10)
    for _ in range(9):
        tracker.record(0.01, 1 << 20)
    assert tracker.hedge_delay(1 << 20, 2.0, 0.0) is None
    # ...but a request a consumer is blocked on is raced after a fixed time per MiB meanwhile
    assert tracker.hedge_delay(1 << 20, 2.0, 0.0, urgent=True) == pytest.approx(COLD_URGENT_SECONDS_PER_MIB)
    assert tracker.hedge_delay(4 << 20, 2.0, 0.0, urgent=True) == pytest.approx(4 * COLD_URGENT_SECONDS_PER_MIB)
    for i in range(91):
        tracker.record(0.01 if i < 85 else 1.0, 1 << 20)
    delay = tracker.hedge_delay(1 << 20, 2.0, 0.0)
    assert delay == pytest.approx(2.0)  # p95 of 100 samples with 6 slow ones is the slow value
    assert tracker.hedge_delay(8 << 20, 2.0, 0.0) == pytest.approx(16.0)  # scales with size
    assert tracker.hedge_delay(1 << 20, 2.0, 5.0) == 5.0  # never below the floor


def test_durations_are_judged_per_request_in_flight_beside_them():
    tracker = LatencyTracker(samples=100, min_samples=10)
    for _ in range(20):
        tracker.record(0.4, 1 << 20, sharing=4)  # four at once on a full link: 0.1 s a MiB each alone
    assert tracker.hedge_delay(1 << 20, 2.0, 0.0) == pytest.approx(0.2)
    assert tracker.hedge_delay(1 << 20, 2.0, 0.0, sharing=4) == pytest.approx(0.8)
    assert tracker.hedge_delay(1 << 20, 2.0, 0.0, sharing=12) == pytest.approx(2.4)  # three times the company
    assert tracker.hedge_delay(1 << 20, 2.0, 0.0, sharing=0) == pytest.approx(0.2)  # never less than alone


async def test_a_delay_asked_again_when_it_runs_out_spares_a_request_whose_neighbours_multiplied():
    asked = []

    def delay() -> float:  # the first answer runs out; by then the request has company
        asked.append(1)
        return 0.05 if len(asked) == 1 else 5.0

    calls = 0

    async def request() -> str:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.3)
        return "answer"

    assert await asyncio.wait_for(hedged(request, delay), 5) == ("answer", False)
    assert calls == 1 and len(asked) == 2

    asked.clear()
    hedges = []
    result, won = await asyncio.wait_for(hedged(request, lambda: 0.05, lambda: hedges.append(1)), 5)
    assert calls == 3 and hedges == [1]  # the same request with an unchanged delay is raced


async def test_straggler_is_raced_and_the_fast_hedge_wins():
    calls = 0
    cancelled = asyncio.Event()

    async def request() -> str:
        nonlocal calls
        calls += 1
        mine = calls
        try:
            await asyncio.sleep(10 if mine == 1 else 0.01)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return f"answer {mine}"

    hedges = []
    result, won = await asyncio.wait_for(hedged(request, 0.05, lambda: hedges.append(1)), 5)
    assert (result, won, calls, len(hedges)) == ("answer 2", True, 2, 1)
    await asyncio.wait_for(cancelled.wait(), 1)  # the straggler was cancelled


async def test_fast_request_is_not_hedged():
    calls = 0

    async def request() -> int:
        nonlocal calls
        calls += 1
        return 7

    assert await hedged(request, 1.0) == (7, False)
    assert calls == 1


async def test_one_failed_attempt_falls_back_to_the_other():
    calls = 0

    async def request() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            await asyncio.sleep(0.1)
            raise ConnectionError("first failed")
        await asyncio.sleep(0.2)
        return "second"

    assert await asyncio.wait_for(hedged(request, 0.01), 5) == ("second", True)


async def test_both_failing_raises():
    async def request() -> str:
        await asyncio.sleep(0.02)
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        await asyncio.wait_for(hedged(request, 0.01), 5)
