"""FsspecStore over a sync fsspec filesystem (memory://), and the s3fs options that turn its retries off."""

from __future__ import annotations

import secrets

import pytest

from stager.config import RetryConfig, SourceConfig
from stager.errors import ShardNotFound
from stager.store import FsspecStore, open_store
from stager.store.base import InvalidPath, InvalidRange
from stager.store.fsspec_store import s3fs_options

FAST_RETRY = RetryConfig(attempts=3, backoff_base=0.001, backoff_max=0.01, deadline=5.0, request_timeout=5.0)


@pytest.fixture
async def store():
    s = open_store(SourceConfig(f"memory://stager-test-{secrets.token_hex(4)}/root"), retry=FAST_RETRY)
    assert isinstance(s, FsspecStore)
    try:
        yield s
    finally:
        await s.close()


async def test_write_list_info_read(store: FsspecStore):
    await store.write("b.bin", b"bbbb")
    await store.write("a/c.bin", b"cc")
    infos = await store.list()
    assert [(i.path, i.size) for i in infos] == [("a/c.bin", 2), ("b.bin", 4)]
    assert (await store.info("b.bin")).size == 4
    assert await store.read("b.bin") == b"bbbb"
    assert await store.exists("a/c.bin") and not await store.exists("a/x.bin")
    assert store.url.startswith("memory://")


async def test_range_edges(store: FsspecStore):
    data = bytes(range(200))
    await store.write("x.bin", data)
    assert await store.read_range("x.bin", 0, 0) == b""
    assert await store.read_range("x.bin", 199, 200) == data[199:]
    assert await store.read_range("x.bin", 10, 20) == data[10:20]
    with pytest.raises(InvalidRange):
        await store.read_range("x.bin", 199, 201)
    with pytest.raises(InvalidRange):
        await store.read_range("x.bin", 300, 301)
    assert store.stats.retries == 0


async def test_missing_and_invalid(store: FsspecStore):
    with pytest.raises(ShardNotFound, match="nope.bin"):
        await store.read_range("nope.bin", 0, 1)
    with pytest.raises(ShardNotFound):
        await store.info("nope.bin")
    with pytest.raises(InvalidPath):
        await store.read("../escape")
    await store.delete("nope.bin")  # idempotent


async def test_spooled_upload(store: FsspecStore):
    upload = await store.open_upload("big.bin", part_size=4)
    await upload.write_part(2, b"5678")
    await upload.write_part(3, b"9")
    await upload.write_part(1, b"1234")
    assert not await store.exists("big.bin")
    await upload.complete()
    assert await store.read("big.bin") == b"123456789"


async def test_spooled_upload_abort(store: FsspecStore):
    upload = await store.open_upload("big.bin", part_size=4)
    await upload.write_part(1, b"1234")
    await upload.abort()
    assert not await store.exists("big.bin")


def test_s3fs_options_turn_retries_off_and_keep_user_settings():
    cfg = RetryConfig(request_timeout=7.0)
    user = {"key": "k", "config_kwargs": {"retries": {"max_attempts": 10}, "s3": {"addressing_style": "path"}}}
    opts = s3fs_options(user, cfg)
    assert opts["config_kwargs"]["retries"] == {"total_max_attempts": 1, "mode": "standard"}
    assert opts["config_kwargs"]["s3"] == {"addressing_style": "path"}
    assert opts["config_kwargs"]["read_timeout"] == 7.0
    assert opts["use_listings_cache"] is False
    assert user["config_kwargs"]["retries"] == {"max_attempts": 10}  # not mutated


async def test_s3fs_connection_pool_follows_the_store_concurrency():
    # botocore's default pool of 10 connections would cap the adaptive concurrency at 10
    assert s3fs_options({}, RetryConfig(), 64)["config_kwargs"]["max_pool_connections"] == 64
    assert s3fs_options({"config_kwargs": {"max_pool_connections": 5}}, RetryConfig(), 64)[
        "config_kwargs"]["max_pool_connections"] == 5  # the user's own setting wins
    store = open_store(SourceConfig("s3://bucket/prefix", {"key": "k" * 12, "secret": "s" * 12,
                                                           "endpoint_url": "http://127.0.0.1:9"}), concurrency=64)
    try:
        assert store.fs.config_kwargs["max_pool_connections"] == 64
    finally:
        await store.close()


async def test_s3fs_instance_has_its_own_retries_off():
    store = open_store(SourceConfig("s3://bucket/prefix", {"key": "k" * 12, "secret": "s" * 12, "endpoint_url": "http://127.0.0.1:9"}))
    try:
        assert store.fs.retries == 1
        assert store.root == "bucket/prefix" and store.url == "s3://bucket/prefix"
    finally:
        await store.close()
