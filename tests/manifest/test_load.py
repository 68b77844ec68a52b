"""Loading a manifest from a real store: checked inside the store's retry loop, like a block.

Against ``rclone serve s3`` on loopback, behind the fault proxy where faults are wanted.
"""

from __future__ import annotations

import asyncio

import pytest

from stager.config import RetryConfig, SourceConfig
from stager.errors import ManifestError
from stager.manifest import MANIFEST_PATH, load_manifest, load_manifest_data, read_manifest_file
from stager.store import StoreOptions, open_store
from stager.loopback.fault_plan import FaultPlan
from tests.iterator.corpus import write_counting_corpus

from .test_seal import flipped, legacy_bytes, spread_offsets

FAST = RetryConfig(attempts=4, backoff_base=0.01, backoff_max=0.05, deadline=20, request_timeout=5)
#: A share of GET bodies corrupted (one flipped byte each), truncated or reset.
CORRUPTING = dict(flip_p=0.3, truncate_p=0.025, reset_p=0.025)


def load(url: str, options: dict, retry: RetryConfig = FAST):
    async def run():
        store = open_store(SourceConfig(url, options), retry=retry)
        try:
            return await load_manifest_data(store), store.stats
        finally:
            await store.close()

    return asyncio.run(run())


@pytest.fixture
def bucket(s3_bucket):
    manifest = write_counting_corpus(s3_bucket.path, [3000 + 17 * i for i in range(40)], block_size=4096)
    return s3_bucket, manifest


def test_a_manifest_is_fetched_again_until_it_checks_out_through_an_origin_that_corrupts_bodies(bucket, fault_proxy):
    b, manifest = bucket
    proxy = fault_proxy(b, FaultPlan(**CORRUPTING), seed=3)
    retry = RetryConfig(attempts=12, backoff_base=0.01, backoff_max=0.05, deadline=30, request_timeout=5)
    loads = 0
    while proxy.faults.get("flip", 0) < 5 and loads < 80:  # bounded: about 25 loads see 5 flips
        loaded, _ = load(b.url, b.storage_options(proxy.url), retry)
        loads += 1
        assert loaded.sealed
        assert loaded.manifest.table.equals(manifest.table)
        assert loaded.data == (b.path / MANIFEST_PATH).read_bytes()
    assert proxy.faults.get("flip", 0) >= 5  # the corrupted bodies were there, and none was believed


def test_a_manifest_damaged_on_the_origin_is_read_again_then_refused_naming_the_file(bucket, fault_proxy):
    b, _ = bucket
    path = b.path / MANIFEST_PATH
    good = path.read_bytes()
    path.write_bytes(flipped(good, spread_offsets(good)["data pages, middle"]))
    proxy = fault_proxy(b, FaultPlan(), seed=1)
    with pytest.raises(ManifestError) as info:
        load(b.url, b.storage_options(proxy.url))
    message = str(info.value)
    assert message.startswith(f"{b.url}/{MANIFEST_PATH}: digest mismatch"), message
    assert "4 read(s)" in message and "\n" not in message
    gets = [e for e in proxy.events if e.method == "GET"]
    assert len(gets) == FAST.attempts  # every attempt of the budget, then no more


def test_a_sealed_manifest_with_invalid_entries_fails_at_once(tmp_path):
    from stager.manifest import Manifest, encode_manifest

    from .test_parquet import good_manifest

    m = good_manifest()
    table = m.table.set_column(0, "path", __import__("pyarrow").array(["a", "../b", "c", "d", "e"]))
    (tmp_path / ".stager").mkdir()
    (tmp_path / MANIFEST_PATH).write_bytes(encode_manifest(Manifest(table, m.block_size)))

    async def run():
        store = open_store(SourceConfig(str(tmp_path)), retry=FAST)
        try:
            with pytest.raises(ManifestError, match=r"entry 1 \('\.\./b'\)"):
                await load_manifest(store)
            return store.stats
        finally:
            await store.close()

    stats = asyncio.run(run())
    assert stats.retries == 0  # the bytes match their digest: reading them again cannot help


def test_a_legacy_manifest_loads_from_the_store_unsealed(bucket):
    b, manifest = bucket
    (b.path / MANIFEST_PATH).write_bytes(legacy_bytes(manifest))
    loaded, _ = load(b.url, b.storage_options())
    assert not loaded.sealed
    assert loaded.manifest.table.equals(manifest.table)


def test_a_missing_manifest_is_one_clear_error(s3_bucket):
    (s3_bucket.path / "a.bin").write_bytes(b"x")
    with pytest.raises(ManifestError, match=r"no manifest \(run `stager index"):
        load(s3_bucket.url, s3_bucket.storage_options())
    assert load_manifest_data_missing_ok(s3_bucket) is None


def load_manifest_data_missing_ok(b):
    async def run():
        store = open_store(SourceConfig(b.url, b.storage_options()), retry=FAST)
        try:
            return await load_manifest_data(store, missing_ok=True)
        finally:
            await store.close()

    return asyncio.run(run())


def test_a_local_manifest_file_is_verified_too(tmp_path):
    manifest = write_counting_corpus(tmp_path, [100, 200], block_size=4096)
    path = tmp_path / MANIFEST_PATH
    assert read_manifest_file(str(path)).table.equals(manifest.table)
    path.write_bytes(flipped(path.read_bytes(), 40))
    with pytest.raises(ManifestError, match=f"^{path}: digest mismatch"):
        read_manifest_file(str(path))


def test_a_manifest_is_loaded_with_one_request_a_whole_get_and_no_size_look_up(bucket, fault_proxy):
    # The manifest is the first thing a run reads: a look-up of its size before a ranged read cost
    # one more round trip to the origin (20 to 100 ms on an object store) before any shard was asked for.
    b, manifest = bucket
    proxy = fault_proxy(b, FaultPlan(), seed=1)
    loaded, _ = load(b.url, b.storage_options(proxy.url))
    assert loaded.manifest.table.equals(manifest.table)
    asked = [(e.method, e.path.rsplit("/", 1)[-1]) for e in proxy.events]
    assert asked == [("GET", MANIFEST_PATH.rsplit("/", 1)[-1])], asked
