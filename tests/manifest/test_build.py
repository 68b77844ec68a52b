"""Building a manifest from a remote origin that corrupts bodies in transit: only true digests are recorded."""

from __future__ import annotations

import random

import pytest

from stager.config import RetryConfig, SourceConfig
from stager.manifest.build import IndexConfig, build_manifest
from stager.store import open_store
from stager.loopback.fault_plan import FaultPlan

KiB = 1 << 10
#: 30% of GET bodies with one flipped byte, 5% cut short (half truncated, half reset).
FAULTS = dict(flip_p=0.30, truncate_p=0.025, reset_p=0.025)
FAST_RETRY = RetryConfig(attempts=16, backoff_base=0.002, backoff_max=0.02, deadline=60.0, request_timeout=20.0)
CONFIG = IndexConfig(block_size=64 * KiB, bin_dtype=None)


def write_files(root, seed: int = 0) -> None:
    rng = random.Random(seed)
    for i in range(8):
        path = root / f"sub{i % 2}" / f"f{i:03d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(rng.randint(1, 600 * KiB)))
    (root / "empty.bin").write_bytes(b"")


async def local_truth(root):
    async with open_store(SourceConfig(str(root))) as store:
        return await build_manifest(store, CONFIG)


def entries(manifest):
    return [(e.path, e.size, e.digest, e.blocks) for e in manifest]


@pytest.mark.parametrize("etag", ["MD5", ""], ids=["origin-vouches-md5", "origin-vouches-nothing"])
async def test_index_through_corrupting_origin_records_only_true_digests(s3_server_factory, fault_proxy, tmp_path,
                                                                        etag):
    server = s3_server_factory(etag_hash=etag)
    root = server.make_bucket("data") / "ds"
    write_files(root)
    proxy = fault_proxy(server, FaultPlan(**FAULTS), seed=3)
    source = SourceConfig("s3://data/ds", server.storage_options(proxy.url))
    async with open_store(source, retry=FAST_RETRY) as store:
        manifest = await build_manifest(store, CONFIG)
        listed = await store.list()
    assert entries(manifest) == entries(await local_truth(root))
    # and the path this case meant to test was the one taken
    assert all((getattr(o, "md5", None) is not None) == (etag == "MD5") for o in listed), listed
    assert proxy.faults.get("flip", 0) > 3, proxy.faults  # the origin really corrupted bodies


async def test_an_object_rewritten_after_it_was_listed_is_hashed_again_by_its_new_md5(s3_bucket):
    import asyncio

    from stager.manifest.object_hash import hash_object

    path = s3_bucket.path / "ds" / "ckpt.bin"
    path.parent.mkdir()
    path.write_bytes(random.Random(1).randbytes(300 * KiB))
    async with open_store(SourceConfig(f"{s3_bucket.url}/ds", s3_bucket.storage_options()), retry=FAST_RETRY) as store:
        (listed,) = await store.list()
        new = random.Random(2).randbytes(300 * KiB)  # same size, other bytes: the listing's MD5 is stale
        path.write_bytes(new)
        hashed = await hash_object(store, listed, 64 * KiB, gate=asyncio.Semaphore(4))
    async with open_store(SourceConfig(str(path.parent))) as local:
        truth = await hash_object(local, (await local.list())[0], 64 * KiB, gate=asyncio.Semaphore(4))
    assert (hashed.digest, hashed.blocks) == (truth.digest, truth.blocks)


async def test_an_etag_that_is_no_md5_of_the_bytes_keeps_what_two_reads_agree_on(s3_bucket, caplog):
    """SSE-KMS objects (and some S3-compatible stores) list an ETag that is no MD5 of the bytes."""
    import asyncio
    from dataclasses import replace

    from stager.manifest.object_hash import hash_object

    path = s3_bucket.path / "kms" / "part-0.bin"
    path.parent.mkdir()
    path.write_bytes(random.Random(3).randbytes(200 * KiB))
    not_md5 = "0123456789abcdef0123456789abcdef"
    async with open_store(SourceConfig(f"{s3_bucket.url}/kms", s3_bucket.storage_options()), retry=FAST_RETRY) as store:
        (listed,) = await store.list()
        real_info = store.info

        async def info(p: str):  # the origin keeps listing that ETag for the unchanged object
            return replace(await real_info(p), md5=not_md5)

        store.info = info
        with caplog.at_level("WARNING", logger="stager.manifest.object_hash"):
            hashed = await hash_object(store, replace(listed, md5=not_md5), 64 * KiB, gate=asyncio.Semaphore(4))
    async with open_store(SourceConfig(str(path.parent))) as local:
        truth = await hash_object(local, (await local.list())[0], 64 * KiB, gate=asyncio.Semaphore(4))
    assert (hashed.digest, hashed.blocks) == (truth.digest, truth.blocks)
    assert "part-0.bin" in caplog.text and "no MD5" in caplog.text


@pytest.mark.parametrize("etag", ["MD5", ""], ids=["origin-vouches-md5", "origin-vouches-nothing"])
async def test_two_reads_of_a_tiny_object_corrupted_alike_are_not_taken_for_its_bytes(s3_server_factory, fault_proxy,
                                                                                     etag):
    """The one byte of an object flipped on its first two reads gives two reads that agree on wrong bytes."""
    server = s3_server_factory(etag_hash=etag)
    root = server.make_bucket("data") / "ds"
    root.mkdir()
    (root / "tiny.bin").write_bytes(b"\x5a")
    (root / "other.bin").write_bytes(random.Random(1).randbytes(3 * KiB))
    proxy = fault_proxy(server, FaultPlan(flip_p=1.0, max_faults=2, path_contains="tiny.bin"), seed=1)
    source = SourceConfig("s3://data/ds", server.storage_options(proxy.url))
    async with open_store(source, retry=FAST_RETRY) as store:
        manifest = await build_manifest(store, CONFIG)
    assert proxy.faults.get("flip", 0) == 2, proxy.faults  # both of the first two reads were corrupted
    assert entries(manifest) == entries(await local_truth(root))
