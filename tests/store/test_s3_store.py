"""S3Store's signed-GET read path, against a scripted origin standing in for S3 (no rclone needed)."""

from __future__ import annotations

import os

import pytest
from botocore.credentials import Credentials

from stager.config import RetryConfig, SourceConfig
from stager.errors import AccessDenied, OriginUnavailable, ShardNotFound
from stager.store import open_store
from stager.store.base import InvalidRange
from stager.store.s3_store import S3Store, StaticCredentials, _direct_settings, _Signer
from stager.testing.s3server import REGION

from .outright import last_line_of
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


# -- where the signer's settings come from ----------------------------------------------------

ENV = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK"}


def test_settings_given_outright_need_no_botocore(tmp_path):
    no_config = {"AWS_CONFIG_FILE": str(tmp_path / "absent")}
    direct = _direct_settings({}, {**ENV, **no_config, "AWS_REGION": "eu-west-3", "AWS_SESSION_TOKEN": "T"})
    assert direct is not None
    assert (direct.endpoint, direct.region, direct.virtual) == ("http://127.0.0.1:9", "eu-west-3", False)
    assert direct.credentials == StaticCredentials("AK", "SK", "T")
    options = {**KEYS, "client_kwargs": {"endpoint_url": "https://s3.eu-west-3.amazonaws.com"}, "requester_pays": True}
    direct = _direct_settings(options, no_config)
    assert direct.credentials == StaticCredentials(KEYS["key"], KEYS["secret"]) and direct.virtual
    assert direct.region == "us-east-1" and direct.headers == {"x-amz-request-payer": "requester"}
    assert _direct_settings({"anon": True, "endpoint_url": "http://h"}, no_config).credentials is None


@pytest.mark.parametrize("options, env", [
    ({}, {"AWS_PROFILE": "other"}),  # a profile can name other keys, region, endpoint
    ({"profile": "other"}, {}),
    ({"some_s3fs_option": 1}, {}),  # an option only s3fs understands
    ({"config_kwargs": {"signature_version": "s3"}}, {}),
    ({}, {"AWS_ACCESS_KEY_ID": ""}),  # keys from the provider chain (files, instance metadata)
    ({}, {"AWS_ENDPOINT_URL": ""}),  # AWS itself: botocore's endpoint rules
])
def test_anything_else_goes_through_botocore(tmp_path, options, env):
    assert _direct_settings(options, {**ENV, "AWS_CONFIG_FILE": str(tmp_path / "absent"), **env}) is None


def test_an_aws_config_file_goes_through_botocore(tmp_path):
    config = tmp_path / "config"
    config.write_text("[default]\nregion = eu-west-3\n")
    assert _direct_settings({}, {**ENV, "AWS_CONFIG_FILE": str(config)}) is None


async def test_both_ways_sign_requests_the_real_server_accepts(s3_bucket, tmp_path, monkeypatch):
    s3_bucket.server.put_object(s3_bucket.name, "d/x.bin", DATA)
    config = tmp_path / "config"
    config.write_text(f"[default]\nregion = {REGION}\n")
    for config_file, direct in ((tmp_path / "absent", True), (config, False)):
        monkeypatch.setenv("AWS_CONFIG_FILE", str(config_file))
        async with open_store(SourceConfig(f"s3://{s3_bucket.name}/d", s3_bucket.storage_options()),
                              retry=FAST_RETRY) as s:
            assert (s._direct is not None) is direct
            assert await s.read_range("x.bin", 10, 5000) == DATA[10:5000]
            assert (await s.info("x.bin")).size == len(DATA)
            await s.write("y.bin", b"written")
            assert [o.path for o in await s.list()] == ["x.bin", "y.bin"]
            assert await s.read("y.bin") == b"written"
            await s.delete("y.bin")


def test_reading_with_settings_given_outright_loads_no_botocore(s3_bucket, tmp_path):
    s3_bucket.server.put_object(s3_bucket.name, "x.bin", DATA)
    code = ("import asyncio, sys\n"
            "from stager.config import SourceConfig\nfrom stager.store import open_store\n"
            "async def main():\n"
            f"    async with open_store(SourceConfig('s3://{s3_bucket.name}')) as s:\n"
            "        assert await s.read_range('x.bin', 0, 100) == (await s.read('x.bin'))[:100]\n"
            "asyncio.run(main())\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('botocore', 'aiobotocore', 's3fs')))")
    assert last_line_of(code, s3_bucket, tmp_path, timeout=60) == "[]"


async def test_listing_scan_and_head_give_the_md5_the_origin_vouches_for(s3_bucket):
    import hashlib

    data = os.urandom(70_000)
    (s3_bucket.path / "ds").mkdir()
    (s3_bucket.path / "ds" / "a.bin").write_bytes(data)
    md5 = hashlib.md5(data).hexdigest()
    async with open_store(SourceConfig(f"{s3_bucket.url}/ds", s3_bucket.storage_options())) as store:
        assert [o.md5 for o in await store.list()] == [md5]
        assert [o.md5 async for page in store.scan() for o in page] == [md5]
        assert (await store.info("a.bin")).md5 == md5


def test_only_an_md5_shaped_etag_or_checksum_vouches_for_the_bytes():
    import base64

    from stager.store.fsspec_store import vouched_md5

    md5 = "0123456789abcdef0123456789abcdef"
    assert vouched_md5({"ETag": f'"{md5.upper()}"'}) == md5  # S3 single-part
    assert vouched_md5({"ETag": f'"{md5}-3"'}) is None  # multipart: not an MD5 of the bytes
    assert vouched_md5({"ETag": ""}) is None and vouched_md5({}) is None
    assert vouched_md5({"md5Hash": base64.b64encode(bytes.fromhex(md5)).decode()}) == md5  # GCS
    assert vouched_md5({"md5Hash": "not base64!"}) is None
    assert vouched_md5({"content_settings": {"content_md5": bytearray.fromhex(md5)}}) == md5  # Azure
