"""Single-block fetches (Engine.read_block) and their coherence with whole-blob jobs and other processes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from stager.cache import BlobState, CacheTier
from stager.config import CacheConfig, FetchConfig, RetryConfig, SourceConfig
from stager.engine import Engine
from stager.engine.job import IDLE_RELEASE
from stager.errors import CacheError, OriginUnavailable
from stager.session import EmbeddedSession
from stager.loopback.fault_plan import FaultPlan

from .corpus import BLOCK, make_corpus

FAST_RETRY = RetryConfig(attempts=50, backoff_base=0.01, backoff_max=0.1, deadline=30, request_timeout=5)


def fetch_config(**kw) -> FetchConfig:
    return FetchConfig(**{"concurrency": 8, "retry": FAST_RETRY, "durable": False, "hedge": False, **kw})


def origin_block(root: Path, path: str, block: int) -> bytes:
    return (root / path).read_bytes()[block * BLOCK:(block + 1) * BLOCK]


async def settled(engine: Engine, blocks_fetched: int, timeout: float = 5.0) -> None:
    """A block read returns once verified, before its write: wait (bounded) until the write is counted."""
    deadline = time.monotonic() + timeout
    while engine.stats.blocks_fetched < blocks_fetched:
        assert time.monotonic() < deadline, f"only {engine.stats.blocks_fetched} blocks were ever written"
        await asyncio.sleep(0.01)


async def test_one_block_is_fetched_alone_verified_and_read_back_from_the_partial_blob(http_origin, fault_proxy,
                                                                                      tmp_path):
    root = http_origin.root / "corpus"
    manifest = make_corpus(root, shards=2)
    proxy = fault_proxy(http_origin)
    blocks = len(manifest.block_digests(0))
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20)) as cache:
        async with Engine(cache, fetch_config()) as engine:
            dataset = await engine.open_dataset(SourceConfig(f"{proxy.url}/corpus"))
            ref = dataset.ref(0)
            before = proxy.bytes_forwarded
            data = await asyncio.wait_for(engine.read_block(ref, 2), 10)
            assert data == origin_block(root, ref.path, 2)
            await settled(engine, 1)
            assert (engine.stats.blocks_fetched, proxy.bytes_forwarded - before) == (1, BLOCK)
            record = cache.record(ref.digest)
            assert record is not None and record.state is BlobState.PARTIAL and record.verified == {2}
            # again, and through the embedded session: served from the partial file, not fetched again
            session = EmbeddedSession(engine, owns_cache=False)
            handle = await session.open_dataset(SourceConfig(f"{proxy.url}/corpus"))
            assert await session.read_block(handle, 0, 2) == data
            last = await engine.read_block(ref, blocks - 1)  # the short last block
            assert last == origin_block(root, ref.path, blocks - 1) and len(last) < BLOCK
            await settled(engine, 2)
            assert engine.stats.blocks_fetched == 2
            with pytest.raises(ValueError, match="out of range"):
                await engine.read_block(ref, blocks)
            # the whole blob afterwards fetches only what is missing
            path = await asyncio.wait_for(engine.ensure(ref), 10)
            assert path.read_bytes() == (root / ref.path).read_bytes()
            assert engine.stats.blocks_fetched == blocks
            assert proxy.bytes_forwarded - before == ref.size
            assert await engine.read_block(ref, 1) == origin_block(root, ref.path, 1)  # from the complete file
            assert engine.stats.blocks_fetched == blocks


async def test_block_reads_and_whole_blob_fetches_at_once_fetch_each_block_once(http_origin, fault_proxy, tmp_path):
    root = http_origin.root / "corpus"
    manifest = make_corpus(root, shards=3)
    proxy = fault_proxy(http_origin, FaultPlan(latency_s=0.02))
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20)) as cache:
        async with Engine(cache, fetch_config(concurrency=4)) as engine:
            dataset = await engine.open_dataset(SourceConfig(f"{proxy.url}/corpus"))
            before = proxy.bytes_forwarded
            calls = []
            for i in range(len(manifest)):
                ref = dataset.ref(i)
                calls.append(engine.ensure(ref, priority=float(i)))
                for _ in range(3):
                    calls += [engine.read_block(ref, b) for b in reversed(range(len(ref.blocks)))]
            results = await asyncio.wait_for(asyncio.gather(*calls), 30)
            for i in range(len(manifest)):
                ref = dataset.ref(i)
                assert cache.state(ref.digest) is BlobState.COMPLETE
            for result in results:
                if isinstance(result, bytes):
                    assert result in {origin_block(root, manifest.paths[i], b)
                                      for i in range(len(manifest)) for b in range(len(manifest.block_digests(i)))}
            assert proxy.bytes_forwarded - before == manifest.total_bytes  # every block crossed the link once
            assert engine.stats.blocks_fetched == sum(len(manifest.block_digests(i)) for i in range(len(manifest)))


async def test_an_urgent_block_overtakes_queued_whole_blob_fetches(http_origin, fault_proxy, tmp_path):
    root = http_origin.root / "corpus"
    make_corpus(root, shards=4)
    proxy = fault_proxy(http_origin, FaultPlan(latency_s=0.03))
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20)) as cache:
        async with Engine(cache, fetch_config(concurrency=1, request_bytes=BLOCK)) as engine:
            dataset = await engine.open_dataset(SourceConfig(f"{proxy.url}/corpus"))
            whole = [asyncio.ensure_future(engine.ensure(dataset.ref(i), priority=float(i))) for i in range(3)]
            await asyncio.sleep(0.05)  # the whole-blob jobs have queued their blocks
            last = len(dataset.ref(2).blocks) - 1
            urgent = [engine.read_block(dataset.ref(3), 0), engine.read_block(dataset.ref(2), last)]
            data = await asyncio.wait_for(asyncio.gather(*urgent), 10)
            # about 17 queued one-block requests at 30 ms each are still ahead, one at a time
            assert sum(not w.done() for w in whole) >= 2
            assert data == [origin_block(root, dataset.ref(3).path, 0), origin_block(root, dataset.ref(2).path, last)]
            await asyncio.wait_for(asyncio.gather(*whole), 30)


async def test_a_job_that_served_blocks_releases_the_blob_lock_when_idle(http_origin, tmp_path):
    root = http_origin.root / "corpus"
    make_corpus(root, shards=1)
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20)) as cache, \
            CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20), reconcile=False) as other_process:
        async with Engine(cache, fetch_config()) as engine:
            dataset = await engine.open_dataset(SourceConfig(f"{http_origin.url}/corpus"))
            ref = dataset.ref(0)
            await engine.read_block(ref, 1)
            await settled(engine, 1)
            lock = other_process.lock(ref.digest)  # a second lock table and file: as another process sees it
            assert not lock.try_lock()  # kept for the next read
            deadline = time.monotonic() + IDLE_RELEASE + 5
            while not lock.try_lock():
                assert time.monotonic() < deadline, "the blob lock was never released"
                await asyncio.sleep(0.05)
            lock.release()
            assert not engine.context.jobs
            assert cache.state(ref.digest) is BlobState.PARTIAL
            await asyncio.wait_for(engine.ensure(ref), 10)  # a new job resumes the partial blob
            assert cache.complete_path(ref.digest).read_bytes() == (root / ref.path).read_bytes()

            def open_blobs() -> list[str]:
                return [f.path for f in psutil.Process().open_files() if f.path.startswith(str(tmp_path / "cache"))
                        and ("/partial/" in f.path or "/blobs/" in f.path)]

            deadline = time.monotonic() + 5  # a job serves its waiters first, then closes its file
            while open_blobs():
                assert time.monotonic() < deadline, f"the jobs left files open: {open_blobs()}"
                await asyncio.sleep(0.02)


async def test_an_origin_that_stays_down_fails_the_block_in_bounded_time_then_recovers(http_origin, fault_proxy,
                                                                                       tmp_path):
    root = http_origin.root / "corpus"
    make_corpus(root, shards=1)
    proxy = fault_proxy(http_origin)
    retry = RetryConfig(attempts=100, backoff_base=0.01, backoff_max=0.1, deadline=1.5, request_timeout=1.0)
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20)) as cache:
        async with Engine(cache, fetch_config(retry=retry)) as engine:
            dataset = await engine.open_dataset(SourceConfig(f"{proxy.url}/corpus"))
            ref = dataset.ref(0)
            proxy.set_down(True)
            began = time.monotonic()
            with pytest.raises(OriginUnavailable, match=ref.path):
                await asyncio.wait_for(engine.read_block(ref, 0), 20)
            assert time.monotonic() - began < 6
            proxy.set_down(False)
            assert await asyncio.wait_for(engine.read_block(ref, 0), 10) == origin_block(root, ref.path, 0)


async def test_a_cancelled_reader_leaves_the_fetch_to_the_next_reader(http_origin, fault_proxy, tmp_path):
    root = http_origin.root / "corpus"
    make_corpus(root, shards=1)
    proxy = fault_proxy(http_origin, FaultPlan(latency_s=0.3))
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20)) as cache:
        async with Engine(cache, fetch_config()) as engine:
            dataset = await engine.open_dataset(SourceConfig(f"{proxy.url}/corpus"))
            ref = dataset.ref(0)
            before = proxy.requests
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(engine.read_block(ref, 0), 0.05)
            assert await asyncio.wait_for(engine.read_block(ref, 0), 10) == origin_block(root, ref.path, 0)
            assert proxy.requests - before == 1


_OTHER_PROCESS = """
import asyncio, sys
from stager.cache import CacheTier
from stager.config import CacheConfig, FetchConfig, SourceConfig
from stager.engine import Engine

async def main(cache_dir, url):
    with CacheTier(CacheConfig(cache_dir, capacity=64 << 20), reconcile=False) as cache:
        async with Engine(cache, FetchConfig(concurrency=1, durable=False, hedge=False)) as engine:
            dataset = await engine.open_dataset(SourceConfig(url))
            await engine.ensure(dataset.ref(0))
    print("done", flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def test_a_block_another_process_is_fetching_is_served_from_its_work(http_origin, fault_proxy, tmp_path):
    root = http_origin.root / "corpus"
    make_corpus(root, shards=1)
    proxy = fault_proxy(http_origin, FaultPlan(latency_s=0.2))
    cache_dir = tmp_path / "cache"
    with CacheTier(CacheConfig(cache_dir, capacity=64 << 20)) as cache:
        async with Engine(cache, fetch_config()) as engine:
            dataset = await engine.open_dataset(SourceConfig(f"{proxy.url}/corpus"))
            ref = dataset.ref(0)
            other = subprocess.Popen([sys.executable, "-c", _OTHER_PROCESS, str(cache_dir), f"{proxy.url}/corpus"],
                                     stdout=subprocess.PIPE, cwd=os.getcwd())
            try:
                deadline = time.monotonic() + 20
                while cache.state(ref.digest) is BlobState.ABSENT:  # it has the lock and began the blob
                    assert time.monotonic() < deadline and other.poll() is None, "the other process did not start"
                    await asyncio.sleep(0.02)
                data = await asyncio.wait_for(engine.read_block(ref, 1), 20)
                assert data == origin_block(root, ref.path, 1)
                assert engine.stats.blocks_fetched == 0  # the other process fetched it, we read its work
                assert other.communicate(timeout=20)[0].strip() == b"done"
            finally:
                if other.poll() is None:
                    other.kill()
                    other.wait(5)


async def test_a_blob_removed_under_its_job_fails_that_fetch_and_the_next_one_begins_anew(http_origin, fault_proxy,
                                                                                          tmp_path):
    root = http_origin.root / "corpus"
    make_corpus(root, shards=1)
    proxy = fault_proxy(http_origin, FaultPlan(latency_s=0.3))
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20)) as cache:
        async with Engine(cache, fetch_config(concurrency=2)) as engine:
            dataset = await engine.open_dataset(SourceConfig(f"{proxy.url}/corpus"))
            ref = dataset.ref(0)
            first = asyncio.ensure_future(engine.ensure(ref))
            deadline = time.monotonic() + 10
            while cache.state(ref.digest) is BlobState.ABSENT:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            assert cache.remove(ref.digest)  # e.g. an operator's `stager verify` dropping it
            with pytest.raises(CacheError, match="begin"):
                await asyncio.wait_for(first, 20)
            proxy.update(latency_s=0.0)
            path = await asyncio.wait_for(engine.ensure(ref), 20)
            assert path.read_bytes() == (root / ref.path).read_bytes()


async def test_the_blocks_of_one_request_are_served_as_each_arrives_and_a_bad_one_is_fetched_again(
        http_origin, fault_proxy, tmp_path):
    """A whole blob goes as one request of many blocks; its first block reaches a waiting reader long before
    the last byte, and a block that arrives corrupt fails the attempt without losing the blocks before it."""
    root = http_origin.root / "corpus"
    manifest = make_corpus(root, shards=1, tokens=400_000)  # 800 KB: 13 blocks of 64 KiB
    blocks = len(manifest.block_digests(0))
    proxy = fault_proxy(http_origin, FaultPlan(bandwidth_bps=1_000_000))  # about 0.8 s for the blob
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20)) as cache:
        async with Engine(cache, fetch_config(request_bytes=16 * BLOCK)) as engine:
            dataset = await engine.open_dataset(SourceConfig(f"{proxy.url}/corpus"))
            ref = dataset.ref(0)
            whole = asyncio.ensure_future(engine.ensure(ref))
            await asyncio.sleep(0.05)  # its one request is on its way
            first = await asyncio.wait_for(engine.read_block(ref, 1), 10)
            assert first == origin_block(root, ref.path, 1)
            assert not whole.done()  # served from the request in flight, before its end
            assert cache.record(ref.digest).state is BlobState.PARTIAL
            await asyncio.wait_for(whole, 20)
            assert proxy.requests == 1 + 1  # the manifest (one GET), then one GET for all the blocks
    # Again, with a flipped byte in one attempt: the blocks before it stay verified, the retry skips them.
    with CacheTier(CacheConfig(tmp_path / "cache2", capacity=64 << 20)) as cache:
        proxy.update(bandwidth_bps=None, flip_p=1.0, max_faults=1, path_contains="shard-")
        async with Engine(cache, fetch_config(request_bytes=16 * BLOCK)) as engine:
            dataset = await engine.open_dataset(SourceConfig(f"{proxy.url}/corpus"))
            path = await asyncio.wait_for(engine.ensure(dataset.ref(0)), 20)
            assert path.read_bytes() == (root / ref.path).read_bytes()
            assert engine.stats.verify_failures == 1
            assert engine.stats.blocks_fetched == blocks  # each block recorded once, whichever attempt brought it
