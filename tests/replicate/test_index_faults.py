"""A source without a manifest, indexed on the fly through an origin that corrupts bodies:
the replica is the origin's bytes, and a kept index that recorded corruption is repaired."""

from __future__ import annotations

import dataclasses

import xxhash

from stager.config import SourceConfig
from stager.hashing import StreamHasher
from stager.manifest import MANIFEST_PATH, Manifest, decode_manifest, encode_manifest
from stager.manifest.build import IndexConfig, build_manifest
from stager.replicate import Replicator
from stager.store import open_store
from stager.loopback.fault_plan import FaultPlan

from .dataset import mixed_files
from .test_replicator import config

#: 30% of GET bodies with one flipped byte, 5% cut short (half truncated, half reset).
FAULTS = dict(flip_p=0.30, truncate_p=0.025, reset_p=0.025)


def write_plain(root, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)


async def true_entries(root, block_size: int):
    async with open_store(SourceConfig(str(root))) as store:
        manifest = await build_manifest(store, IndexConfig(block_size=block_size, bin_dtype=None))
    return [(e.path, e.size, e.digest, e.blocks) for e in manifest]


def assert_same_bytes(files: dict[str, bytes], root) -> None:
    for name, data in files.items():
        got = (root / name).read_bytes()
        assert len(got) == len(data) and xxhash.xxh3_128_digest(got) == xxhash.xxh3_128_digest(data), name


async def test_source_without_manifest_through_a_corrupting_origin_gives_the_origin_bytes(clusters, fault_proxy,
                                                                                         tmp_path):
    a, b = clusters
    files = mixed_files(seed=9, small=10)
    write_plain(a.root / "ds", files)
    proxy = fault_proxy(a.server, FaultPlan(**FAULTS), seed=5)
    summary = await Replicator(config(a.source("ds", proxy.url), b.source("copy"), tmp_path)).run()
    assert summary["failed"] == 0, summary["errors"]
    assert summary["manifest_published"]
    assert_same_bytes(files, b.root / "copy")
    published = decode_manifest((b.root / "copy" / MANIFEST_PATH).read_bytes(), "published")
    assert [(e.path, e.size, e.digest, e.blocks) for e in published] == await true_entries(a.root / "ds",
                                                                                           published.block_size)
    assert proxy.faults.get("flip", 0) > 5, proxy.faults


def _poisoned(manifest: Manifest, path: str, data: bytes) -> Manifest:
    """``manifest`` with the digests of ``path`` taken from ``data`` with one byte flipped (what an
    index made through a corrupting origin by an older stager recorded)."""
    bad = bytearray(data)
    bad[len(bad) // 2] ^= 0xFF
    hasher = StreamHasher(manifest.block_size)
    hasher.update(bytes(bad))
    digest, blocks = hasher.finish()
    entries = [dataclasses.replace(e, digest=digest, blocks=tuple(blocks)) if e.path == path else e for e in manifest]
    return Manifest.from_entries(entries, manifest.block_size)


async def test_a_kept_on_the_fly_index_that_recorded_corruption_is_reindexed(clusters, tmp_path):
    a, b = clusters
    files = mixed_files(seed=10, small=4)
    write_plain(a.root / "ds", files)
    cfg = config(a.source("ds"), b.source("copy"), tmp_path)
    assert (await Replicator(cfg).run())["failed"] == 0
    (kept,) = (tmp_path / "state").rglob("index-*.parquet")
    victim = "large/big-0.bin"
    kept.write_bytes(encode_manifest(_poisoned(decode_manifest(kept.read_bytes(), "kept"), victim, files[victim])))
    (b.root / "copy" / victim).unlink()  # so the rerun must copy it by the kept index

    summary = await Replicator(cfg).run()
    assert summary["failed"] == 0, summary["errors"]
    assert summary["reindexed_objects"] == 1 and summary["manifest_published"]
    assert_same_bytes(files, b.root / "copy")
    truth = await true_entries(a.root / "ds", 1 << 20)
    for manifest_bytes in ((b.root / "copy" / MANIFEST_PATH).read_bytes(), kept.read_bytes()):
        manifest = decode_manifest(manifest_bytes, "m")
        assert [(e.path, e.size, e.digest, e.blocks) for e in manifest] == truth
    again = await Replicator(cfg).run()  # and it stays repaired
    assert again["failed"] == 0 and again["copied_objects"] == 0 and again["complete"]


async def test_the_blocks_of_large_objects_are_checked_off_the_event_loop(clusters, fault_proxy, tmp_path,
                                                                          monkeypatch):
    # The event loop carries every transfer of a replicate run: a part's blocks are hashed on a thread.
    # Flipped bodies must still be caught (and read again), and the replica be the origin's bytes.
    import threading
    import types

    from stager.replicate import copier

    hashed_on: set[str] = set()

    def recorded(data) -> int:
        hashed_on.add(threading.current_thread().name)
        return xxhash.xxh3_64_intdigest(data)

    monkeypatch.setattr(copier, "xxhash", types.SimpleNamespace(
        xxh3_64_intdigest=recorded, xxh3_128_digest=xxhash.xxh3_128_digest,
        xxh3_128_hexdigest=xxhash.xxh3_128_hexdigest))
    a, b = clusters
    files = mixed_files(seed=4, small=0, large=(12 * 1024 * 1024 + 77, 11 * 1024 * 1024))
    write_plain(a.root / "ds", files)
    async with open_store(a.source("ds")) as store:
        manifest = await build_manifest(store, IndexConfig(block_size=1 << 20, bin_dtype=None))
        await store.write(MANIFEST_PATH, encode_manifest(manifest))
    proxy = fault_proxy(a.server, FaultPlan(flip_p=0.3), seed=2)
    loop_thread = threading.current_thread().name
    summary = await Replicator(config(a.source("ds", proxy.url), b.source("copy"), tmp_path)).run()
    assert summary["failed"] == 0, summary["errors"]
    assert_same_bytes(files, b.root / "copy")
    assert proxy.faults.get("flip", 0) > 0, proxy.faults
    assert hashed_on and loop_thread not in hashed_on, hashed_on
