"""The engine's disk threads: outcomes reach the loop, jobs always run, shutdown drains the queue."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time

import pytest

from stager.engine.disk_threads import DiskThreads


@pytest.fixture
def threads():
    pool = DiskThreads(4, "test-disk")
    yield pool
    pool.shutdown()


async def test_results_and_errors_reach_their_futures(threads):
    def work(i: int) -> int:
        if i % 7 == 3:
            raise OSError(i, "disk said no")
        return i * i

    futures = [threads.start(work, i) for i in range(500)]
    outcomes = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 30)
    for i, outcome in enumerate(outcomes):
        if i % 7 == 3:
            assert isinstance(outcome, OSError) and outcome.errno == i
        else:
            assert outcome == i * i


async def test_jobs_run_on_the_workers_not_on_the_loop(threads):
    loop_thread = threading.get_ident()
    idents = await asyncio.wait_for(asyncio.gather(*(threads.start(threading.get_ident) for _ in range(50))), 30)
    assert loop_thread not in idents
    assert {t.name.startswith("test-disk") for t in threading.enumerate() if t.ident in set(idents)} == {True}


async def test_a_cancelled_future_does_not_stop_its_job_and_shield_sees_it_end(threads):
    release = threading.Event()
    done = []

    def slow() -> str:
        release.wait(10)
        done.append(True)
        return "written"

    job = threads.start(slow)
    waiter = asyncio.ensure_future(asyncio.shield(job))
    await asyncio.sleep(0.01)
    waiter.cancel()
    release.set()
    assert await asyncio.wait_for(job, 10) == "written" and done == [True]


async def test_completions_arriving_together_wake_the_loop_once(threads, monkeypatch):
    loop = asyncio.get_running_loop()
    wakes = []
    real = loop.call_soon_threadsafe

    def counting(callback, *args):
        wakes.append(callback)
        return real(callback, *args)

    monkeypatch.setattr(loop, "call_soon_threadsafe", counting)
    count, lock, all_ran = [0], threading.Lock(), threading.Event()

    def job(i: int) -> int:
        with lock:
            count[0] += 1
            if count[0] == 200:
                all_ran.set()
        return i

    futures = [threads.start(job, i) for i in range(200)]
    assert all_ran.wait(30)  # the loop is busy (blocked here) while every job finishes
    assert await asyncio.wait_for(asyncio.gather(*futures), 30) == list(range(200))
    assert len(wakes) == 1  # all 200 completions delivered by one wake-up of the loop


def test_shutdown_lets_queued_jobs_finish_and_refuses_new_ones(caplog):
    pool = DiskThreads(2, "test-drain")
    ran = []
    for i in range(20):
        pool.submit(lambda i=i: (time.sleep(0.005), ran.append(i)))
    pool.submit(lambda: 1 / 0)
    with caplog.at_level(logging.ERROR, logger="stager.engine.disk_threads"):
        pool.shutdown()
    assert sorted(ran) == list(range(20))
    assert "division by zero" in caplog.text
    assert not any(t.name.startswith("test-drain") for t in threading.enumerate())

    async def after() -> None:
        with pytest.raises(RuntimeError, match="shut down"):
            pool.start(time.sleep, 0)

    asyncio.run(after())


def test_a_job_whose_loop_closed_meanwhile_does_not_kill_its_worker():
    pool = DiskThreads(1, "test-closed")
    release = threading.Event()

    async def leave_a_job_behind() -> None:
        pool.start(release.wait, 10)

    asyncio.run(leave_a_job_behind())  # the loop is closed while the job still runs
    release.set()

    async def still_working() -> int:
        return await asyncio.wait_for(pool.start(lambda: 42), 10)

    try:
        assert asyncio.run(still_working()) == 42
    finally:
        pool.shutdown()


@pytest.mark.parametrize("durable, direct_writes", [(False, False), (True, False), (False, True)])
async def test_writes_into_the_page_cache_get_a_thread_per_core_writes_that_wait_more(
        tmp_path, durable, direct_writes):
    """Page-cache writes are CPU work: more threads than cores only take turns at the interpreter.
    Writes that wait for the device (fdatasync, O_DIRECT) keep its queue full with more."""
    from stager.cache import CacheTier
    from stager.config import CacheConfig, FetchConfig
    from stager.engine import Engine

    def disk_threads() -> int:
        return sum(t.name.startswith("stager-disk") for t in threading.enumerate())

    before = disk_threads()
    cores = len(os.sched_getaffinity(0))
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20, direct_writes=direct_writes)) as cache:
        async with Engine(cache, FetchConfig(concurrency=256, durable=durable)):
            started = disk_threads() - before
    if durable or direct_writes:
        assert started == 8
    else:
        assert started == min(8, max(2, cores))
    assert disk_threads() == before


async def test_jobs_of_one_key_run_one_at_a_time_in_order_while_other_keys_go_on(threads):
    """A file's writes take turns (two threads writing one file only spin on its inode lock); other
    files' work is not held up behind them."""
    running: dict[str, int] = {"a": 0, "b": 0}
    most: dict[str, int] = {"a": 0, "b": 0}
    order: list[int] = []
    lock = threading.Lock()
    b_ran = threading.Event()

    def job(key: str, i: int) -> int:
        with lock:
            running[key] += 1
            most[key] = max(most[key], running[key])
        if key == "a":
            b_ran.wait(0.2) if i == 0 else time.sleep(0.001)  # the first waits for a b job to run beside it
            order.append(i)
        else:
            b_ran.set()
        with lock:
            running[key] -= 1
        return i

    a_jobs = [threads.start_in_turn("a", job, "a", i) for i in range(40)]
    b_jobs = [threads.start_in_turn("b", job, "b", i) for i in range(5)]
    assert await asyncio.wait_for(asyncio.gather(*a_jobs), 30) == list(range(40))
    assert await asyncio.wait_for(asyncio.gather(*b_jobs), 30) == list(range(5))
    assert order == list(range(40))
    assert most == {"a": 1, "b": 1}
    assert b_ran.is_set()  # b ran while a's first job was still on its thread


async def test_a_failing_job_does_not_stop_its_keys_next_ones(threads):
    def job(i: int) -> int:
        if i == 2:
            raise OSError("disk said no")
        return i

    outcomes = await asyncio.wait_for(
        asyncio.gather(*(threads.start_in_turn("k", job, i) for i in range(5)), return_exceptions=True), 30)
    assert outcomes[:2] == [0, 1] and isinstance(outcomes[2], OSError) and outcomes[3:] == [3, 4]


def test_shutdown_runs_the_jobs_still_waiting_for_their_turn():
    pool = DiskThreads(2, "test-turns")
    ran: list[int] = []

    async def queue_them() -> None:
        for i in range(30):
            pool.start_in_turn("k", lambda i=i: (time.sleep(0.001), ran.append(i)))

    asyncio.run(queue_them())
    pool.shutdown()
    assert ran == list(range(30))
