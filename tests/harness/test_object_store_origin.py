"""The fault proxy as an object store: per-connection and aggregate caps, per-prefix SlowDown, in-flight counts."""

from __future__ import annotations

import random
import threading
import time

import pytest

from stager.testing import PROFILES, FaultPlan, object_store_plan
from stager.loopback.http_origin import HttpOrigin
from stager.loopback.rate_limit import PrefixRateLimiter, prefix_of

from .test_harness import fetch

pytestmark = pytest.mark.timeout(60)

BLOB = random.Random(99).randbytes(128 * 1024)


@pytest.fixture
def origin(http_origin: HttpOrigin) -> HttpOrigin:
    for folder in ("a", "b"):
        (http_origin.root / folder).mkdir()
        (http_origin.root / folder / "blob.bin").write_bytes(BLOB)
        for i in range(4):
            (http_origin.root / folder / f"x{i}.bin").write_bytes(b"x")
    return http_origin


def parallel(urls: list[str]) -> list:
    replies: list = [None] * len(urls)

    def one(i: int) -> None:
        replies[i] = fetch(urls[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(urls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return replies


def test_connection_cap_limits_each_response_not_their_sum(origin, fault_proxy):
    rate = 512 * 1024  # 128 KiB each: 0.25 s alone
    proxy = fault_proxy(origin, FaultPlan(connection_bps=rate))
    start = time.monotonic()
    replies = parallel([f"{proxy.url}/a/blob.bin"] * 4)
    elapsed = time.monotonic() - start
    assert all(r.body == BLOB for r in replies)
    assert elapsed >= 0.6 * len(BLOB) / rate  # each one is capped...
    assert elapsed < 0.75 * 4 * len(BLOB) / rate  # ...but not behind the others
    assert proxy.peak_in_flight == 4
    for _ in range(100):  # bounded: the handler ends just after the client has the last byte
        if proxy.in_flight == 0:
            break
        time.sleep(0.01)
    assert proxy.in_flight == 0


def test_aggregate_cap_is_shared_by_all_connections(origin, fault_proxy):
    rate = 1024 * 1024
    proxy = fault_proxy(origin, FaultPlan(bandwidth_bps=rate, connection_bps=100 * rate))
    start = time.monotonic()
    replies = parallel([f"{proxy.url}/a/blob.bin"] * 4)
    assert all(r.body == BLOB for r in replies)
    assert time.monotonic() - start >= 0.6 * 4 * len(BLOB) / rate


def test_requests_over_the_rate_of_a_prefix_get_slowdown_and_other_prefixes_do_not(origin, fault_proxy):
    proxy = fault_proxy(origin, FaultPlan(rate_limit_rps=2.0, rate_limit_burst=2.0))
    start = time.monotonic()
    statuses = [fetch(f"{proxy.url}/a/x{i % 4}.bin").status for i in range(12)]
    elapsed = time.monotonic() - start
    admitted = statuses.count(200)
    assert 2 <= admitted <= 2 + 2.0 * elapsed + 1
    refused = [s for s in statuses if s != 200]
    assert refused and set(refused) == {503}
    assert proxy.faults["rate_limit"] == len(refused)
    reply = fetch(f"{proxy.url}/a/x0.bin")
    if reply.status == 503:  # the S3 error document, so S3 clients see SlowDown
        assert b"<Code>SlowDown</Code>" in reply.body
    assert fetch(f"{proxy.url}/b/x0.bin").status == 200  # its own bucket of tokens
    time.sleep(0.6)  # one token back at 2/s
    assert fetch(f"{proxy.url}/a/x1.bin").status == 200


def test_slowdown_body_is_the_s3_error_document(origin, fault_proxy):
    proxy = fault_proxy(origin, FaultPlan(rate_limit_rps=0.001, rate_limit_burst=1.0))
    assert fetch(f"{proxy.url}/a/x0.bin").status == 200
    reply = fetch(f"{proxy.url}/a/x1.bin")
    assert reply.status == 503 and b"<Code>SlowDown</Code>" in reply.body
    assert reply.headers["content-type"] == "application/xml"


def test_token_bucket_refills_at_the_rate_up_to_the_burst():
    limiter = PrefixRateLimiter()
    assert [limiter.admit("/b/p/k", 0.0, 10.0, 3.0) for _ in range(4)] == [True, True, True, False]
    assert limiter.admit("/b/p/k", 0.05, 10.0, 3.0) is False  # half a token
    assert limiter.admit("/b/p/k", 0.1, 10.0, 3.0) is True
    assert [limiter.admit("/b/p/k", 100.0, 10.0, 3.0) for _ in range(4)] == [True, True, True, False]
    assert limiter.admit("/b/q/k", 100.0, 10.0, 3.0) is True
    assert limiter.admit("/b/p/k", 100.0, None) is True
    assert prefix_of("/bucket/data/shard-1.bin") == "/bucket/data/"


def test_profiles_build_valid_plans_and_bad_values_are_refused():
    assert set(PROFILES) >= {"loopback", "near", "far", "throttled"}
    near = object_store_plan("near")
    assert near.latency_s == 0.04 and near.connection_bps == 8_000_000
    assert object_store_plan("far", latency_s=0.2).latency_s == 0.2
    with pytest.raises(ValueError, match="unknown origin profile"):
        object_store_plan("mars")
    for field in ("connection_bps", "rate_limit_rps", "rate_limit_burst"):
        with pytest.raises(ValueError, match=field):
            FaultPlan(**{field: 0})
