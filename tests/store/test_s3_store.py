"""S3Store's signed-GET read path, against a scripted origin standing in for S3 (no rclone needed)."""

from __future__ import annotations

import os

import pytest
from botocore.credentials import Credentials

from stager.config import RetryConfig, SourceConfig
from stager.errors import AccessDenied, OriginUnavailable, ShardNotFound
from stager.store import open_store
from stager.store.base import InvalidRange
from stager.store.s3_store import S3Store, _Signer

from .scripted_http import ScriptedOrigin, s3_error

FAST_RETRY = RetryConfig(attempts=4, backoff_base=0.001, backoff_max=0.01, deadline=30.0, request_timeout=10.0)
DATA = os.urandom(50_000)
KEYS = {"key": "stageraccess01", "secret": "stagersecret0123456789"}


@pytest.fixture
async def origin():
    o = await ScriptedOrigin(objects={"bkt/pre/x.bin": DATA, "bkt/pre/a b+c.bin": b"odd name"}).start()
    try:
        yield o
    finally:
        await o.stop()


@pytest.fixture
async def store(origin: ScriptedOrigin):
    s = open_store(SourceConfig("s3://bkt/pre", {**KEYS, "endpoint_url": origin.url}), retry=FAST_RETRY)
    assert isinstance(s, S3Store)
    try:
        yield s
    finally:
        await s.close()


async def test_info_is_one_signed_head(store: S3Store, origin: ScriptedOrigin):
    info = await store.info("x.bin")
    assert (info.path, info.size, info.mtime) == ("x.bin", len(DATA), 1445412480.0)
    assert [(s.method, s.path) for s in origin.seen] == [("HEAD", "bkt/pre/x.bin")]
    assert origin.seen[0].headers["authorization"].startswith("AWS4-HMAC-SHA256")
    assert not await store.exists("nope.bin")


async def test_signed_range_reads(store: S3Store, origin: ScriptedOrigin):
    assert await store.read_range("x.bin", 100, 200) == DATA[100:200]
    seen = origin.seen[-1]
    assert seen.path == "bkt/pre/x.bin"
    assert seen.headers["range"] == "bytes=100-199"
    assert seen.headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=stageraccess01/")
    assert "x-amz-date" in seen.headers and "x-amz-content-sha256" in seen.headers
    assert await store.read("x.bin") == DATA
    assert await store.read_range("a b+c.bin", 0, 3) == b"odd"


async def test_rclone_200_and_faults(store: S3Store, origin: ScriptedOrigin):
    origin.script = ["ok200", "truncate", "ignore_range", "wrong_range"]
    assert await store.read_range("x.bin", 5, 10) == DATA[5:10]
    assert await store.read_range("x.bin", 1000, 2000) == DATA[1000:2000]
    assert await store.read_range("x.bin", 1000, 2000) == DATA[1000:2000]


async def test_s3_error_codes(store: S3Store, origin: ScriptedOrigin):
    with pytest.raises(ShardNotFound, match="nope.bin"):
        await store.read_range("nope.bin", 0, 1)
    origin.script = [s3_error(403, "SignatureDoesNotMatch")]
    with pytest.raises(AccessDenied):
        await store.read_range("x.bin", 0, 1)
    origin.script = [s3_error(503, "SlowDown"), s3_error(500, "InternalError")]
    assert await store.read_range("x.bin", 0, 1) == DATA[:1]
    assert (store.stats.throttled, store.stats.transient) == (1, 1)
    origin.script = [s3_error(416, "InvalidRange")]
    with pytest.raises(InvalidRange):
        await store.read_range("x.bin", len(DATA), len(DATA) + 5)
    with pytest.raises(InvalidRange):
        await store.read_range("x.bin", len(DATA) - 5, len(DATA) + 5)


async def test_throttled_gives_up_as_unavailable(origin: ScriptedOrigin):
    config = RetryConfig(attempts=3, backoff_base=0.001, backoff_max=0.001, deadline=30.0, request_timeout=10.0)
    origin.script = [s3_error(503, "SlowDown")] * 3
    async with open_store(SourceConfig("s3://bkt/pre", {**KEYS, "endpoint_url": origin.url}), retry=config) as s:
        with pytest.raises(OriginUnavailable) as info:
            await s.read_range("x.bin", 0, 1)
        assert "SlowDown" in str(info.value)


async def test_endpoint_from_environment(origin: ScriptedOrigin, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", origin.url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "envaccesskey01")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "envsecretkey0123")
    async with open_store(SourceConfig("s3://bkt/pre"), retry=FAST_RETRY) as s:
        assert await s.read_range("x.bin", 0, 4) == DATA[:4]
    assert "Credential=envaccesskey01/" in origin.seen[-1].headers["authorization"]


async def test_anonymous_requests_are_unsigned(origin: ScriptedOrigin):
    async with open_store(SourceConfig("s3://bkt/pre", {"anon": True, "endpoint_url": origin.url}), retry=FAST_RETRY) as s:
        assert await s.read_range("x.bin", 0, 4) == DATA[:4]
    assert "authorization" not in origin.seen[-1].headers


def test_signer_addressing():
    creds = Credentials("a" * 12, "s" * 12)
    path_style = _Signer("http://127.0.0.1:9000", "us-east-1", creds, virtual=False)
    assert path_style.url("bkt", "a b/c~d+e.bin") == "http://127.0.0.1:9000/bkt/a%20b/c~d%2Be.bin"
    virtual = _Signer("https://s3.eu-west-1.amazonaws.com", "eu-west-1", creds, virtual=True)
    assert virtual.url("bkt", "k.bin") == "https://bkt.s3.eu-west-1.amazonaws.com/k.bin"
    assert virtual.url("dotted.bucket", "k.bin") == "https://s3.eu-west-1.amazonaws.com/dotted.bucket/k.bin"


async def test_signer_headers_carry_session_token():
    signer = _Signer("http://127.0.0.1:9000", "us-east-1", Credentials("a" * 12, "s" * 12, "tok"), virtual=False)
    url, headers = await signer.sign("GET", "bkt", "k", {"Range": "bytes=0-9"})
    assert str(url) == "http://127.0.0.1:9000/bkt/k"
    assert headers["X-Amz-Security-Token"] == "tok"
    assert "range" in headers["Authorization"]
