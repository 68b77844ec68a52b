"""HttpStore against a scripted origin: exact bytes or an error, whatever the server answers."""

from __future__ import annotations

import os

import pytest
import xxhash

from stager.config import RetryConfig
from stager.errors import (
    AccessDenied,
    ConfigError,
    CorruptData,
    OriginChanged,
    OriginUnavailable,
    ShardNotFound,
)
from stager.store.base import InvalidRange, UnsupportedOperation
from stager.store.http_store import HttpStore
from stager.store.options import StoreOptions
from stager.store.range_body import parse_content_range

from .scripted_http import ScriptedOrigin, s3_error, status

FAST_RETRY = RetryConfig(attempts=4, backoff_base=0.001, backoff_max=0.01, deadline=30.0, request_timeout=10.0)
DATA = os.urandom(100_000)


@pytest.fixture
async def origin():
    o = await ScriptedOrigin(objects={"d/x.bin": DATA, "sp ace/ü.bin": b"unicode"}).start()
    try:
        yield o
    finally:
        await o.stop()


@pytest.fixture
async def store(origin: ScriptedOrigin):
    s = HttpStore(origin.url + "/", options=StoreOptions(retry=FAST_RETRY, concurrency=4))
    try:
        yield s
    finally:
        await s.close()


def digest_check(expected: bytes):
    want = xxhash.xxh3_64_intdigest(expected)

    def check(data: bytes) -> None:
        if xxhash.xxh3_64_intdigest(data) != want:
            raise CorruptData("xxh3 mismatch")

    return check


def test_parse_content_range():
    assert parse_content_range("bytes 0-99/1000") == (0, 99, 1000)
    assert parse_content_range("bytes 5-9/*") == (5, 9, None)
    assert parse_content_range("bytes */1000") is None
    assert parse_content_range("items 0-1/2") is None


async def test_range_reads_are_exact(store: HttpStore, origin: ScriptedOrigin):
    assert await store.read_range("d/x.bin", 0, 1) == DATA[:1]
    assert await store.read_range("d/x.bin", len(DATA) - 1, len(DATA)) == DATA[-1:]
    assert await store.read_range("d/x.bin", 1000, 60_000) == DATA[1000:60_000]
    assert origin.seen[-1].headers["range"] == "bytes=1000-59999"
    assert await store.read("d/x.bin") == DATA
    assert await store.read_range("sp ace/ü.bin", 2, 5) == b"ico"


async def test_zero_length_range_needs_no_body(store: HttpStore, origin: ScriptedOrigin):
    assert await store.read_range("d/x.bin", 10, 10) == b""
    assert all(s.method == "HEAD" for s in origin.seen)
    with pytest.raises(ShardNotFound):
        await store.read_range("nope.bin", 0, 0)


@pytest.mark.parametrize(("start", "end"), [(len(DATA) - 1, len(DATA) + 1), (len(DATA), len(DATA) + 1), (10**9, 10**9 + 1)])
async def test_range_past_the_end_is_invalid_not_retried(store: HttpStore, start, end):
    with pytest.raises(InvalidRange):
        await store.read_range("d/x.bin", start, end)
    assert store.stats.retries == 0


async def test_info_and_exists(store: HttpStore, origin: ScriptedOrigin):
    info = await store.info("d/x.bin")
    assert info.size == len(DATA) and info.mtime == 1445412480.0
    assert await store.exists("d/x.bin")
    assert not await store.exists("d/none.bin")
    origin.head_allowed = False
    assert (await store.info("d/x.bin")).size == len(DATA)


async def test_rclone_style_200_with_content_range_is_accepted(store: HttpStore, origin: ScriptedOrigin):
    origin.script = ["ok200"]
    assert await store.read_range("d/x.bin", 10, 20) == DATA[10:20]
    assert store.stats.retries == 0


@pytest.mark.parametrize(("start", "end"), [(0, 100), (5000, 9000), (len(DATA) - 10, len(DATA)), (0, len(DATA))])
async def test_ignored_range_yields_only_the_asked_bytes(store: HttpStore, origin: ScriptedOrigin, start, end):
    origin.script = ["ignore_range"]
    assert await store.read_range("d/x.bin", start, end) == DATA[start:end]
    assert store.stats.range_ignored == 1 and store.stats.retries == 0
    # the connection was dropped or reused cleanly: the next read is fine
    assert await store.read_range("d/x.bin", 1, 3) == DATA[1:3]


async def test_chunked_bodies(store: HttpStore, origin: ScriptedOrigin):
    origin.script = ["chunked", "chunked", "chunked"]
    assert await store.read("d/x.bin") == DATA
    assert await store.read_range("d/x.bin", 0, 20_000) == DATA[:20_000]  # a chunked 200 that ignored Range
    assert await store.read_range("d/x.bin", 30_000, 40_000) == DATA[30_000:40_000]


@pytest.mark.parametrize("fault", ["wrong_range", "no_content_range", "truncate", "reset", "no_length", "too_long"])
async def test_wrong_answers_are_retried(store: HttpStore, origin: ScriptedOrigin, fault):
    origin.script = [fault]
    assert await store.read_range("d/x.bin", 100, 5100, check=digest_check(DATA[100:5100])) == DATA[100:5100]
    assert store.stats.transient == 1 and store.stats.retries == 1


async def test_flipped_byte_is_caught_by_check_and_retried(store: HttpStore, origin: ScriptedOrigin):
    origin.script = ["flip", "flip"]
    assert await store.read_range("d/x.bin", 0, 4096, check=digest_check(DATA[:4096])) == DATA[:4096]
    assert store.stats.corrupt == 2


async def test_always_corrupt_is_origin_changed(store: HttpStore, origin: ScriptedOrigin):
    origin.script = ["flip"] * 10
    with pytest.raises(OriginChanged, match="d/x.bin"):
        await store.read_range("d/x.bin", 0, 4096, check=digest_check(DATA[:4096]))


async def test_throttling_and_server_errors_are_retried(origin: ScriptedOrigin):
    origin.script = [s3_error(503, "SlowDown", Retry_After="0"), status(500), status(502), status(429)]
    config = RetryConfig(attempts=5, backoff_base=0.001, backoff_max=0.01, deadline=30.0, request_timeout=10.0)
    async with HttpStore(origin.url, options=StoreOptions(retry=config)) as s:
        assert await s.read_range("d/x.bin", 0, 10) == DATA[:10]
        assert (s.stats.throttled, s.stats.transient, s.stats.retries) == (2, 2, 4)


async def test_not_found_and_denied_fail_fast(store: HttpStore, origin: ScriptedOrigin):
    with pytest.raises(ShardNotFound, match="d/none.bin"):
        await store.read_range("d/none.bin", 0, 10)
    origin.script = [status(403)]
    with pytest.raises(AccessDenied):
        await store.read_range("d/x.bin", 0, 10)
    origin.script = [status(401)]
    with pytest.raises(AccessDenied):
        await store.info("d/x.bin")
    assert store.stats.retries == 0


async def test_origin_that_stays_down_gives_up_within_the_deadline(origin: ScriptedOrigin):
    config = RetryConfig(attempts=100, backoff_base=0.01, backoff_max=0.05, deadline=0.5, request_timeout=0.2)
    origin.script = [status(503)] * 10_000
    async with HttpStore(origin.url, options=StoreOptions(retry=config)) as s:
        with pytest.raises(OriginUnavailable, match="d/x.bin"):
            await s.read_range("d/x.bin", 0, 10)


async def test_hanging_origin_times_out_per_attempt(origin: ScriptedOrigin):
    config = RetryConfig(attempts=10, backoff_base=0.001, backoff_max=0.001, deadline=30.0, request_timeout=0.5)
    origin.script = ["hang"]
    async with HttpStore(origin.url, options=StoreOptions(retry=config)) as s:
        assert await s.read_range("d/x.bin", 0, 10) == DATA[:10]
        assert s.stats.transient >= 1


async def test_refused_connection_is_transient():
    origin = await ScriptedOrigin().start()
    url = origin.url
    await origin.stop()
    config = RetryConfig(attempts=2, backoff_base=0.001, backoff_max=0.001, deadline=2.0, request_timeout=1.0)
    async with HttpStore(url, options=StoreOptions(retry=config)) as s:
        with pytest.raises(OriginUnavailable):
            await s.read_range("x", 0, 1)
        assert s.stats.transient == 2


async def test_read_only_and_no_listing(store: HttpStore):
    with pytest.raises(UnsupportedOperation, match="manifest"):
        await store.list()
    for call in (store.write("a", b"x"), store.delete("a"), store.open_upload("a", part_size=10)):
        with pytest.raises(UnsupportedOperation):
            await call


async def test_headers_option_is_sent_and_unknown_options_refused(origin: ScriptedOrigin):
    async with HttpStore(origin.url, {"headers": {"Authorization": "Bearer t"}},
                         options=StoreOptions(retry=FAST_RETRY)) as s:
        await s.read_range("d/x.bin", 0, 1)
    assert origin.seen[-1].headers["authorization"] == "Bearer t"
    with pytest.raises(ConfigError):
        HttpStore(origin.url, {"anon": True})


async def test_stats_count_bytes(store: HttpStore):
    await store.read_range("d/x.bin", 0, 1000)
    await store.read("d/x.bin")
    assert store.stats.bytes_read == 1000 + len(DATA)
    assert store.stats.ok == 2
