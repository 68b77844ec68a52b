"""A blob lock held elsewhere: the engine waits for it, and never keeps one it stopped waiting for."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from stager.cache import BlobLock, CacheTier
from stager.config import CacheConfig, FetchConfig, SourceConfig
from stager.engine import Engine
from stager.engine import job as blob_job

from .corpus import make_corpus


def lock_is_free(cache: CacheTier, digest: str, within: float) -> bool:
    """Whether a new holder can take the blob's lock within ``within`` seconds (polled, bounded)."""
    deadline = time.monotonic() + within
    for _ in range(10_000):
        probe = cache.lock(digest)
        if probe.try_lock():
            probe.release()
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return False


def test_an_engine_closed_while_waiting_for_a_lock_does_not_keep_it(tmp_path, monkeypatch):
    # Each try on the other holder's lock lasts long enough to be under way when the engine closes.
    monkeypatch.setattr(blob_job, "FOREIGN_LOCK_POLL", 5.0)
    taken_in_thread = threading.Event()  # an engine's thread took a blob lock
    acquire = BlobLock.acquire

    def noting_acquire(self, timeout=None):
        taken = acquire(self, timeout)
        if taken and threading.current_thread().name.startswith("stager-lock"):
            taken_in_thread.set()
        return taken

    monkeypatch.setattr(BlobLock, "acquire", noting_acquire)
    manifest = make_corpus(tmp_path / "corpus", shards=1)
    digest = manifest.digest(0)
    config = CacheConfig(tmp_path / "cache", capacity=64 << 20)
    holder_cache = CacheTier(config)
    holder = holder_cache.lock(digest)  # "another process" stages this blob
    assert holder.try_lock()
    waiting = threading.Event()

    async def wait_then_close() -> None:
        with CacheTier(config) as cache:
            engine = Engine(cache, FetchConfig(durable=False))
            dataset = await engine.open_dataset(SourceConfig(str(tmp_path / "corpus")))
            job = asyncio.create_task(engine.ensure(dataset.ref(0)))
            for _ in range(200):  # until the engine's thread is blocked on the held lock
                await asyncio.sleep(0.01)
                if any(t.name.startswith("stager-lock") for t in threading.enumerate()):
                    break
            waiting.set()
            await asyncio.sleep(0.1)
            await engine.close()
            job.cancel()
            await asyncio.gather(job, return_exceptions=True)

    try:
        asyncio.run(wait_then_close())  # the engine and its event loop are gone
        assert waiting.is_set()
        holder.release()
        assert taken_in_thread.wait(5.0)  # the abandoned try in the engine's thread takes the lock...
        assert lock_is_free(holder_cache, digest, within=5.0), "a closed engine kept the blob's lock"
    finally:
        holder.release()
        holder_cache.close()


@pytest.mark.parametrize("release_after", [0.05, 0.6])
async def test_a_blob_whose_lock_is_released_is_staged_by_the_waiting_engine(tmp_path, release_after):
    manifest = make_corpus(tmp_path / "corpus", shards=1)
    config = CacheConfig(tmp_path / "cache", capacity=64 << 20)
    with CacheTier(config) as holder_cache, CacheTier(config) as cache:
        holder = holder_cache.lock(manifest.digest(0))
        assert holder.try_lock()
        async with Engine(cache, FetchConfig(durable=False)) as engine:
            dataset = await engine.open_dataset(SourceConfig(str(tmp_path / "corpus")))
            job = asyncio.create_task(engine.ensure(dataset.ref(0)))
            await asyncio.sleep(release_after)
            assert not job.done()  # waits for the other holder
            holder.release()
            path = await asyncio.wait_for(job, 10)
        assert path.read_bytes() == (tmp_path / "corpus" / manifest.paths[0]).read_bytes()


async def test_blob_locks_are_taken_and_given_back_off_the_event_loop(http_origin, tmp_path, monkeypatch):
    # Making and unlinking a lock file waits for the file system's journal, behind the commits' fsyncs:
    # taken on the event loop, a dataset of thousands of small files stalled it for seconds. Here each
    # lock file is that slow (on a file system without byte locks, where a blob's lock is a file of
    # its own): the loop must keep answering meanwhile.
    from stager.cache import locks

    slow = 0.6
    try_flock, unflock = locks.try_flock, locks.unflock
    calls = {"try": 0, "release": 0}

    def journal_bound_try_flock(path):
        calls["try"] += 1
        time.sleep(slow)
        return try_flock(path)

    def journal_bound_unflock(path, fd):
        calls["release"] += 1
        time.sleep(slow)
        return unflock(path, fd)

    monkeypatch.setattr(locks, "try_flock", journal_bound_try_flock)
    monkeypatch.setattr(locks, "unflock", journal_bound_unflock)
    manifest = make_corpus(http_origin.root / "corpus", shards=3)
    lags: list[float] = []

    async def ticker() -> None:
        for _ in range(2_000):  # bounded: a tick every 20 ms while the staging runs
            began = time.monotonic()
            await asyncio.sleep(0.02)
            lags.append(time.monotonic() - began - 0.02)

    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20)) as cache:
        cache._lock_ranges.usable = False  # as where the file system refuses byte locks
        async with Engine(cache, FetchConfig(concurrency=4, durable=False)) as engine:
            dataset = await engine.open_dataset(SourceConfig(f"{http_origin.url}/corpus"))
            watch = asyncio.create_task(ticker())
            try:
                await asyncio.wait_for(asyncio.gather(*(engine.ensure(dataset.ref(i)) for i in range(len(manifest)))),
                                       60)
            finally:
                watch.cancel()
        for entry in manifest:
            assert lock_is_free(cache, entry.digest, within=5)
    assert calls["try"] >= len(manifest) and calls["release"] >= len(manifest), calls  # the slow files were used
    assert lags and max(lags) < slow / 2, max(lags)
