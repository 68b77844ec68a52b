"""The send order of a node's uplink: turns by a key read when a turn frees, bounded waits, first copies first."""

from __future__ import annotations

import asyncio

import pytest

from stager.cluster.turns import Turns
from stager.cluster.uplink import Uplink

DIGEST = "ab" * 16


async def _in_turn(turns: Turns, key, order: list[str], name: str, hold: asyncio.Event | None = None) -> None:
    async with turns.turn(key):
        order.append(name)
        if hold is not None:
            await hold.wait()


async def _started() -> None:
    for _ in range(10):  # a few loop turns: every task reaches its wait
        await asyncio.sleep(0)


def test_a_freed_turn_goes_to_the_least_key_as_it_is_then_ties_by_arrival():
    async def run() -> list[str]:
        turns = Turns(1)
        order: list[str] = []
        hold = asyncio.Event()
        keys = {"a": 1, "b": 1, "c": 0}
        first = asyncio.create_task(_in_turn(turns, lambda: -1, order, "first", hold))
        await _started()
        waiting = [asyncio.create_task(_in_turn(turns, lambda n=n: keys[n], order, n)) for n in "abc"]
        await _started()
        keys["c"] = 2  # changed while waiting: the key is read when the turn frees, not when it was asked
        hold.set()
        await asyncio.wait_for(asyncio.gather(first, *waiting), 5)
        return order

    assert asyncio.run(run()) == ["first", "a", "b", "c"]


def test_a_waiter_passed_over_its_bound_goes_next():
    async def run() -> tuple[int, int]:
        turns = Turns(1, max_overtaken=3)
        order: list[str] = []
        hold = asyncio.Event()
        first = asyncio.create_task(_in_turn(turns, lambda: 0, order, "first", hold))
        await _started()
        low = asyncio.create_task(_in_turn(turns, lambda: 9, order, "low"))
        fresh = [asyncio.create_task(_in_turn(turns, lambda: 0, order, f"fresh{i}")) for i in range(6)]
        await _started()
        hold.set()
        await asyncio.wait_for(asyncio.gather(first, low, *fresh), 5)
        return order.index("low"), turns.overdue_grants

    position, overdue = asyncio.run(run())
    assert position == 4 and overdue >= 1  # after three fresher waiters, not after all six


def test_a_cancelled_waiter_leaves_the_queue_and_the_turn_passes_on():
    async def run() -> list[str]:
        turns = Turns(1)
        order: list[str] = []
        hold = asyncio.Event()
        first = asyncio.create_task(_in_turn(turns, lambda: 0, order, "first", hold))
        await _started()
        gone = asyncio.create_task(_in_turn(turns, lambda: 0, order, "gone"))
        kept = asyncio.create_task(_in_turn(turns, lambda: 1, order, "kept"))
        await _started()
        gone.cancel()
        hold.set()
        await asyncio.wait_for(asyncio.gather(first, kept), 5)
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert turns.holders == 0 and turns.waiting == 0
        return order

    assert asyncio.run(run()) == ["first", "kept"]


async def _send(uplink: Uplink, asker: str, index: int, order: list[tuple[str, int]], *, urgent: bool = False,
                owned: bool = True, arrival: int = 0, hold: asyncio.Event | None = None) -> None:
    async with uplink.send(uplink.lane(asker), DIGEST, index, 1024, urgent=urgent, owned=owned, arrival=arrival):
        order.append((asker, index))
        if hold is not None:
            await hold.wait()


def test_in_a_lane_the_block_sent_fewest_times_goes_first_and_an_urgent_one_before_any():
    async def run() -> list[tuple[str, int]]:
        uplink = Uplink()
        order: list[tuple[str, int]] = []
        await _send(uplink, "a", 0, order)  # block 0 went to asker a: one copy out
        hold = asyncio.Event()
        busy = asyncio.create_task(_send(uplink, "b", 5, order, hold=hold))  # b's lane is writing
        await _started()
        # b's requests, older first: block 0 (one copy out), block 1 (none); then an urgent one for block 0
        waiting = [asyncio.create_task(_send(uplink, "b", 0, order, arrival=1)),
                   asyncio.create_task(_send(uplink, "b", 1, order, arrival=2))]
        await _started()
        hold.set()
        await asyncio.wait_for(asyncio.gather(busy, *waiting), 5)
        hold = asyncio.Event()
        busy = asyncio.create_task(_send(uplink, "b", 6, order, hold=hold))
        await _started()
        waiting = [asyncio.create_task(_send(uplink, "b", 2, order, arrival=3)),
                   asyncio.create_task(_send(uplink, "b", 0, order, urgent=True, arrival=4))]
        await _started()
        hold.set()
        await asyncio.wait_for(asyncio.gather(busy, *waiting), 5)
        return order

    assert asyncio.run(run()) == [("a", 0), ("b", 5), ("b", 1), ("b", 0), ("b", 6), ("b", 0), ("b", 2)]


def test_a_relayed_block_counts_the_copy_upstream_and_a_failed_write_no_copy():
    async def run() -> list[tuple[str, int]]:
        uplink = Uplink()
        order: list[tuple[str, int]] = []
        with pytest.raises(ConnectionResetError):
            async with uplink.send(uplink.lane("a"), DIGEST, 3, 1024, urgent=False, owned=True, arrival=0):
                raise ConnectionResetError("the asker went away")
        assert uplink.copies(DIGEST, 3) == 0
        hold = asyncio.Event()
        busy = asyncio.create_task(_send(uplink, "a", 9, order, hold=hold))
        await _started()
        waiting = [asyncio.create_task(_send(uplink, "a", 1, order, owned=False, arrival=1)),  # held upstream too
                   asyncio.create_task(_send(uplink, "a", 3, order, owned=True, arrival=2))]  # here alone
        await _started()
        hold.set()
        await asyncio.wait_for(asyncio.gather(busy, *waiting), 5)
        return order

    assert asyncio.run(run()) == [("a", 9), ("a", 3), ("a", 1)]

