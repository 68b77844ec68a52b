"""The priority gate: bounded holders, urgent first, cancellation-safe."""

from __future__ import annotations

import asyncio

from stager.engine import PriorityGate


async def test_urgent_waiter_enters_before_earlier_low_priority_ones():
    gate = PriorityGate(1)
    order: list[str] = []
    await gate.acquire()

    async def worker(name: str, priority: float) -> None:
        async with gate.slot(priority):
            order.append(name)

    tasks = [asyncio.create_task(worker(f"far{i}", 10 + i)) for i in range(3)]
    await asyncio.sleep(0)
    tasks.append(asyncio.create_task(worker("urgent", -1)))
    await asyncio.sleep(0)
    gate.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert order == ["urgent", "far0", "far1", "far2"]


async def test_never_more_holders_than_the_limit():
    gate = PriorityGate(3)
    inside = peak = 0

    async def worker(i: int) -> None:
        nonlocal inside, peak
        async with gate.slot(i % 5):
            inside += 1
            peak = max(peak, inside)
            await asyncio.sleep(0.001)
            inside -= 1

    await asyncio.wait_for(asyncio.gather(*(worker(i) for i in range(50))), 10)
    assert peak == 3


async def test_cancelled_waiter_does_not_leak_its_slot():
    gate = PriorityGate(1)
    await gate.acquire()
    waiter = asyncio.create_task(gate.acquire(5))
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    gate.release()
    await asyncio.wait_for(gate.acquire(), 1)  # the slot came back
    gate.release()


async def test_boost_reorders_queued_waiters_of_one_owner():
    gate = PriorityGate(1)
    await gate.acquire()
    order: list[str] = []
    owner = object()

    async def worker(name: str, priority: float, who: object) -> None:
        async with gate.slot(priority, owner=who):
            order.append(name)

    tasks = [asyncio.create_task(worker("other", 5, None)), asyncio.create_task(worker("boosted", 50, owner))]
    await asyncio.sleep(0)
    gate.boost(owner, -1)
    gate.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert order == ["boosted", "other"]
