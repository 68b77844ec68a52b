"""The control API with a real daemon on the test's loop: untrusted input, errors that keep their class,
long-polls, pins and eviction, draining."""

from __future__ import annotations

import asyncio
import base64
import logging
import time

import numpy as np
import pytest

from stager.config import FetchConfig, RetryConfig, SourceConfig
from stager.daemon_client import manifest_fingerprint
from stager.daemon_client.client import DaemonClient
from stager.daemon_client.protocol import CONSUMER_KEY_HEADER
from stager.errors import DaemonUnavailable, ManifestError, OriginUnavailable, ShardNotFound
from tests.daemon.node import CONSUMER_KEY

PLAN = "/v1/consumers/c1/plans/p1"


def _plan_body(node, **extra):
    return {"dataset": {"url": node.proxy.url}, "fingerprint": manifest_fingerprint(node.corpus.manifest), **extra}


def _b64(values) -> str:
    return base64.b64encode(np.asarray(values, dtype="<i8").tobytes()).decode()


BAD_PLANS = [
    ({"data": b"{not json"}, 400, "not valid JSON"),
    ({"json": [1, 2]}, 400, "must be a JSON object"),
    ({"json": {}}, 400, "dataset: expected an object"),
    ({"json": {"dataset": {"url": "corpus"}}}, 400, "a local path must be absolute"),
    ({"json": {"dataset": {"url": "/data", "extra": 1}}}, 400, "dataset: unknown fields ['extra']"),
    ({"json": {"dataset": {"url": 7}}}, 400, "dataset.url: expected a printable URL"),
    ({"json": {"dataset": {"url": "/data", "storage_options": []}}}, 400, "storage_options: expected an object"),
    ({"json": {"dataset": {"url": "/data"}, "bogus": 1}}, 400, "plan: unknown fields ['bogus']"),
    ({"json": {"dataset": {"url": "/data"}, "cursor": -1}}, 400, "cursor: -1 is outside"),
    ({"json": {"dataset": {"url": "/data"}, "cursor": True}}, 400, "cursor: expected an integer"),
    ({"json": {"dataset": {"url": "/data"}, "window_bytes": 0}}, 400, "window_bytes: 0 is outside"),
    ({"json": {"dataset": {"url": "/data"}, "fingerprint": "XYZ"}}, 400, "fingerprint: expected 32 lowercase hex"),
]


async def test_malformed_plan_registrations_are_refused_with_400(node):
    await node.start()
    for request_kwargs, status, message in BAD_PLANS:
        got, body = await node.raw("PUT", PLAN, **request_kwargs)
        assert (got, body["error"]["type"]) == (status, "DaemonRequestError"), request_kwargs
        assert message in body["error"]["message"], request_kwargs
    assert (await node.daemons[0].status())["plans"] == []


BAD_ORDERS = [
    ({"order": [0, 1, 99]}, "shard index 99 is outside the manifest's 0..7"),
    ({"order": [0, "1"]}, "order: expected a list of shard indexes"),
    ({"order_b64": "***"}, "order_b64: not valid base64"),
    ({"order_b64": base64.b64encode(b"1234567").decode()}, "not a whole number of int64 values"),
    ({"order": [0], "order_b64": _b64([0])}, "give order or order_b64, not both"),
    ({"order_b64": _b64([3, -1])}, "shard index -1 is outside"),
]


async def test_plan_orders_are_checked_against_the_daemons_manifest(node):
    await node.start()
    for extra, message in BAD_ORDERS:
        got, body = await node.raw("PUT", PLAN, json=_plan_body(node, **extra))
        assert got == 400 and message in body["error"]["message"], extra


BAD_REQUESTS = [
    ("PUT", "/v1/consumers/-bad/plans/p1", {"json": {}}, 400, "DaemonRequestError", "consumer id"),
    ("PUT", "/v1/consumers/" + "c" * 200 + "/plans/p1", {"json": {}}, 400, "DaemonRequestError", "consumer id"),
    ("GET", PLAN + "/ready?position=0", {}, 404, "UnknownPlan", "register it again"),
    ("POST", PLAN + "/advance", {"json": {"position": 1}}, 404, "UnknownPlan", "register it again"),
    ("GET", "/v1/nothing-here", {}, 404, "DaemonRequestError", "Not Found"),
    ("POST", "/v1/evict", {"json": {"bytes": 0}}, 400, "DaemonRequestError", "bytes: 0 is outside"),
    ("POST", "/v1/datasets", {"data": b"x" * 100_000}, 413, "DaemonRequestError", "Request Entity Too Large"),
]


async def test_bad_requests_get_clear_errors(node):
    await node.start(max_request_bytes=64 * 1024)
    for method, path, kwargs, status, kind, message in BAD_REQUESTS:
        got, body = await node.raw(method, path, **kwargs)
        assert (got, body["error"]["type"]) == (status, kind), (method, path)
        assert message in body["error"]["message"], (method, path)


async def test_positions_and_timeouts_of_readiness_polls_are_checked(node):
    await node.start()
    assert (await node.raw("PUT", PLAN, json=_plan_body(node, order=[2, 3])))[0] == 200
    for query, message in [("", "position: expected an integer"), ("?position=2", "position: 2 is outside 0..1"),
                           ("?position=0&timeout=-1", "timeout: expected a positive number"),
                           ("?position=0&timeout=nan", "timeout: expected a positive number"),
                           ("?position=0&urgent=2", "urgent: 2 is outside 0..1"),
                           ("?position=0&urgent=yes", "urgent: expected an integer")]:
        got, body = await node.raw("GET", f"{PLAN}/ready{query}")
        assert got == 400 and message in body["error"]["message"], query


async def test_a_consumer_with_another_manifest_is_refused(node):
    await node.start()
    got, body = await node.raw("PUT", PLAN, json=_plan_body(node, fingerprint="0" * 32))
    assert (got, body["error"]["type"]) == (409, "ManifestVersionGone")
    assert "not the one at the origin now" in body["error"]["message"]


async def test_a_source_without_manifest_is_a_manifest_error_for_the_client(node, tmp_path):
    await node.start()
    (tmp_path / "empty").mkdir()
    client = DaemonClient(node.socket)
    try:
        with pytest.raises(ManifestError, match="no manifest"):
            await client.request("POST", "/v1/datasets", body={"dataset": {"url": str(tmp_path / "empty")}})
    finally:
        await client.close()


async def test_local_sources_can_be_refused(node, tmp_path):
    await node.start(local_sources=False)
    got, body = await node.raw("POST", "/v1/datasets", json={"dataset": {"url": str(node.corpus.root)}})
    assert got == 400 and "does not serve local paths" in body["error"]["message"]


async def test_storage_options_never_show_in_errors_or_logs(node, caplog):
    await node.start()
    secret = "sk-very-secret-value-42"
    caplog.set_level(logging.DEBUG)
    got, body = await node.raw("POST", "/v1/datasets", json={"dataset": {
        "url": "s3://bucket/data", "storage_options": {"key": "AKIDEXAMPLE12345", "secret": secret,
                                                        "endpoint_url": "http://127.0.0.1:9"}}})
    assert got >= 400
    assert secret not in str(body) and secret not in caplog.text


async def test_origin_errors_come_back_as_the_same_class(node):
    await node.start()
    session = node.session()
    dataset = await session.open_dataset(SourceConfig(node.proxy.url))
    missing = node.corpus.manifest.paths[3]
    (node.corpus.root / missing).unlink()
    plan = await session.plan(dataset, [0, 3])
    assert (await plan.ready(0)).name == node.corpus.manifest.digest(0)
    with pytest.raises(ShardNotFound, match=missing) as caught:
        await plan.ready(1)
    assert isinstance(caught.value, FileNotFoundError)

    node.proxy.set_down(True)
    with pytest.raises(OriginUnavailable) as caught:
        await session.read_block(dataset, 5, 0)
    assert isinstance(caught.value, ConnectionError) and node.corpus.manifest.paths[5] in str(caught.value)


async def test_readiness_is_a_long_poll_not_a_busy_loop(node):
    daemon = await node.start()
    node.proxy.update(latency_s=1.2, path_contains=node.corpus.manifest.paths[4])
    session = node.session(poll_timeout=0.25)
    dataset = await session.open_dataset(SourceConfig(node.proxy.url))
    plan = await session.plan(dataset, [4])
    began = time.monotonic()
    path = await plan.ready(0)
    waited = time.monotonic() - began
    assert path.name == node.corpus.manifest.digest(4) and path.read_bytes() == \
        (node.corpus.root / node.corpus.manifest.paths[4]).read_bytes()
    assert waited >= 1.0
    # One poll per 0.25 s at most: a busy loop would have made hundreds.
    assert 2 <= session.daemon.polls <= waited / 0.25 + 2
    sample = daemon.metrics.registry.get_sample_value
    assert sample("stager_ready_requests_total", {"result": "pending"}) >= 2
    # It had to be waited for, although the last poll found it complete: a miss.
    assert sample("stager_served_blobs_total", {"outcome": "miss"}) == 1
    assert sample("stager_served_blobs_total", {"outcome": "hit"}) == 0


async def test_read_block_fetches_that_block_alone(node):
    await node.start()
    session = node.session()
    dataset = await session.open_dataset(SourceConfig(node.proxy.url))
    m = node.corpus.manifest
    data = await session.read_block(dataset, 2, 1)
    original = (node.corpus.root / m.paths[2]).read_bytes()
    assert data == original[m.block_size:2 * m.block_size]
    gets = [e for e in node.proxy.events if e.path == f"/{m.paths[2]}"]
    assert len(gets) == 1, "one block, not the whole blob"
    requests = node.proxy.requests
    assert await session.read_block(dataset, 2, 1) == data
    assert node.proxy.requests == requests, "a verified block is read from the cache"


async def test_plans_are_replaced_advanced_and_dropped(node):
    daemon = await node.start()
    assert (await node.raw("PUT", PLAN, json=_plan_body(node, order=[0, 1, 2])))[0] == 200
    got, body = await node.raw("PUT", PLAN, json=_plan_body(node, order_b64=_b64([5, 6, 7, 4]), cursor=1))
    assert got == 200 and (body["length"], body["cursor"]) == (4, 1)
    assert (await node.raw("PUT", "/v1/consumers/c1/plans/p2", json=_plan_body(node)))[0] == 200
    assert (await node.raw("POST", f"{PLAN}/advance", json={"position": 3}))[1] == {"cursor": 3}
    status = await daemon.status()
    plans = {p["plan"]: p for p in status["plans"]}
    assert set(plans) == {"p1", "p2"} and (plans["p1"]["cursor"], plans["p1"]["length"]) == (3, 4)
    assert (await node.raw("POST", "/v1/consumers/c1/heartbeat"))[1]["plans"] == ["p1", "p2"]
    assert (await node.raw("DELETE", PLAN))[1] == {"closed": True}
    assert (await node.raw("DELETE", "/v1/consumers/c1"))[1] == {"closed": 1}
    assert (await daemon.status())["plans"] == [] and len(daemon.engine._plans) == 0


async def test_pin_keeps_a_dataset_through_eviction_and_unpin_lets_it_go(node):
    daemon = await node.start()
    session = node.session()
    dataset = await session.open_dataset(SourceConfig(node.proxy.url))
    plan = await session.plan(dataset)
    for position in range(len(node.corpus.manifest)):
        await plan.ready(position)
    await plan.close()
    source = {"dataset": {"url": node.proxy.url}}
    assert (await node.raw("POST", "/v1/pin", json=source))[1]["pinned"] == 8
    assert (await node.raw("POST", "/v1/evict", json={"bytes": 1 << 40}))[1] == {"freed": 0}
    assert (await node.raw("POST", "/v1/unpin", json=source))[1]["unpinned"] == 8
    freed = (await node.raw("POST", "/v1/evict", json={"bytes": 1 << 40}))[1]["freed"]
    assert freed >= node.corpus.manifest.total_bytes
    assert daemon.cache.usage().complete == 0 and daemon.cache.evicted_blobs == 8


async def test_stopping_answers_waiting_long_polls_at_once_and_is_bounded(node):
    daemon = await node.start(drain_timeout=1.0)
    # A block request that will not finish by itself (the manifest is not delayed).
    node.proxy.update(latency_s=30.0, path_contains=node.corpus.manifest.paths[1])
    client = DaemonClient(node.socket, headers={CONSUMER_KEY_HEADER: CONSUMER_KEY})
    try:
        await client.request("PUT", PLAN, body=_plan_body(node, order=[1]))
        poll = asyncio.ensure_future(client.request("GET", f"{PLAN}/ready", params={"position": 0, "timeout": 50},
                                                    timeout=60))
        await asyncio.sleep(0.3)
        began = time.monotonic()
        stopping = daemon.request_stop()
        with pytest.raises(DaemonUnavailable, match="stopping"):
            await poll
        assert time.monotonic() - began < 1.0, "the waiting consumer is told at once"
        await stopping
        assert time.monotonic() - began < 1.0 + 3.0, "the stop waited at most the drain timeout"
        assert not node.socket.exists()
    finally:
        node.proxy.update(latency_s=0.0, path_contains=None)
        await client.close()


async def test_fetch_settings_reach_the_engine(node):
    daemon = await node.start(fetch=FetchConfig(concurrency=3, window_bytes=12345,
                                                retry=RetryConfig(deadline=3.0)))
    got, body = await node.raw("PUT", PLAN, json=_plan_body(node))
    assert got == 200 and body["window_bytes"] == 12345 and daemon.engine.gate.limit <= 3 and daemon.engine.concurrency.ceiling == 3


def _local_in_disguise(root, tmp) -> list[dict]:
    """Sources that end up reading the daemon's own disk through fsspec's wrappers and chaining."""
    return [
        {"url": f"simplecache://{root}", "storage_options": {"target_protocol": "file"}},  # these three open
        {"url": f"filecache://{root}", "storage_options": {"target_protocol": "file", "cache_storage": str(tmp)}},
        {"url": f"blockcache://{root}", "storage_options": {"target_protocol": "file"}},  # the corpus without
        {"url": f"simplecache::file://{root}"},
        {"url": f"simplecache::blockcache::file://{root}"},
        {"url": f"zip://x::file://{root}/archive.zip"},
        {"url": f"memory://{root}"},
        {"url": "reference://", "storage_options": {"fo": f"{root}/refs.json"}},
        {"url": f"file://{root}"},
        {"url": f"local://{root}"},
        {"url": str(root)},
        {"url": "s3://bucket/data", "storage_options": {"target_protocol": "file"}},
    ]


async def test_no_local_sources_refuses_what_finally_reads_the_local_disk(node, tmp_path):
    await node.start(local_sources=False)
    for source in _local_in_disguise(node.corpus.root, tmp_path / "wrapper-cache"):
        for method, path, body in [("POST", "/v1/datasets", {"dataset": source}),
                                   ("PUT", PLAN, {"dataset": source}),
                                   ("POST", "/v1/pin", {"dataset": source})]:
            got, answer = await node.raw(method, path, json=body)
            assert got == 400 and answer["error"]["type"] == "DaemonRequestError", (source, path, answer)
            assert "local_sources = false" in answer["error"]["message"], source
    assert not (tmp_path / "wrapper-cache").exists() and node.daemons[0].registry.plans() == []
    # What the allow-list names is served as before.
    got, answer = await node.raw("POST", "/v1/datasets", json={"dataset": {"url": node.proxy.url}})
    assert got == 200 and answer["shards"] == len(node.corpus.manifest)


async def test_bodies_nested_too_deep_are_a_400_naming_the_problem(node, caplog):
    await node.start()
    assert (await node.raw("PUT", PLAN, json=_plan_body(node)))[0] == 200
    caplog.set_level(logging.DEBUG)
    very_deep = b'{"a":' * 100_000 + b"1" + b"}" * 100_000
    options: dict = {}
    for _ in range(40):  # deeper than the limit, shallow enough for json itself
        options = {"a": options}
    deep = {"dataset": {"url": node.proxy.url, "storage_options": options}, "position": 1, "bytes": 1}
    for method, path in [("POST", "/v1/datasets"), ("PUT", PLAN), ("POST", f"{PLAN}/advance"),
                         ("POST", "/v1/blocks/ready"), ("POST", "/v1/pin"), ("POST", "/v1/unpin"),
                         ("POST", "/v1/evict")]:
        for kwargs in ({"data": very_deep}, {"json": deep}):
            got, answer = await node.raw(method, path, **kwargs)
            assert (got, answer["error"]["type"]) == (400, "DaemonRequestError"), (path, answer)
            assert answer["error"]["message"] == "the body nests deeper than 32 levels", path
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], "no traceback in the log"
    assert "Traceback" not in caplog.text
