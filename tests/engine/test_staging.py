"""The engine against real origins: faults retried, nothing corrupt committed, clear failures."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import types

import pytest

from stager.cache import BlobState, CacheTier
from stager.cache.direct import ALIGN, open_direct
from stager.config import CacheConfig, FetchConfig, RetryConfig, SourceConfig
from stager.engine import Engine
from stager.errors import AccessDenied, OriginChanged, OriginUnavailable, ShardNotFound
from stager.loopback.fault_plan import FaultPlan
from stager.write import generate_corpus

from ..cache.blobs import resident_pages
from .corpus import BLOCK, assert_cache_matches, make_corpus

FAST_RETRY = RetryConfig(attempts=50, backoff_base=0.01, backoff_max=0.1, deadline=30, request_timeout=5)


def fetch_config(**kw) -> FetchConfig:
    # Requests of two blocks: blobs take several, and each request spans a block boundary.
    return FetchConfig(**{"concurrency": 8, "retry": FAST_RETRY, "durable": False, "request_bytes": 2 * BLOCK, **kw})


async def stage_all(engine: Engine, source: SourceConfig):
    dataset = await engine.open_dataset(source)
    await asyncio.gather(*(engine.ensure(dataset.ref(i)) for i in range(len(dataset.manifest))))
    return dataset


FAULTS = {
    "slowdown": FaultPlan(slowdown_p=0.3),
    "error500": FaultPlan(error500_p=0.3),
    "reset": FaultPlan(reset_p=0.3),
    "truncate": FaultPlan(truncate_p=0.3),
    "flip": FaultPlan(flip_p=0.3),
    "ignore_range": FaultPlan(ignore_range_p=0.3),
    "spike": FaultPlan(spike_p=0.2, spike_s=0.3),
}


@pytest.mark.parametrize("kind", sorted(FAULTS))
async def test_every_fault_kind_is_survived_and_nothing_corrupt_is_committed(kind, s3_bucket, fault_proxy, tmp_path):
    manifest = make_corpus(s3_bucket.path / "corpus")
    proxy = fault_proxy(s3_bucket, FAULTS[kind], seed=7)
    source = SourceConfig(f"{s3_bucket.url}/corpus", s3_bucket.storage_options(proxy.url))
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20)) as cache:
        async with Engine(cache, fetch_config()) as engine:
            await asyncio.wait_for(stage_all(engine, source), 60)
            stats = engine.stats
        assert proxy.faults.get(kind, 0) > 0, "the fault was never injected"
        assert_cache_matches(cache, manifest, s3_bucket.path / "corpus")
        if kind == "flip":
            assert stats.verify_failures > 0  # corrupt bodies were caught by the digest check


async def test_all_faults_at_once_through_http_origin(http_origin, fault_proxy, tmp_path):
    manifest = make_corpus(http_origin.root / "corpus", shards=16)
    plan = FaultPlan(latency_s=0.001, slowdown_p=0.08, error500_p=0.06, reset_p=0.06, truncate_p=0.06,
                     flip_p=0.08, ignore_range_p=0.04, spike_p=0.03, spike_s=0.2)
    proxy = fault_proxy(http_origin, plan, seed=3)
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20)) as cache:
        async with Engine(cache, fetch_config()) as engine:
            await asyncio.wait_for(stage_all(engine, SourceConfig(f"{proxy.url}/corpus")), 60)
        assert sum(proxy.faults.values()) >= 5
        assert_cache_matches(cache, manifest, http_origin.root / "corpus")


async def test_origin_that_stays_down_fails_in_bounded_time_naming_the_shard(http_origin, fault_proxy, tmp_path):
    make_corpus(http_origin.root / "corpus", shards=2)
    proxy = fault_proxy(http_origin)
    retry = RetryConfig(attempts=100, backoff_base=0.01, backoff_max=0.2, deadline=2.0, request_timeout=1.0)
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20)) as cache:
        async with Engine(cache, fetch_config(retry=retry)) as engine:
            dataset = await engine.open_dataset(SourceConfig(f"{proxy.url}/corpus"))
            proxy.set_down(True)
            began = time.monotonic()
            with pytest.raises(OriginUnavailable) as info:
                await asyncio.wait_for(engine.ensure(dataset.ref(0)), 30)
            assert time.monotonic() - began < 10
            assert dataset.manifest.paths[0] in str(info.value)
            assert "503" in str(info.value) or "SlowDown" in str(info.value) or "throttl" in str(info.value).lower()
        assert cache.state(dataset.manifest.digest(0)) is not BlobState.COMPLETE


async def test_missing_shard_fails_fast_without_retries(http_origin, tmp_path):
    manifest = make_corpus(http_origin.root / "corpus", shards=2)
    (http_origin.root / "corpus" / manifest.paths[1]).unlink()
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20)) as cache:
        async with Engine(cache, fetch_config()) as engine:
            dataset = await engine.open_dataset(SourceConfig(f"{http_origin.url}/corpus"))
            with pytest.raises(ShardNotFound, match=manifest.paths[1]):
                await asyncio.wait_for(engine.ensure(dataset.ref(1)), 10)
            assert engine.origin_stats.retries == 0


async def test_wrong_credentials_fail_fast_as_access_denied(s3_bucket, tmp_path):
    make_corpus(s3_bucket.path / "corpus", shards=1)
    options = {**s3_bucket.storage_options(), "secret": "wrong-secret-0123456789"}
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20)) as cache:
        async with Engine(cache, fetch_config()) as engine:
            with pytest.raises(AccessDenied):
                await asyncio.wait_for(engine.open_dataset(SourceConfig(f"{s3_bucket.url}/corpus", options)), 30)
            assert engine.origin_stats.retries == 0  # fast: refused at the first answer, never retried


async def test_origin_bytes_that_differ_from_the_manifest_are_reported_not_retried_forever(http_origin, tmp_path):
    manifest = make_corpus(http_origin.root / "corpus", shards=2)
    shard = http_origin.root / "corpus" / manifest.paths[0]
    data = bytearray(shard.read_bytes())
    data[BLOCK + 10] ^= 0x55  # the origin changed after indexing: same size, other bytes
    shard.write_bytes(bytes(data))
    retry = RetryConfig(attempts=4, backoff_base=0.01, backoff_max=0.05, deadline=10, request_timeout=2)
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20)) as cache:
        async with Engine(cache, fetch_config(retry=retry)) as engine:
            dataset = await engine.open_dataset(SourceConfig(f"{http_origin.url}/corpus"))
            with pytest.raises(OriginChanged, match=manifest.paths[0]):
                await asyncio.wait_for(engine.ensure(dataset.ref(0)), 20)
            record = cache.record(manifest.digest(0))
            assert record is None or 1 not in record.verified  # the bad block was never recorded
            # the other blocks of that shard were verified and stay, the other shard is unaffected
            await engine.ensure(dataset.ref(1))


async def test_dataset_four_times_the_cache_streams_through_it(http_origin, fault_proxy, tmp_path):
    manifest = make_corpus(http_origin.root / "corpus", shards=16, tokens=100_000)
    proxy = fault_proxy(http_origin)
    capacity = manifest.total_bytes // 4
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=capacity)) as cache:
        async with Engine(cache, fetch_config()) as engine:
            dataset = await engine.open_dataset(SourceConfig(f"{proxy.url}/corpus"))
            plan = engine.plan(dataset, name="consumer")
            for position in range(len(plan)):
                path = await asyncio.wait_for(plan.ready(position), 30)
                assert path.read_bytes() == (http_origin.root / "corpus" / plan.ref(position).path).read_bytes()
                plan.advance(position + 1)
                assert cache.usage().used <= capacity
            await plan.close()
        # every byte crossed the link about once: streaming did not thrash
        assert proxy.bytes_forwarded < manifest.total_bytes * 1.5


async def test_a_straggling_request_is_hedged(http_origin, fault_proxy, tmp_path):
    make_corpus(http_origin.root / "corpus", shards=12, tokens=70_000)
    proxy = fault_proxy(http_origin, FaultPlan(spike_p=0.0, spike_s=3.0), seed=1)
    config = fetch_config(concurrency=4, hedge_min_delay=0.05, request_bytes=BLOCK)  # enough requests to learn from
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20)) as cache:
        async with Engine(cache, config) as engine:
            dataset = await engine.open_dataset(SourceConfig(f"{proxy.url}/corpus"))
            for i in range(6):  # warm up the latency tracker on a healthy origin
                await engine.ensure(dataset.ref(i))
            proxy.update(spike_p=0.3)
            began = time.monotonic()
            await asyncio.wait_for(asyncio.gather(*(engine.ensure(dataset.ref(i)) for i in range(6, 12))), 60)
            elapsed = time.monotonic() - began
            assert engine.stats.hedged_requests > 0 and engine.stats.hedges_won > 0
            assert elapsed < 3.0 * 2  # without hedging, serial 3 s spikes would pile up


async def test_requests_slowed_only_by_sharing_the_link_with_more_of_them_are_not_hedged(http_origin, fault_proxy,
                                                                                           tmp_path):
    # The link (here the proxy's aggregate cap; on loopback, our own CPU) is the bottleneck: eight
    # requests in flight take about eight times as long each as one alone, and none is a straggler.
    # Hedging them would move their bytes twice over the link that is already full.
    make_corpus(http_origin.root / "corpus", shards=40, tokens=30_000)  # a block each: one request each
    proxy = fault_proxy(http_origin, FaultPlan(bandwidth_bps=2_000_000), seed=1)
    config = fetch_config(concurrency=8, hedge_min_delay=0.05, request_bytes=BLOCK)
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20)) as cache:
        async with Engine(cache, config) as engine:
            dataset = await engine.open_dataset(SourceConfig(f"{proxy.url}/corpus"))
            for i in range(16):  # the latency tracker learns from requests alone on the link
                await engine.ensure(dataset.ref(i))
            assert engine.stats.hedged_requests == 0
            await asyncio.wait_for(asyncio.gather(*(engine.ensure(dataset.ref(i)) for i in range(16, 40))), 60)
            assert engine.gate.peak_holders >= 6  # they did share the link
            assert engine.stats.hedged_requests == 0
            assert proxy.bytes_forwarded < dataset.manifest.total_bytes * 1.1  # each byte crossed it once
        assert_cache_matches(cache, dataset.manifest, http_origin.root / "corpus")


async def test_a_cold_engines_urgent_block_read_is_hedged_before_any_latency_is_known(http_origin, fault_proxy,
                                                                                        tmp_path):
    """A consumer blocked on a cold start's first blocks (the iterator's first window, served block by block)
    must not wait out a straggler only because too few requests have finished to measure a percentile."""
    make_corpus(http_origin.root / "corpus", shards=2, tokens=70_000)
    proxy = fault_proxy(http_origin)
    config = fetch_config(concurrency=4, hedge_min_delay=0.05, request_bytes=BLOCK)
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20)) as cache:
        async with Engine(cache, config) as engine:
            dataset = await engine.open_dataset(SourceConfig(f"{proxy.url}/corpus"))
            proxy.update(spike_p=1.0, spike_s=20.0)  # the first block request straggles
            read = asyncio.ensure_future(engine.read_block(dataset.ref(0), 0))
            for _ in range(500):  # until the proxy holds it back (bounded: 10 s)
                if proxy.faults.get("spike", 0):
                    break
                await asyncio.sleep(0.02)
            proxy.update(spike_p=0.0)  # what comes next is answered at once
            data = await asyncio.wait_for(read, 15)  # well before the 20 s straggler could answer
            assert data == (http_origin.root / "corpus" / dataset.ref(0).path).read_bytes()[:len(data)]
            assert engine.stats.hedged_requests == 1 and engine.stats.hedges_won == 1


async def test_many_waiters_share_one_fetch(http_origin, fault_proxy, tmp_path):
    manifest = make_corpus(http_origin.root / "corpus", shards=1)
    proxy = fault_proxy(http_origin)
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20)) as cache:
        async with Engine(cache, fetch_config()) as engine:
            dataset = await engine.open_dataset(SourceConfig(f"{proxy.url}/corpus"))
            before = proxy.bytes_forwarded
            paths = await asyncio.gather(*(engine.ensure(dataset.ref(0)) for _ in range(20)))
            assert len(set(paths)) == 1
            assert proxy.bytes_forwarded - before == manifest.total_bytes


async def test_streamed_blocks_are_written_past_the_page_cache(http_origin, tmp_path):
    """Blocks larger than a write batch arrive in several batches; each must end on a page boundary,
    or the page it splits would be written through the page cache (twice, by two threads)."""
    root = http_origin.root / "big"
    manifest = generate_corpus(root, shards=2, tokens_per_shard=3 << 20, seed=4, block_size=4 << 20, jitter=0.1)
    source = SourceConfig(f"{http_origin.url}/big")
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20, direct_writes=True)) as cache:
        async with Engine(cache, fetch_config(request_bytes=8 << 20)) as engine:
            await asyncio.wait_for(stage_all(engine, source), 60)
        probe = tmp_path / "probe"  # on the same file system as the cache
        probe.touch()
        if (fd := open_direct(probe)) is None:
            pytest.skip("this filesystem has no O_DIRECT")
        os.close(fd)
        for entry in manifest:  # before anything reads the files
            resident, pages = resident_pages(cache.complete_path(entry.digest))
            # Only the blob's last, partial page goes through the page cache.
            assert resident <= (1 if entry.size % ALIGN else 0), f"{resident} of {pages} pages were buffered"
        assert_cache_matches(cache, manifest, root)


async def test_a_plan_closed_mid_prefetch_leaves_no_task_behind(http_origin, fault_proxy, tmp_path):
    """Closing a plan while it waits for its fetches must cancel its wait on the cursor too: a task left
    pending is destroyed by the collector later ("Task was destroyed but it is pending!")."""
    make_corpus(http_origin.root / "corpus", shards=8, tokens=100_000)
    proxy = fault_proxy(http_origin, FaultPlan(bandwidth_bps=2_000_000))  # slow: the plan is mid-prefetch
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20)) as cache:
        async with Engine(cache, fetch_config()) as engine:
            dataset = await engine.open_dataset(SourceConfig(f"{proxy.url}/corpus"))
            before = asyncio.all_tasks()
            plan = engine.plan(dataset, name="consumer")
            await asyncio.sleep(0.3)  # its prefetch loop is waiting on fetches and on the cursor
            await plan.close()
        # the engine is closed: its blob jobs (which outlive plans) are gone too; nothing may still wait
        await asyncio.sleep(0)  # cancelled tasks run their last step
        left = [t for t in asyncio.all_tasks() - before if not t.done() and "Event.wait" in repr(t.get_coro())]
        assert left == []


async def test_a_plan_waited_on_in_its_order_fetches_its_blobs_one_after_another(http_origin, tmp_path):
    # `stager stage` waits for every blob of its plan at once. Waited on as urgent, they all shared one
    # priority and went out block by block across all blobs, so every blob completed (and its commit
    # re-hashed it) at the end of the run. Waited on in the plan's order, a blob's requests go out
    # before those of the blobs after it, and blobs complete one after another.
    manifest = make_corpus(http_origin.root / "corpus", shards=8)
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20)) as cache:
        async with Engine(cache, fetch_config(concurrency=2, request_bytes=BLOCK)) as engine:
            dataset = await engine.open_dataset(SourceConfig(f"{http_origin.url}/corpus"))
            http_origin.clear_requests()
            plan = engine.plan(dataset, window_bytes=manifest.total_bytes, name="stage")
            waits = [plan.ready(position, urgent=False) for position in range(len(plan))]
            await asyncio.wait_for(asyncio.gather(*waits), 60)
            await plan.close()
        assert_cache_matches(cache, manifest, http_origin.root / "corpus")
    position_of = {f"/corpus/{entry.path}": i for i, entry in enumerate(manifest)}  # the plan's order
    asked = [position_of[r.path] for r in http_origin.requests if r.path in position_of]
    assert len(asked) >= sum(len(entry.blocks) for entry in manifest)  # a request per block
    first = {p: asked.index(p) for p in set(asked)}
    last = {p: len(asked) - 1 - asked[::-1].index(p) for p in set(asked)}
    # The first requests find the gate empty and go to whichever blobs got their lock and their room
    # first, whatever their place; past those, a blob's requests go out in its turn. The next blob
    # may begin while the last requests of one are out.
    started = set(asked[:2])
    for later in set(range(len(manifest))) - started:
        for earlier in range(later - 1):
            assert last[earlier] < first[later], (earlier, later, asked)


async def test_a_plans_window_digests_are_made_once_per_window(http_origin, tmp_path):
    # Every blob's reservation of room asks the engine what it protects (every plan's window): made
    # anew each time, a plan over thousands of shards cost seconds of CPU, quadratic in the shards.
    manifest = make_corpus(http_origin.root / "corpus", shards=6)
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20)) as cache:
        async with Engine(cache, fetch_config()) as engine:
            dataset = await engine.open_dataset(SourceConfig(f"{http_origin.url}/corpus"))
            plan = engine.plan(dataset, window_bytes=manifest.total_bytes, name="stage")
            first = plan.window_digests()
            assert first == {entry.digest for entry in manifest}
            assert plan.window_digests() is first  # the same window: the same set, not made again
            protected = engine.protected_digests()
            assert all(entry.digest in protected for entry in manifest)
            plan.advance(2)
            moved = plan.window_digests()
            assert moved == {entry.digest for entry in list(manifest)[2:]} and moved is not first
            await plan.close()


async def test_a_one_block_blob_takes_three_trips_to_the_disk_threads_and_none_to_give_back_its_lock(
        http_origin, tmp_path, monkeypatch):
    # With thousands of small shards, each hand-over between the event loop and a thread (two wake-ups)
    # is a cost of its own: a blob's commit closes its handle in the same trip, and a byte lock is
    # given back by the loop itself (one system call that never waits).
    from collections import Counter

    from stager.engine.disk_threads import DiskThreads

    manifest = make_corpus(http_origin.root / "corpus", shards=4, tokens=10_000)
    assert all(len(entry.blocks) == 1 for entry in manifest)
    trips: Counter[str] = Counter()
    start, start_in_turn = DiskThreads.start, DiskThreads.start_in_turn

    def counted(self, fn, *args, **kwargs):
        trips[getattr(fn, "__name__", repr(fn))] += 1
        return start(self, fn, *args, **kwargs)

    def counted_in_turn(self, key, fn, *args, **kwargs):
        trips[getattr(fn, "__name__", repr(fn))] += 1
        return start_in_turn(self, key, fn, *args, **kwargs)

    monkeypatch.setattr(DiskThreads, "start", counted)
    monkeypatch.setattr(DiskThreads, "start_in_turn", counted_in_turn)
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20)) as cache:
        async with Engine(cache, fetch_config()) as engine:
            dataset = await engine.open_dataset(SourceConfig(f"{http_origin.url}/corpus"))
            lock_trips = Counter()
            submit = engine.context.lock_waiters.submit

            def counted_submit(fn, *args, **kwargs):
                lock_trips[getattr(fn, "__name__", repr(fn))] += 1
                return submit(fn, *args, **kwargs)

            monkeypatch.setattr(engine.context.lock_waiters, "submit", counted_submit)
            trips.clear()
            await asyncio.wait_for(asyncio.gather(*(engine.ensure(dataset.ref(i)) for i in range(len(manifest)))), 60)
        assert_cache_matches(cache, manifest, http_origin.root / "corpus")
    blobs = len(manifest)
    assert trips == {"begin": blobs, "_finish_block": blobs, "_commit_and_close": blobs}, trips
    assert lock_trips == {"attempt_lock": blobs}, lock_trips  # the tries; the releases are the loop's


async def test_the_spans_of_one_blob_write_its_file_one_at_a_time(s3_bucket, tmp_path, monkeypatch):
    """Several requests fill one blob at once, but its writes take turns on the disk threads: two
    threads writing one file at once only spin on its inode lock (a tenth of a run's CPU)."""
    from stager.cache import PartialBlob

    manifest = make_corpus(s3_bucket.path / "corpus", shards=2, tokens=600_000)  # 1.2 MB: ten requests each
    real = PartialBlob.write_into_block
    lock = threading.Lock()
    writing: dict[str, int] = {}
    most = [0]
    writes = [0]

    def tracked(self, index, offset, buffers):
        with lock:
            writing[self.digest] = writing.get(self.digest, 0) + 1
            most[0] = max(most[0], writing[self.digest])
            writes[0] += 1
        try:
            time.sleep(0.002)  # long enough for a second writer of the same file to show up
            return real(self, index, offset, buffers)
        finally:
            with lock:
                writing[self.digest] -= 1

    monkeypatch.setattr(PartialBlob, "write_into_block", tracked)
    source = SourceConfig(f"{s3_bucket.url}/corpus", s3_bucket.storage_options())
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20)) as cache:
        async with Engine(cache, fetch_config(concurrency=16)) as engine:
            await asyncio.wait_for(stage_all(engine, source), 60)
        assert_cache_matches(cache, manifest, s3_bucket.path / "corpus")
    assert writes[0] >= 10
    assert most[0] == 1


async def test_a_spent_receive_budget_never_leaves_blocks_waiting_on_buffers_they_pin(
        http_origin, fault_proxy, tmp_path, monkeypatch):
    """Connections past the session's receive budget wait for a buffer to come free; a request's
    batch of bytes for a block must not wait for more bytes meanwhile, since its views pin the very
    buffers the waiting connections need (with a small budget and slow links, that stalled them all).
    The pool's last resort (a waiter reading on past the budget when nothing came free for a while)
    is turned off here, so only buffers that really come free keep the staging going."""
    from stager.store import wire

    monkeypatch.setattr(wire, "RECV_BUDGET", 4 * wire.RECV_BUFFER)
    monkeypatch.setattr(wire, "BUFFER_STUCK", 1e9)
    root = http_origin.root / "slow"
    manifest = generate_corpus(root, shards=4, tokens_per_shard=4 << 20, seed=3, block_size=1 << 20)
    proxy = fault_proxy(http_origin, FaultPlan(connection_bps=4_000_000))  # each answer trickles in
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20)) as cache:
        async with Engine(cache, fetch_config(concurrency=8, request_bytes=4 << 20)) as engine:
            await asyncio.wait_for(stage_all(engine, SourceConfig(f"{proxy.url}/slow")), 60)
        assert_cache_matches(cache, manifest, root)


async def test_blocks_are_hashed_on_the_disk_threads_never_on_the_event_loop(http_origin, fault_proxy, tmp_path,
                                                                             monkeypatch):
    # The event loop carries every connection: hashing a gigabyte there (a quarter of a second on the
    # machines measured) is time no socket is read. Flipped bodies must still be caught.
    import xxhash

    from stager.engine import span_writer

    hashed_on: set[str] = set()
    real = xxhash.xxh3_64

    class Recorded:
        def __init__(self) -> None:
            self._hasher = real()

        def update(self, data) -> None:
            hashed_on.add(threading.current_thread().name)
            self._hasher.update(data)

        def intdigest(self) -> int:
            return self._hasher.intdigest()

    monkeypatch.setattr(span_writer, "xxhash", types.SimpleNamespace(xxh3_64=Recorded))
    manifest = make_corpus(http_origin.root / "corpus", shards=3)
    proxy = fault_proxy(http_origin, FaultPlan(flip_p=0.3), seed=3)
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20)) as cache:
        async with Engine(cache, fetch_config()) as engine:
            await asyncio.wait_for(stage_all(engine, SourceConfig(f"{proxy.url}/corpus")), 60)
            loop_thread = threading.current_thread().name
            stats = engine.stats
        assert_cache_matches(cache, manifest, http_origin.root / "corpus")
    assert proxy.faults.get("flip", 0) > 0 and stats.verify_failures > 0
    assert hashed_on and loop_thread not in hashed_on, hashed_on
