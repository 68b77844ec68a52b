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


async def test_waiting_counts_those_still_queued_through_grants_and_cancellations():
    gate = PriorityGate(1)
    await gate.acquire()
    waiters = [asyncio.create_task(gate.acquire(i)) for i in range(4)]
    await asyncio.sleep(0)
    assert gate.waiting == 4
    waiters[1].cancel()  # leaves the queue while its entry is still in the heap
    await asyncio.gather(waiters[1], return_exceptions=True)
    assert gate.waiting == 3
    gate.release()  # the slot goes to waiter 0
    await asyncio.wait_for(waiters[0], 1)
    assert (gate.waiting, gate.holders) == (2, 1)
    gate.release()  # granted to waiter 2 (the cancelled entry is passed over); cancelled before it runs
    waiters[2].cancel()
    await asyncio.gather(waiters[2], return_exceptions=True)
    assert (gate.waiting, gate.holders) == (0, 1)  # its slot went on to waiter 3
    await asyncio.wait_for(waiters[3], 1)
    gate.release()
    assert (gate.waiting, gate.holders) == (0, 0)
    async with gate.slot():  # a free gate admits at once: the count did not stick above zero
        assert gate.holders == 1
