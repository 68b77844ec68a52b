"""Through the fault proxy: every fault is retried and the bytes returned are the origin's, exactly.

Each read carries a ``check`` that compares an xxh3 digest, as the engine
will, so a flipped byte is caught and re-read rather than returned.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
import xxhash

from stager.config import RetryConfig
from stager.errors import CorruptData, OriginUnavailable, ShardNotFound
from stager.loopback.fault_plan import FaultPlan

from .origins import Origin, make_origin

BLOCK = 64 * 1024
DATA = os.urandom(16 * BLOCK + 123)
RETRY = RetryConfig(attempts=12, backoff_base=0.005, backoff_max=0.05, deadline=60.0, request_timeout=15.0)

#: plan, the proxy's fault counter that must be non-zero, the store counter that must be non-zero
#: (max_faults bounds the retries, so a busy machine cannot make a test slow)
FAULTS = {
    "slowdown": (FaultPlan(slowdown_p=0.5, max_faults=6), "slowdown", "throttled"),
    "error500": (FaultPlan(error500_p=0.5, max_faults=6), "error500", "transient"),
    "reset": (FaultPlan(reset_p=0.5, max_faults=6), "reset", "transient"),
    "truncate": (FaultPlan(truncate_p=0.5, max_faults=6), "truncate", "transient"),
    "flip": (FaultPlan(flip_p=0.5, max_faults=6), "flip", "corrupt"),
    "ignore_range": (FaultPlan(ignore_range_p=0.5, max_faults=6), "ignore_range", "range_ignored"),
    "spike": (FaultPlan(spike_p=1.0, spike_s=6.0, max_faults=1), "spike", "transient"),
    "latency": (FaultPlan(latency_s=0.01, jitter_s=0.02), None, None),
    "bandwidth": (FaultPlan(bandwidth_bps=8_000_000), None, None),
    "mixed": (
        FaultPlan(
            slowdown_p=0.1, error500_p=0.1, reset_p=0.1, truncate_p=0.1, flip_p=0.1, ignore_range_p=0.1, max_faults=8
        ),
        None,
        "retries",
    ),
}


def digest_check(expected: bytes):
    want = xxhash.xxh3_64_intdigest(expected)

    def check(data: bytes) -> None:
        if xxhash.xxh3_64_intdigest(data) != want:
            raise CorruptData("xxh3 mismatch")

    return check


@pytest.fixture(params=["http", "s3"])
def kind(request) -> str:
    return request.param


@pytest.fixture
async def proxied(kind: str, request, tmp_path: Path, fault_proxy):
    """Make (origin, proxy) for a plan and retry config; the stores are closed at teardown."""
    made: list[Origin] = []

    def make(plan: FaultPlan, retry: RetryConfig = RETRY, seed: int = 0):
        proxies = []

        def via(upstream):
            proxies.append(fault_proxy(upstream, plan, seed=seed))
            return proxies[-1].url

        origin = make_origin(kind, request, tmp_path, retry=retry, via_proxy=via)
        made.append(origin)
        return origin, proxies[0]

    try:
        yield make
    finally:
        for origin in made:
            await origin.store.close()


async def warm_up(origin: Origin) -> None:
    """Connect (and for S3 create the client) before a fault, within a few short deadlines."""
    for _ in range(20):  # bounded; on a busy machine the first connection may outlast one deadline
        try:
            await origin.store.info("shard.bin")
            return
        except OriginUnavailable:
            continue
    raise AssertionError("the origin never answered before the fault")


async def read_all_blocks(origin: Origin) -> list[bytes]:
    async def one(start: int) -> bytes:
        end = min(start + BLOCK, len(DATA))
        return await origin.store.read_range("shard.bin", start, end, check=digest_check(DATA[start:end]))

    return await asyncio.gather(*(one(s) for s in range(0, len(DATA), BLOCK)))


#: On S3 the kinds whose handling differs from plain HTTP (XML error codes, a re-signed
#: request without Range, the signed-GET body checks) and the mix of all; the rest is
#: the same code path as HTTP and runs there only, to keep the suite fast.
S3_FAULTS = ("slowdown", "truncate", "flip", "ignore_range", "mixed")


@pytest.mark.parametrize(
    ("kind", "fault"),
    [("http", fault) for fault in FAULTS] + [("s3", fault) for fault in S3_FAULTS],
    indirect=["kind"],
)
async def test_every_fault_is_survived_with_exact_bytes(proxied, fault):
    plan, proxy_counter, store_counter = FAULTS[fault]
    retry = RETRY
    if fault == "spike":  # the one spike must outlast the attempt timeout to matter
        retry = RetryConfig(attempts=12, backoff_base=0.005, backoff_max=0.05, deadline=60.0, request_timeout=2.5)
    origin, proxy = proxied(plan.copy(), retry, seed=3)
    origin.put("shard.bin", DATA)
    blocks = await read_all_blocks(origin)
    assert b"".join(blocks) == DATA
    if proxy_counter is not None:
        assert proxy.stats().faults.get(proxy_counter, 0) > 0, proxy.stats()
    if store_counter is not None:
        assert getattr(origin.store.stats, store_counter) > 0, origin.store.stats
    assert origin.store.stats.gave_up == 0


async def test_whole_object_reads_survive_faults(proxied):
    plan = FaultPlan(error500_p=0.3, reset_p=0.2, truncate_p=0.2)
    origin, proxy = proxied(plan, seed=5)
    origin.put("shard.bin", DATA)
    for _ in range(4):
        assert await origin.store.read("shard.bin") == DATA
    assert proxy.stats().total_faults > 0


async def test_not_found_fails_fast_naming_the_path(proxied):
    origin, proxy = proxied(FaultPlan(latency_s=0.0))
    with pytest.raises(ShardNotFound, match="missing/shard-0007.bin"):
        await origin.store.read_range("missing/shard-0007.bin", 0, 100)
    # Fast means not retried: one request reached the origin (wall time is the machine's).
    assert proxy.stats().requests == 1
    assert origin.store.stats.retries == 0


@pytest.mark.parametrize("mode", ["503", "reset", "refuse"])
async def test_origin_that_stays_down_raises_unavailable_within_the_deadline(proxied, mode):
    retry = RetryConfig(attempts=1000, backoff_base=0.02, backoff_max=0.1, deadline=1.0, request_timeout=0.5)
    origin, proxy = proxied(FaultPlan(), retry)
    origin.put("shard.bin", DATA)
    await warm_up(origin)
    gave_up = origin.store.stats.gave_up
    proxy.set_down(True, mode)
    started = time.monotonic()
    with pytest.raises(OriginUnavailable, match="shard.bin") as info:
        await origin.store.read_range("shard.bin", 0, BLOCK)
    elapsed = time.monotonic() - started
    assert elapsed < retry.deadline + 2.0, elapsed
    assert "gave up" in str(info.value)
    assert origin.store.stats.gave_up == gave_up + 1


async def test_origin_that_comes_back_is_read(proxied):
    retry = RetryConfig(attempts=10_000, backoff_base=0.02, backoff_max=0.1, deadline=60.0, request_timeout=15.0)
    origin, proxy = proxied(FaultPlan(), retry)
    origin.put("shard.bin", DATA)
    await warm_up(origin)
    proxy.set_down(True, "503")
    task = asyncio.create_task(origin.store.read_range("shard.bin", 0, BLOCK, check=digest_check(DATA[:BLOCK])))
    for _ in range(500):  # bounded: until the store has been turned away a few times
        if proxy.stats().faults.get("down", 0) >= 3:
            break
        await asyncio.sleep(0.02)
    assert not task.done()
    proxy.set_down(False)
    assert await asyncio.wait_for(task, 30) == DATA[:BLOCK]
    assert origin.store.stats.throttled > 0
