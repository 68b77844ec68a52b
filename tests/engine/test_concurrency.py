"""Adaptive concurrency: the controller's rules, and the engine against an origin that behaves like an object store.

The engine tests count requests in flight at the proxy and 503s it answered;
none asserts a wall time.
"""

from __future__ import annotations

import asyncio

import pytest

from stager.cache import CacheTier
from stager.config import CacheConfig, FetchConfig, RetryConfig, SourceConfig
from stager.engine import Engine, PriorityGate
from stager.engine.concurrency import INITIAL, QUEUED_FOOTPRINT, ConcurrencyController, MemoryBound
from stager.loopback.fault_plan import FaultPlan

from .corpus import BLOCK, assert_cache_matches, make_corpus

pytestmark = pytest.mark.timeout(120)

MiB = 1 << 20
FAST_RETRY = RetryConfig(attempts=200, backoff_base=0.01, backoff_max=0.2, deadline=60, request_timeout=10)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fetch_config(**kw) -> FetchConfig:
    # requests of two blocks (128 KiB): many requests per shard, each a few tenths of a second when capped
    return FetchConfig(**{"retry": FAST_RETRY, "durable": False, "hedge": False, "request_bytes": 2 * BLOCK, **kw})


async def stage_all(engine: Engine, url: str):
    dataset = await engine.open_dataset(SourceConfig(url))
    await asyncio.gather(*(engine.ensure(dataset.ref(i), priority=float(i)) for i in range(len(dataset.manifest))))
    return dataset


# -- the controller's rules (a fake clock, samples as the gate reports them) -----------------------------


def test_grows_while_each_request_keeps_its_speed_and_settles_when_the_link_is_full():
    clock = FakeClock()
    controller = ConcurrencyController(256, full_request=1 << 20, clock=clock)
    assert controller.limit == INITIAL
    per_connection, link = 8e6, 400e6  # bytes/s: the link holds 50 connections at full speed
    for _ in range(2000):
        in_flight = controller.limit
        speed = min(per_connection, link / in_flight)
        seconds = 0.04 + (1 << 20) / speed
        clock.now += seconds / in_flight
        controller.on_done(seconds, 1 << 20, saturated=True)
    assert 45 <= controller.peak <= 256
    assert 40 <= controller.limit <= 120  # near the 50 that fill the link, not the ceiling


def test_stays_at_the_ceiling_and_never_grows_when_not_saturated():
    controller = ConcurrencyController(24, full_request=1000, clock=FakeClock())
    for _ in range(200):
        controller.on_done(0.1, 1000, saturated=True)
    assert controller.limit == 24
    idle = ConcurrencyController(256, full_request=1000, clock=FakeClock())
    for _ in range(200):
        idle.on_done(0.1, 1000, saturated=False)
    assert idle.limit == INITIAL


def test_latency_alone_never_cuts_below_the_limit_of_the_best_throughput():
    # a host whose CPU is the bottleneck: every request slows as more run, yet more of them move more bytes
    clock = FakeClock()
    controller = ConcurrencyController(256, full_request=1000, clock=clock)
    for _ in range(400):
        in_flight = controller.limit
        seconds = 0.1 * (1 + in_flight / 16)  # slower and slower per request...
        clock.now += seconds / in_flight
        controller.count_bytes(1000, saturated=True)  # ...but throughput still rises with in_flight / (1 + in_flight / 16)
        controller.on_done(seconds, 1000, saturated=True)
    assert controller.limit > 2 * INITIAL


def test_slow_start_grows_with_the_bytes_of_requests_still_in_flight():
    controller = ConcurrencyController(256, full_request=8 << 20, clock=FakeClock())
    for _ in range(16 * 4):  # a quarter of each of the first 16 requests has arrived, none has ended
        controller.count_bytes(512 << 10, saturated=True)
    assert controller.limit == 16 + 32  # one more per MiB arrived: doubled once each delivered a MiB
    assert controller.count_bytes(1 << 20, saturated=False) == 48  # not saturated: no reason to grow


def test_slow_start_ends_where_more_requests_stopped_bringing_more_bytes():
    # A bottleneck all requests share (the origin's CPU, a proxy): 200 MB/s whatever the number in flight.
    # Requests of 8 MiB end only after dozens more were added, too late for the latency signal alone.
    clock = FakeClock()
    shared = ConcurrencyController(256, full_request=8 * MiB, clock=clock)
    for _ in range(200):
        clock.now += MiB / 200e6
        shared.count_bytes(MiB, saturated=True)
    assert not shared.slow_start
    assert 30 <= shared.limit <= 40 and shared.peak < 80  # the first doubling paid nothing: back to its start
    # Each connection capped (8 MB/s each): every doubling doubles the bytes, and slow start goes on
    # until the ceiling (where the limit stops doubling, and so do the bytes).
    clock = FakeClock()
    capped = ConcurrencyController(256, full_request=8 * MiB, clock=clock)
    for _ in range(2000):
        clock.now += MiB / min(capped.limit * 8e6, 4e9)
        capped.count_bytes(MiB, saturated=True)
        if not capped.slow_start:
            break
    assert capped.limit == 256


def test_short_requests_do_not_count_as_latency():
    controller = ConcurrencyController(256, full_request=1 << 20, clock=FakeClock())
    for _ in range(100):
        controller.on_done(0.1, 1 << 20, saturated=True)
        controller.on_done(0.1, 4096, saturated=True)  # a tail request: mostly first-byte latency
    assert controller.limit > 4 * INITIAL


def test_throttling_halves_the_limit_once_per_round_trip_and_may_go_below_the_start():
    clock = FakeClock()
    throttled = 0
    controller = ConcurrencyController(256, full_request=1000, throttled=lambda: throttled, clock=clock)
    for _ in range(24):  # slow start: two more per finished request
        clock.now += 0.01
        controller.on_done(0.1, 1000, saturated=True)
    assert controller.limit == 64
    throttled += 5  # a burst of SlowDowns seen by the retry policy
    assert controller.on_done(0.1, 1000, saturated=True) == 32
    throttled += 5
    assert controller.on_throttle() == 32  # same round trip: not cut again
    clock.now += 1.0
    throttled += 1
    assert controller.on_throttle() == 16
    clock.now += 1.0
    throttled += 1
    assert controller.on_throttle() == 8  # below the start: the origin asked for it
    assert controller.throttle_cuts == 3 and not controller.slow_start



def test_memory_allows_requests_by_what_each_holds_now():
    held, receiving = 0, 0
    bound = MemoryBound(192 * MiB, in_use=lambda: held, receiving=lambda: receiving)
    assert bound.cap() == 192  # nothing measured: each taken to hold its receive buffer
    held, receiving = 130 * MiB, 100  # a link capped per connection: about a buffer each
    assert bound.cap() == 147 and not bound.queueing()
    held, receiving = 150 * MiB, 30  # loopback: answers queue for the disk, five MiB each
    assert bound.cap() == 38 and bound.queueing()
    held, receiving = 4000 * MiB, 10
    assert bound.cap() == 1


def test_the_limit_stays_within_memory_and_slow_start_ends_once_bytes_queue_here():
    held, receiving = 0, 0
    bound = MemoryBound(64 * MiB, in_use=lambda: held, receiving=lambda: receiving)
    controller = ConcurrencyController(256, full_request=8 * MiB, memory=bound, clock=FakeClock())
    for _ in range(200):  # each request holds its buffer and a little: slow start runs into the memory bound
        receiving = controller.limit
        held = int(receiving * 1.5 * MiB)
        controller.count_bytes(MiB, saturated=True)
        assert controller.limit <= 43  # 64 MiB / 1.5 MiB
    assert controller.limit == 42 and controller.slow_start
    receiving, held = 40, 40 * (QUEUED_FOOTPRINT + MiB)  # now bytes arrive faster than they are written
    controller.count_bytes(MiB, saturated=True)
    assert not controller.slow_start and controller.limit == 21


def test_probing_upwards_waits_while_bytes_queue_on_this_host():
    footprint = 3 * MiB  # bytes arrive faster than this host writes them
    bound = MemoryBound(4096 * MiB, in_use=lambda: 20 * footprint, receiving=lambda: 20)
    controller = ConcurrencyController(256, full_request=8 * MiB, memory=bound, clock=FakeClock())
    controller.count_bytes(4 * MiB, saturated=True)
    assert not controller.slow_start
    for _ in range(50):  # requests keep their speed: probing would add some...
        controller.on_done(0.1, 8 * MiB, saturated=True)
    assert controller.limit == INITIAL  # ...but not while they queue here (memory would allow 1365)
    footprint = MiB  # the queue drained
    for _ in range(50):
        controller.on_done(0.1, 8 * MiB, saturated=True)
    assert controller.limit > 3 * INITIAL


def test_connections_paused_for_their_consumer_end_slow_start():
    paused = 0
    bound = MemoryBound(192 * MiB, in_use=lambda: 20 * MiB, receiving=lambda: 16, paused=lambda: paused)
    controller = ConcurrencyController(256, full_request=8 * MiB, memory=bound, clock=FakeClock())
    controller.count_bytes(4 * MiB, saturated=True)
    assert controller.slow_start and controller.limit == 20
    paused = 4  # a quarter of those receiving: their answers wait for this host
    controller.count_bytes(4 * MiB, saturated=True)
    assert not controller.slow_start and controller.limit == 20


async def test_urgent_waiters_enter_first_while_the_controller_moves_the_limit():
    controller = ConcurrencyController(64, initial=2, full_request=1)
    gate = PriorityGate(2, controller=controller)
    order: list[str] = []
    release = asyncio.Event()

    async def holder() -> None:
        async with gate.slot(0, nbytes=10):
            await release.wait()

    async def worker(name: str, priority: float) -> None:
        async with gate.slot(priority, nbytes=10):
            order.append(name)
            if name == "urgent":
                gate.set_limit(8)  # as the controller would: several waiters enter at once
            await asyncio.sleep(0.001)

    holders = [asyncio.create_task(holder()) for _ in range(2)]
    await asyncio.sleep(0)
    far = [asyncio.create_task(worker(f"far{i}", 10 + i)) for i in range(20)]
    await asyncio.sleep(0)
    urgent = asyncio.create_task(worker("urgent", -1))
    await asyncio.sleep(0)
    assert gate.waiting == 21
    release.set()
    await asyncio.wait_for(asyncio.gather(*holders, *far, urgent), 10)
    assert order[0] == "urgent" and order[1:] == [f"far{i}" for i in range(20)]
    assert gate.peak_holders >= 3 and gate.holders == 0


async def test_hold_all_freezes_the_limit_and_takes_every_slot():
    controller = ConcurrencyController(64, initial=4, full_request=1)
    gate = PriorityGate(4, controller=controller)
    await asyncio.wait_for(gate.hold_all(), 5)
    assert gate.holders == 4
    gate.set_limit(40)
    assert gate.limit == 4
    waiter = asyncio.create_task(gate.acquire())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)


# -- the engine against the object-store origin ---------------------------------------------------------


async def test_per_connection_cap_makes_the_engine_open_four_times_the_initial_requests(
        http_origin, fault_proxy, tmp_path):
    manifest = make_corpus(http_origin.root / "corpus", shards=64)
    # each response capped (a real store's connection), some first-byte latency; the link itself is not
    proxy = fault_proxy(http_origin, FaultPlan(latency_s=0.02, jitter_s=0.005, connection_bps=500_000))
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=256 << 20)) as cache:
        async with Engine(cache, fetch_config()) as engine:
            initial = engine.gate.limit
            assert initial == INITIAL
            await asyncio.wait_for(stage_all(engine, f"{proxy.url}/corpus"), 90)
            stats = engine.stats.as_dict()
        assert_cache_matches(cache, manifest, http_origin.root / "corpus")
    assert engine.concurrency.peak >= 4 * initial
    assert proxy.peak_in_flight >= 4 * initial  # really on the wire, not only the controller's number
    assert stats["concurrency_peak"] >= 4 * initial and stats["concurrency"] >= 1
    assert stats["throughput_bps"] > 0


async def test_slowdown_makes_the_engine_back_off(http_origin, fault_proxy, tmp_path):
    manifest = make_corpus(http_origin.root / "corpus", shards=40)
    proxy = fault_proxy(http_origin, FaultPlan(latency_s=0.005, rate_limit_rps=150.0, rate_limit_burst=10.0))
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=256 << 20)) as cache:
        async with Engine(cache, fetch_config()) as engine:
            dataset = await engine.open_dataset(SourceConfig(f"{proxy.url}/corpus"))
            proxy.reset_peak()
            staging = asyncio.ensure_future(asyncio.gather(
                *(engine.ensure(dataset.ref(i), priority=float(i)) for i in range(len(manifest)))))
            in_flight_after_cut: list[int] = []
            for _ in range(3000):  # bounded: ~30 s of 10 ms looks
                if staging.done():
                    break
                await asyncio.sleep(0.01)
                if engine.concurrency.throttle_cuts >= 2:
                    in_flight_after_cut.append(proxy.in_flight)
            await asyncio.wait_for(staging, 60)
            limit_after = engine.gate.limit
        assert_cache_matches(cache, manifest, http_origin.root / "corpus")
    slowdowns = proxy.faults.get("rate_limit", 0)
    served = proxy.requests - slowdowns
    assert slowdowns > 0 and engine.origin_stats.throttled == slowdowns
    assert engine.concurrency.throttle_cuts >= 2
    assert limit_after < INITIAL  # below the start: only SlowDown can do that
    assert in_flight_after_cut and min(in_flight_after_cut) < INITIAL
    # Bounded: alone, 33 to 97 refusals for 116 requests served, over 120 on two loaded cores (short
    # requests, so even a few in flight ask faster than 150/s; the retries' back-off does the rest).
    # Without the cuts and the back-off, 16 requests in flight 5 ms away would ask about 3,000
    # times a second against the 150 allowed: some twenty refusals per request served.
    assert slowdowns <= 2 * served


async def test_an_urgent_block_overtakes_prefetch_with_the_controller_active(http_origin, fault_proxy, tmp_path):
    root = http_origin.root / "corpus"
    manifest = make_corpus(root, shards=40)
    proxy = fault_proxy(http_origin, FaultPlan(latency_s=0.02, connection_bps=500_000))
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=256 << 20)) as cache:
        async with Engine(cache, fetch_config(request_bytes=BLOCK)) as engine:
            dataset = await engine.open_dataset(SourceConfig(f"{proxy.url}/corpus"))
            whole = [asyncio.ensure_future(engine.ensure(dataset.ref(i), priority=float(10 + i)))
                     for i in range(len(manifest) - 1)]
            for _ in range(500):  # bounded: until the gate is full and a queue formed
                if engine.gate.waiting > engine.gate.limit:
                    break
                await asyncio.sleep(0.01)
            assert engine.gate.waiting > engine.gate.limit
            last = dataset.ref(len(manifest) - 1)
            data = await asyncio.wait_for(engine.read_block(last, 0), 20)
            assert data == (root / last.path).read_bytes()[:BLOCK]
            # it went ahead of the queue: most prefetched blobs are still being fetched
            assert sum(not w.done() for w in whole) >= len(whole) // 2
            await asyncio.wait_for(asyncio.gather(*whole), 90)


async def test_an_urgent_block_overtakes_prefetch_waiting_for_receive_buffers(http_origin, fault_proxy, tmp_path,
                                                                              monkeypatch):
    """Past the receive budget prefetch connections wait for a buffer to come free (here a slow disk
    keeps every buffer busy); the request for a block a consumer is blocked on never waits with them."""
    import time

    from stager.cache import PartialBlob
    from stager.store import wire

    monkeypatch.setattr(wire, "RECV_BUDGET", 2 * wire.RECV_BUFFER)
    monkeypatch.setattr(wire, "BUFFER_STUCK", 1e9)  # no last resort: only urgency lets a request read on
    root = http_origin.root / "corpus"
    manifest = make_corpus(root, shards=8, tokens=1_000_000)  # 2 MB each
    urgent_digest = manifest[len(manifest) - 1].digest
    real_write = PartialBlob.write_into_block

    def slow_disk(self, index, offset, buffers):  # prefetch's writes hold their buffers a while
        if self.digest != urgent_digest:
            time.sleep(0.05)
        return real_write(self, index, offset, buffers)

    real_wait = wire.BufferPool.wait_for_buffer
    waits = {"urgent": 0, "prefetch": 0}

    def counting(self, connection):
        response = connection._response
        waits["urgent" if response is not None and response.urgent() else "prefetch"] += 1
        real_wait(self, connection)

    monkeypatch.setattr(PartialBlob, "write_into_block", slow_disk)
    monkeypatch.setattr(wire.BufferPool, "wait_for_buffer", counting)
    proxy = fault_proxy(http_origin, FaultPlan(connection_bps=4_000_000))
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=256 << 20)) as cache:
        async with Engine(cache, fetch_config(concurrency=8, request_bytes=1 << 20)) as engine:
            dataset = await engine.open_dataset(SourceConfig(f"{proxy.url}/corpus"))
            whole = [asyncio.ensure_future(engine.ensure(dataset.ref(i), priority=float(10 + i)))
                     for i in range(len(manifest) - 1)]
            for _ in range(500):  # bounded: until prefetch connections wait for buffers
                if waits["prefetch"] >= 4:
                    break
                await asyncio.sleep(0.01)
            assert waits["prefetch"] >= 4
            last = dataset.ref(len(manifest) - 1)
            data = await asyncio.wait_for(engine.read_block(last, 3), 20)
            assert data == (root / last.path).read_bytes()[3 * BLOCK:4 * BLOCK]
            assert sum(not w.done() for w in whole) >= len(whole) // 2  # it went ahead of them
            await asyncio.wait_for(asyncio.gather(*whole), 120)
    assert waits["urgent"] == 0
