"""The byte budget: a cap on bytes in flight, first come first served, cancellation-safe."""

from __future__ import annotations

import asyncio

from stager.replicate.budget import ByteBudget


async def test_cap_order_and_oversized_requests():
    budget = ByteBudget(10)
    assert await budget.acquire(6) == 6
    order = []

    async def take(n, tag):
        granted = await budget.acquire(n)
        order.append(tag)
        return granted

    big = asyncio.create_task(take(8, "big"))
    small = asyncio.create_task(take(1, "small"))  # fits now, but the big one asked first
    await asyncio.sleep(0.01)
    assert order == [] and budget.used == 6
    budget.release(6)
    assert await big == 8 and await small == 1 and order == ["big", "small"]
    budget.release(9)
    assert await budget.acquire(50) == 10  # larger than the cap: takes it all, alone
    budget.release(10)
    assert budget.used == 0


async def test_cancelled_waiter_gives_its_place_back():
    budget = ByteBudget(4)
    await budget.acquire(4)
    waiter = asyncio.create_task(budget.acquire(3))
    behind = asyncio.create_task(budget.acquire(1))
    await asyncio.sleep(0.01)
    waiter.cancel()
    await asyncio.sleep(0)
    budget.release(4)
    assert await behind == 1 and budget.used == 1
    assert waiter.cancelled()
