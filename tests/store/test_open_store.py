"""open_store picks the store by scheme; the public surface is pinned."""

from __future__ import annotations

from pathlib import Path

import pytest

import stager.store as store_pkg
from stager.config import SourceConfig
from stager.errors import ConfigError
from stager.store import FsspecStore, HttpStore, LocalStore, OriginStats, open_store
from stager.store import S3Store


def test_public_surface_is_pinned():
    assert sorted(store_pkg.__all__) == [
        "BandwidthLimiter", "Check", "FsspecStore", "HttpStore", "InvalidPath", "InvalidRange", "LocalStore",
        "ObjectInfo", "OriginStats", "RangeSink", "RetryPolicy", "S3Store", "Store", "StoreOptions", "UnsupportedOperation", "Upload",
        "open_store",
        "validate_path",
    ]
    for name in store_pkg.__all__:
        assert getattr(store_pkg, name) is not None


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("/data/set", LocalStore),
        ("relative/dir", LocalStore),
        ("file:///data/set", LocalStore),
        ("http://127.0.0.1:1/d", HttpStore),
        ("https://example.org/d", HttpStore),
        ("s3://bucket/prefix", S3Store),
        ("memory://x/y", FsspecStore),
    ],
)
async def test_scheme_picks_the_store(url, kind):
    s = open_store(SourceConfig(url))
    try:
        assert type(s) is kind
    finally:
        await s.close()


async def test_bare_path_becomes_an_absolute_file_url(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    async with open_store(SourceConfig("rel")) as s:
        assert s.url == f"file://{tmp_path}/rel"


async def test_shared_stats_and_bandwidth(tmp_path: Path):
    stats = OriginStats()
    (tmp_path / "x").write_bytes(b"12345")
    async with open_store(SourceConfig(str(tmp_path)), stats=stats, bandwidth=10_000_000) as s:
        assert s.stats is stats and s.bandwidth is not None and s.bandwidth.rate == 10_000_000
        await s.read_range("x", 0, 5)
    assert stats.bytes_read == 5


def test_bad_arguments():
    with pytest.raises(ConfigError):
        open_store(SourceConfig("/x"), concurrency=0)
    with pytest.raises(ConfigError):
        open_store(SourceConfig("/x", {"key": "k"}))
    with pytest.raises(ConfigError):
        open_store(SourceConfig("nosuchproto://x"))


@pytest.mark.parametrize("url, options, env, named", [
    ("http://me:hunter2hunter2@[::1/x", {}, {}, "http://***@[::1/x"),
    ("http://me:hunter2hunter2@host:99999/x", {}, {}, "http://***@host:99999/x"),
    ("s3://bucket/x", {"endpoint_url": "http://me:hunter2hunter2@[::1"}, {}, "endpoint_url=http://***@[::1"),
    ("s3://bucket/x", {}, {"AWS_ENDPOINT_URL_S3": "ftp://me:hunter2hunter2@host"},
     "AWS_ENDPOINT_URL_S3=ftp://***@host"),
    ("s3://bucket/x", {"client_kwargs": {"endpoint_url": "http://"}}, {}, "client_kwargs.endpoint_url=http://"),
])
def test_an_unusable_url_is_refused_where_the_store_is_made_naming_it_without_its_password(
        monkeypatch, url, options, env, named):
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as refused:
        open_store(SourceConfig(url, options))
    assert str(refused.value).startswith(named + ": "), refused.value
    assert "hunter2" not in str(refused.value)


def test_the_endpoint_errors_name_shows_no_password(monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    store = open_store(SourceConfig("s3://bucket/x", {"endpoint_url": "http://me:hunter2hunter2@127.0.0.1:9",
                                                      "key": "k", "secret": "s"}))
    assert store.endpoint == "http://***@127.0.0.1:9"
