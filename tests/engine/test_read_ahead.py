"""Read-ahead bounded by time: a plan stages seconds of its consumer's measured rate past a floor, within its window.

The rate's clock is the test's own (nothing here sleeps to make a rate); the
origin is a real HTTP server on loopback, and what the plan staged is counted
in the cache and in the engine's counters once its prefetcher is idle.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from stager.cache import BlobState, CacheTier
from stager.config import CacheConfig, FetchConfig, RetryConfig, SourceConfig
from stager.engine import Engine
from stager.engine.read_ahead import FIRST_GUESS_BYTES, MIN_INTERVAL, ConsumptionRate, ReadAhead
from stager.errors import ConfigError, StagerError
from stager.write import generate_corpus

from .corpus import BLOCK

FAST_RETRY = RetryConfig(attempts=20, backoff_base=0.01, backoff_max=0.1, deadline=30, request_timeout=5)
SETTLE = 30.0  # seconds a prefetcher may take to stage a few hundred KB on loopback (a bound, not a measure)


class Clock:
    """A time base the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# -- the rate and the bounds, alone ----------------------------------------------------------------


def test_the_first_measurement_is_taken_as_it_is():
    clock = Clock()
    rate = ConsumptionRate(clock)
    assert rate.rate is None
    clock.now += 4.0
    rate.passed(8_000_000)
    assert rate.rate == pytest.approx(2_000_000)


def test_moves_closer_than_the_minimum_interval_are_measured_together():
    clock = Clock()
    rate = ConsumptionRate(clock)
    for _ in range(4):
        clock.now += MIN_INTERVAL / 4
        rate.passed(1_000)
    assert rate.observations == 1
    assert rate.rate == pytest.approx(4_000 / MIN_INTERVAL)


def test_the_rate_rises_quickly_and_falls_slowly_never_by_more_than_half_at_once():
    clock = Clock()
    rate = ConsumptionRate(clock)
    clock.now += 10
    rate.passed(10_000_000)  # 1 MB/s
    clock.now += 10
    rate.passed(100_000_000)  # 10 MB/s over 10 s: most of the way up at once
    assert rate.rate > 6_000_000
    high = rate.rate
    clock.now += 300  # a pause (a checkpoint): the cursor did not move for five minutes
    rate.passed(1_000)
    assert rate.rate == pytest.approx(high / 2)  # not collapsed
    clock.now += 10
    rate.passed(50_000_000)  # reading again at 5 MB/s
    assert rate.rate > high / 2


def test_the_bounds_floor_plus_seconds_of_the_rate_within_the_cap():
    bounds = ReadAhead(cap_bytes=1000, floor_bytes=200, seconds=10)
    assert bounds.bytes_for(None) == 1000  # the first guess (64 MiB) is past the cap here
    assert ReadAhead(10 * FIRST_GUESS_BYTES, 200, 10).bytes_for(None) == 200 + FIRST_GUESS_BYTES
    assert bounds.bytes_for(0.0) == 200
    assert bounds.bytes_for(30.0) == 500
    assert bounds.bytes_for(1e9) == 1000
    assert ReadAhead(cap_bytes=100, floor_bytes=500).floor_bytes == 100  # the cache's bound wins
    for bad in (dict(cap_bytes=0), dict(cap_bytes=1, floor_bytes=-1), dict(cap_bytes=1, seconds=0.0),
                dict(cap_bytes=1, seconds=float("inf"))):
        with pytest.raises(ValueError):
            ReadAhead(**bad)


def test_fetch_settings_check_the_seconds_ahead():
    assert FetchConfig(ahead_seconds="30").ahead_seconds == 30.0
    with pytest.raises(ConfigError, match="ahead_seconds"):
        FetchConfig(ahead_seconds=0)
    with pytest.raises(ConfigError, match="ahead_seconds"):
        FetchConfig(ahead_seconds=float("nan"))


# -- plans against a real origin -------------------------------------------------------------------


@pytest.fixture
def corpus(http_origin):
    """24 shards of the same size (100 KB, two blocks), served over HTTP on loopback."""
    manifest = generate_corpus(http_origin.root / "corpus", shards=24, tokens_per_shard=50_000, seed=3,
                               block_size=BLOCK, jitter=0.0)
    sizes = set(int(s) for s in manifest.sizes)
    assert len(sizes) == 1
    return SourceConfig(f"{http_origin.url}/corpus"), sizes.pop()


def staged(cache: CacheTier, plan) -> list[int]:
    """Positions of the plan whose blobs are in the cache, complete or being filled."""
    return [p for p in range(len(plan)) if cache.state(plan.ref(p).digest) is not BlobState.ABSENT]


async def settled(plan) -> None:
    """Wait (bounded) until the plan's prefetcher has asked for its whole window and nothing is in flight."""
    await asyncio.wait_for(plan.idle.wait(), SETTLE)


async def open_engine(tmp_path, source):
    cache = CacheTier(CacheConfig(tmp_path / "cache", capacity=256 << 20))
    engine = Engine(cache, FetchConfig(concurrency=8, retry=FAST_RETRY, request_bytes=2 * BLOCK))
    dataset = await engine.open_dataset(source)
    return cache, engine, dataset


async def test_a_slow_consumer_gets_its_floor_and_its_seconds_ahead_and_no_more(corpus, tmp_path):
    source, size = corpus
    cache, engine, dataset = await open_engine(tmp_path, source)
    clock = Clock()
    try:
        plan = engine.plan(dataset, window_bytes=20 * size, floor_bytes=2 * size, ahead_seconds=10.0,
                           name="slow", start=False, clock=clock)
        # One shard every 5 s: 10 s ahead is two shards past the floor of two.
        clock.now += 5.0
        plan.advance(1)
        assert plan.rate == pytest.approx(size / 5.0)
        assert plan.ahead_bytes == 4 * size
        plan.start()
        await settled(plan)
        assert staged(cache, plan) == [1, 2, 3, 4]
        assert engine.stats.blobs_completed == 4
        # It reads on at the same pace: the window slides by what it read, nothing more.
        for position in (2, 3, 4):
            clock.now += 5.0
            plan.advance(position)
            await settled(plan)
        assert plan.rate == pytest.approx(size / 5.0)
        assert staged(cache, plan) == list(range(1, 8))
        assert engine.stats.blobs_completed == 7
        await plan.close()
    finally:
        await engine.close()
        cache.close()


async def test_a_fast_consumer_gets_the_whole_byte_window(corpus, tmp_path):
    source, size = corpus
    cache, engine, dataset = await open_engine(tmp_path, source)
    clock = Clock()
    try:
        plan = engine.plan(dataset, window_bytes=6 * size, floor_bytes=2 * size, ahead_seconds=10.0,
                           name="fast", start=False, clock=clock)
        clock.now += 1.0
        plan.advance(2)  # two shards a second: 20 shards in 10 s, past the window of six
        assert plan.ahead_bytes == 6 * size
        plan.start()
        await settled(plan)
        assert staged(cache, plan) == list(range(2, 8))
        assert engine.stats.blobs_completed == 6
        await plan.close()
    finally:
        await engine.close()
        cache.close()


async def test_before_the_rate_is_known_the_floor_and_a_bounded_first_guess(corpus, tmp_path):
    source, size = corpus
    cache, engine, dataset = await open_engine(tmp_path, source)
    try:
        plan = engine.plan(dataset, window_bytes=20 * size, floor_bytes=2 * size, ahead_seconds=10.0,
                           name="cold", start=False, clock=Clock())
        plan.bounds = replace(plan.bounds, first_guess_bytes=3 * size)  # the default (64 MiB) is the whole corpus
        assert plan.rate is None and plan.ahead_bytes == 5 * size
        plan.start()
        await settled(plan)
        assert staged(cache, plan) == [0, 1, 2, 3, 4]
        await plan.close()
    finally:
        await engine.close()
        cache.close()


async def test_the_floor_holds_the_next_shuffle_window_complete_before_the_cursor_reaches_it(corpus, tmp_path):
    """A consumer so slow that its seconds ahead are nothing still finds every window complete: the
    floor (its current and next window, two shards each) is staged whatever its rate."""
    source, size = corpus
    cache, engine, dataset = await open_engine(tmp_path, source)
    clock = Clock()
    window = 2  # shards per shuffle window
    try:
        plan = engine.plan(dataset, window_bytes=20 * size, floor_bytes=2 * window * size, ahead_seconds=1.0,
                           name="floor", start=False, clock=clock)
        plan.bounds = replace(plan.bounds, first_guess_bytes=0)
        plan.start()
        for start in range(0, len(plan), window):
            await settled(plan)
            # the current and the next window are complete; nothing past them was asked for
            for position in range(start, min(len(plan), start + 2 * window)):
                assert cache.state(plan.ref(position).digest) is BlobState.COMPLETE, position
            assert staged(cache, plan)[-1] == min(len(plan), start + 2 * window) - 1
            for position in range(start, start + window):
                await asyncio.wait_for(plan.ready(position), SETTLE)
            clock.now += 1e6  # a window every eleven days: 1 s ahead is less than a byte
            plan.advance(start + window)
            assert plan.ahead_bytes == 2 * window * size
        assert engine.stats.consumer_waits == 0  # ready() never had to wait: the floor was always there
        assert engine.stats.blobs_completed == len(plan)
        await plan.close()
    finally:
        await engine.close()
        cache.close()


async def test_the_engine_default_seconds_come_from_the_fetch_settings(corpus, tmp_path):
    source, _ = corpus
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=256 << 20)) as cache:
        async with Engine(cache, FetchConfig(ahead_seconds=7.5)) as engine:
            dataset = await engine.open_dataset(source)
            plan = engine.plan(dataset, start=False)
            # no floor named: the whole window is the floor (stage, the mount, earlier consumers)
            assert (plan.ahead_seconds, plan.floor_bytes, plan.ahead_bytes) == (7.5, plan.window_bytes,
                                                                               plan.window_bytes)
            assert engine.plan(dataset, floor_bytes=0, start=False).floor_bytes == 0
            assert engine.plan(dataset, ahead_seconds=3.0, start=False).ahead_seconds == 3.0
            with pytest.raises(StagerError, match="plan bad"):
                engine.plan(dataset, ahead_seconds=-1.0, name="bad", start=False)
