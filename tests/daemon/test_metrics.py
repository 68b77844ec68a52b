"""/metrics parses with prometheus-client's own parser, and its counters match what the test did.

The origin sits behind the fault proxy, which injects a known number of 503
SlowDowns and flipped bytes into shard reads; the daemon's counters must
agree with the proxy's count of what it injected and forwarded.
"""

from __future__ import annotations

import asyncio

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from stager.config import FetchConfig, RetryConfig, SourceConfig
from stager.testing import Fault


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample as ``{(name, sorted labels): value}``, parsed by prometheus-client itself."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


async def scrape(node) -> dict:
    status, text = await node.raw("GET", "/metrics")
    assert status == 200
    return parse(text)


async def test_metrics_count_what_happened(node):
    retry = RetryConfig(attempts=12, backoff_base=0.01, backoff_max=0.05, deadline=20.0, request_timeout=5.0)
    m = node.corpus.manifest
    # One request per block: enough requests for every fault asked for, and one clean answer per block.
    daemon = await node.start(fetch=FetchConfig(concurrency=4, hedge=False, retry=retry, request_bytes=m.block_size),
                              metrics_address="127.0.0.1:0")
    node.proxy.update(slowdown_p=0.25, flip_p=0.25, max_faults=8, path_regex=r"shard-")
    blocks = sum(len(m.block_digests(i)) for i in range(len(m)))
    session = node.session()
    dataset = await session.open_dataset(SourceConfig(node.proxy.url))
    plan = await session.plan(dataset, name="reader")
    for position in range(len(m)):
        await plan.ready(position)

    labels = {"consumer": session.consumer_id, "plan": "p0", "dataset": dataset.url}
    # Everything is ready, nothing consumed yet. A consumer may see a blob's file a moment before the
    # daemon's index records the commit, so give the snapshot a bounded moment to catch up.
    for _ in range(50):
        before = await scrape(node)
        if value(before, "stager_plan_ready_ahead_steps", **labels) == len(m):
            break
        await asyncio.sleep(0.1)
    assert value(before, "stager_plan_ready_ahead_steps", **labels) == len(m)
    assert value(before, "stager_plan_ready_ahead_bytes", **labels) == m.total_bytes
    assert value(before, "stager_plan_cursor", **labels) == 0
    assert value(before, "stager_plan_length", **labels) == len(m)
    for position in range(len(m)):
        await plan.advance(position + 1)
    after = await scrape(node)
    assert value(after, "stager_plan_cursor", **labels) == len(m)
    assert value(after, "stager_plan_ready_ahead_steps", **labels) == 0

    faults = node.proxy.faults
    slowdowns, flips = faults.get(Fault.SLOWDOWN, 0), faults.get(Fault.FLIP, 0)
    assert slowdowns + flips == 8, "the proxy injected every fault it was asked for"
    shard_requests = [e for e in node.proxy.events if e.method == "GET"]
    clean = sum(1 for e in shard_requests if not e.faults)
    assert clean == blocks, "each block was answered cleanly once (no hedges, no duplicate fetches)"

    assert value(after, "stager_staged_bytes_total") == m.total_bytes
    assert value(after, "stager_staged_blocks_total") == blocks
    assert value(after, "stager_staged_blobs_total") == len(m)
    assert value(after, "stager_verify_failures_total") == flips
    assert value(after, "stager_origin_requests_total", outcome="throttled") == slowdowns
    assert value(after, "stager_origin_requests_total", outcome="corrupt") == flips
    # + the daemon's manifest read: one GET of the whole object
    assert value(after, "stager_origin_requests_total", outcome="ok") == clean + 1
    assert value(after, "stager_origin_retries_total") == slowdowns + flips
    assert value(after, "stager_origin_gave_up_total") == 0
    assert value(after, "stager_hedged_requests_total") == 0
    assert value(after, "stager_fetch_concurrency_ceiling") == 4  # the configured concurrency, a ceiling
    assert 1 <= value(after, "stager_fetch_concurrency") <= 4  # where the SlowDowns left the adaptive limit
    assert value(after, "stager_fetch_concurrency") == daemon.engine.gate.limit  # the live limit, nothing in flight
    assert value(after, "stager_fetch_requests_in_flight") == 0  # all staged
    assert value(after, "stager_fetch_throttle_backoffs_total") >= 1  # the SlowDowns above cut the limit
    served = value(after, "stager_served_blobs_total", outcome="hit") + \
        value(after, "stager_served_blobs_total", outcome="miss")
    assert served == len(m)
    assert value(after, "stager_served_bytes_total", outcome="hit") + \
        value(after, "stager_served_bytes_total", outcome="miss") == m.total_bytes
    assert value(after, "stager_ready_wait_seconds_count") == session.daemon.polls
    assert value(after, "stager_consumer_wait_seconds_total") > 0
    assert value(after, "stager_cache_capacity_bytes") == node.capacity
    assert value(after, "stager_cache_used_bytes") >= m.total_bytes
    assert value(after, "stager_cache_blobs", state="complete") == len(m)
    assert value(after, "stager_cache_evictions_total") == 0
    assert [value(after, f"stager_{name}") for name in ("consumers", "plans", "datasets")] == [1, 1, 1]
    assert value(after, "process_resident_memory_bytes") > 0

    # The same numbers over TCP, where nothing but /metrics and /healthz is served.
    async with aiohttp.ClientSession() as client:
        base = f"http://127.0.0.1:{daemon.metrics_port}"
        async with client.get(f"{base}/metrics") as response:
            assert value(parse(await response.text()), "stager_staged_bytes_total") == m.total_bytes
        async with client.get(f"{base}/healthz") as response:
            assert response.status == 200 and (await response.json())["status"] == "ok"
        async with client.put(f"{base}/v1/consumers/x/plans/y", json={}) as response:
            assert response.status == 404


async def test_evictions_are_counted_as_a_dataset_streams_through_a_small_cache(node):
    m = node.corpus.manifest
    node.capacity = int(m.sizes.max()) * 4 + 64 * 1024  # a few shards at a time
    await node.start()
    session = node.session()
    dataset = await session.open_dataset(SourceConfig(node.proxy.url))
    plan = await session.plan(dataset, window_bytes=int(m.sizes.max()))
    for position in range(len(m)):
        path = await plan.ready(position)
        assert path.read_bytes() == (node.corpus.root / m.paths[position]).read_bytes()
        await plan.advance(position + 1)
    samples = await scrape(node)
    staged = value(samples, "stager_staged_blobs_total")
    left = sum(value(samples, "stager_cache_blobs", state=state) for state in ("complete", "partial"))
    assert staged == len(m)
    assert value(samples, "stager_cache_evictions_total") == staged - left > 0
    assert value(samples, "stager_cache_evicted_bytes_total") > 0
