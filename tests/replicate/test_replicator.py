"""Replicating between two real S3 servers (different keys), through the fault proxy, in-process."""

from __future__ import annotations

import time

import pytest

from stager.config import SourceConfig
from stager.errors import ManifestError, OriginUnavailable
from stager.manifest import MANIFEST_PATH
from stager.replicate import ReplicateConfig, Replicator, Shard
from stager.store import open_store
from stager.loopback.fault_plan import FaultPlan

from .dataset import (
    FAST_RETRY,
    MiB,
    assert_replica,
    corrupt_file,
    mixed_files,
    write_dataset,
)


def config(src: SourceConfig, dst: SourceConfig, tmp_path, **kwargs) -> ReplicateConfig:
    kwargs.setdefault("state_dir", str(tmp_path / "state"))
    kwargs.setdefault("retry", FAST_RETRY)
    kwargs.setdefault("part_size", 5 * MiB)
    kwargs.setdefault("buffer", 16 * MiB)
    kwargs.setdefault("concurrency", 8)
    return ReplicateConfig(src=src, dst=dst, **kwargs)


async def test_copy_then_nothing_then_extras_only_with_delete(clusters, tmp_path):
    a, b = clusters
    manifest = write_dataset(a.root / "ds", mixed_files())
    cfg = config(a.source("ds"), b.source("copy"), tmp_path)

    dry = await Replicator(ReplicateConfig(**{**_fields(cfg), "dry_run": True})).run()
    assert dry["plan"]["actions"]["copy_missing"]["objects"] == len(manifest)
    assert not (b.root / "copy").exists()  # a dry run writes nothing

    first = await Replicator(cfg).run()
    assert first["copied_objects"] == len(manifest) and first["copied_bytes"] == manifest.total_bytes
    assert first["manifest_published"] and first["failed"] == 0
    assert_replica(a.root / "ds", b.root / "copy")

    second = await Replicator(cfg).run()
    assert second["copied_bytes"] == 0 and second["checked_objects"] == 0
    assert second["skipped_objects"] == len(manifest) and second["complete"]

    extra = b.root / "copy" / "stale" / "old.bin"
    extra.parent.mkdir(parents=True)
    extra.write_bytes(b"left over from an older version")
    kept = await Replicator(cfg).run()
    assert kept["extra_objects"] == 1 and kept["deleted_objects"] == 0 and extra.exists()
    removed = await Replicator(ReplicateConfig(**{**_fields(cfg), "delete": True})).run()
    assert removed["deleted_objects"] == 1 and not extra.exists()
    assert_replica(a.root / "ds", b.root / "copy")


def _fields(cfg: ReplicateConfig) -> dict:
    return {name: getattr(cfg, name) for name in cfg.__dataclass_fields__}


SOURCE_FAULTS = {
    "slowdown": dict(slowdown_p=0.25),
    "error500": dict(error500_p=0.25),
    "reset": dict(reset_p=0.25),
    "truncate": dict(truncate_p=0.25),
    "flip": dict(flip_p=0.25),
    "ignore_range": dict(ignore_range_p=0.25),
    "spikes": dict(latency_s=0.002, jitter_s=0.01, spike_p=0.1, spike_s=0.3),
}
DEST_FAULTS = {
    "slowdown": dict(slowdown_p=0.25),
    "error500": dict(error500_p=0.25),
    "reset": dict(reset_p=0.25),  # after the request reached the server: the write may have happened
}
CASES = [("source", k, v) for k, v in SOURCE_FAULTS.items()] + [("destination", k, v) for k, v in DEST_FAULTS.items()]
CASES.append(("both", "mixed", dict(slowdown_p=0.05, error500_p=0.05, reset_p=0.05, truncate_p=0.05, flip_p=0.05,
                                    ignore_range_p=0.05)))


@pytest.mark.parametrize(("side", "kind", "faults"), CASES, ids=[f"{s}-{k}" for s, k, _ in CASES])
async def test_every_fault_kind_gives_a_complete_verified_copy(clusters, fault_proxy, tmp_path, side, kind, faults):
    a, b = clusters
    write_dataset(a.root / "ds", mixed_files(seed=1, small=12))
    src_plan = FaultPlan(**faults, methods=("GET",)) if side in ("source", "both") else FaultPlan()
    dst_faults = {k: v for k, v in faults.items() if k in ("slowdown_p", "error500_p", "reset_p")}
    dst_plan = FaultPlan(**dst_faults, methods=("PUT", "POST")) if side in ("destination", "both") else FaultPlan()
    src_proxy = fault_proxy(a.server, src_plan, seed=7)
    dst_proxy = fault_proxy(b.server, dst_plan, seed=11)
    cfg = config(a.source("ds", src_proxy.url), b.source("copy", dst_proxy.url), tmp_path)
    summary = await Replicator(cfg).run()
    assert summary["failed"] == 0, summary["errors"]
    assert summary["manifest_published"]
    assert_replica(a.root / "ds", b.root / "copy")
    injected = sum(src_proxy.faults.values()) + sum(dst_proxy.faults.values())
    assert injected > 0, "the proxy injected nothing: the test proves nothing"
    if kind == "flip":
        assert summary["corrupt_blocks_rejected"] > 0


async def test_right_size_wrong_bytes_is_hashed_and_replaced_unless_trust_size(clusters, tmp_path):
    a, b = clusters
    files = mixed_files(seed=2, large=(6 * MiB,), small=3)
    write_dataset(a.root / "ds", files)
    target = b.root / "copy" / "large" / "big-0.bin"
    target.parent.mkdir(parents=True)
    target.write_bytes(bytes(len(files["large/big-0.bin"])))  # same size, other bytes, no manifest vouching

    trusting = await Replicator(config(a.source("ds"), b.source("copy"), tmp_path, trust_size=True,
                                       dry_run=True)).run()
    assert trusting["plan"]["actions"]["skip_size"]["objects"] == 1
    cfg = config(a.source("ds"), b.source("copy"), tmp_path)
    dry = await Replicator(ReplicateConfig(**{**_fields(cfg), "dry_run": True})).run()
    assert dry["plan"]["actions"]["check"]["objects"] == 1 and "hashed" in dry["note"]
    summary = await Replicator(cfg).run()
    assert summary["check_mismatches"] == 1 and summary["copied_objects"] == len(files)
    assert_replica(a.root / "ds", b.root / "copy")


async def test_verify_rereads_and_repairs_a_damaged_copy(clusters, tmp_path):
    a, b = clusters
    write_dataset(a.root / "ds", mixed_files(seed=3, small=4))
    cfg = config(a.source("ds"), b.source("copy"), tmp_path)
    await Replicator(cfg).run()
    corrupt_file(b.root / "copy" / "large" / "big-0.bin", offset=5 * MiB + 3)  # rot at rest, size unchanged
    trusted = await Replicator(cfg).run()  # the journal and the manifest vouch for it: not read
    assert trusted["checked_objects"] == 0 and trusted["copied_objects"] == 0
    verified = await Replicator(ReplicateConfig(**{**_fields(cfg), "verify": True})).run()
    assert verified["check_mismatches"] == 1 and verified["copied_objects"] == 1
    assert verified["checked_objects"] >= 6  # every object read back, the repaired one twice
    assert_replica(a.root / "ds", b.root / "copy")


async def test_source_that_differs_from_its_manifest_is_reported_and_nothing_published(clusters, tmp_path):
    a, b = clusters
    write_dataset(a.root / "ds", mixed_files(seed=4, small=4))
    corrupt_file(a.root / "ds" / "small" / "0" / "part-0000.bin")  # the origin lost that file's bytes
    summary = await Replicator(config(a.source("ds"), b.source("copy"), tmp_path,
                                      retry=FAST_RETRY.__class__(attempts=3, backoff_base=0.001, backoff_max=0.01,
                                                                 deadline=5, request_timeout=5))).run()
    assert summary["failed"] == 1 and "part-0000.bin" in summary["errors"][0]
    assert summary["copied_objects"] == 6  # the others were copied
    assert not summary["manifest_published"]
    assert not (b.root / "copy" / MANIFEST_PATH).exists()
    assert not (b.root / "copy" / "small" / "0" / "part-0000.bin").exists()  # never written unverified


async def test_stale_destination_manifest_is_removed_before_the_first_change(clusters, fault_proxy, tmp_path):
    a, b = clusters
    files = mixed_files(seed=5, small=6)
    write_dataset(a.root / "ds", files)
    cfg = config(a.source("ds"), b.source("copy"), tmp_path)
    await Replicator(cfg).run()
    files["small/1/part-0001.bin"] = b"a new version of this shard"
    write_dataset(a.root / "ds", files)
    # The destination refuses the new bytes, for good (everything else goes through).
    proxy = fault_proxy(b.server, FaultPlan(error500_p=1.0, methods=("PUT",), path_contains="part-0001"))
    cfg_down = config(a.source("ds"), b.source("copy", proxy.url), tmp_path,
                      retry=FAST_RETRY.__class__(attempts=3, backoff_base=0.001, backoff_max=0.01, deadline=3,
                                                 request_timeout=2))
    with pytest.raises(OriginUnavailable):
        await Replicator(cfg_down).run()
    # The old manifest would describe bytes that are no longer all there: it is gone, not stale.
    assert not (b.root / "copy" / MANIFEST_PATH).exists()
    summary = await Replicator(cfg).run()
    assert summary["copied_objects"] == 1 and summary["manifest_published"]
    assert_replica(a.root / "ds", b.root / "copy")


async def test_http_source_to_local_folder(http_origin, tmp_path):
    write_dataset(http_origin.root / "ds", mixed_files(seed=6, small=5))
    cfg = config(SourceConfig(f"{http_origin.url}/ds"), SourceConfig(str(tmp_path / "out")), tmp_path)
    summary = await Replicator(cfg).run()
    assert summary["failed"] == 0 and summary["manifest_published"]
    assert_replica(http_origin.root / "ds", tmp_path / "out")


async def test_folder_without_manifest_is_indexed_once_and_sent_to_s3(clusters, tmp_path):
    _, b = clusters
    src = tmp_path / "plain"
    for name, data in mixed_files(seed=8, small=5).items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    cfg = config(SourceConfig(f"file://{src}"), b.source("copy"), tmp_path)
    summary = await Replicator(cfg).run()
    assert summary["failed"] == 0 and summary["manifest_published"]
    assert not (src / MANIFEST_PATH).exists()  # the source is never written to
    assert len(list((tmp_path / "state").glob("index-*.parquet"))) == 1  # kept for a rerun
    again = await Replicator(cfg).run()
    assert again["copied_objects"] == 0 and again["complete"]
    cached = next((tmp_path / "state").glob("index-*.parquet"))
    assert (b.root / "copy" / MANIFEST_PATH).read_bytes() == cached.read_bytes()


async def test_sharded_run_needs_a_source_manifest(clusters, tmp_path):
    _, b = clusters
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "x.bin").write_bytes(b"x")
    cfg = config(SourceConfig(str(tmp_path / "plain")), b.source("copy"), tmp_path, shard=Shard(1, 2))
    with pytest.raises(ManifestError, match="stager index"):
        await Replicator(cfg).run()


async def test_block_size_of_the_manifest_sets_the_parts(clusters, tmp_path):
    a, b = clusters
    write_dataset(a.root / "ds", {"one.bin": bytes(range(256)) * (9 * MiB // 256)}, block_size=3 * MiB)
    summary = await Replicator(config(a.source("ds"), b.source("copy"), tmp_path)).run()
    assert summary["failed"] == 0  # parts of 6 MiB (two 3 MiB blocks): 6 + 3
    assert_replica(a.root / "ds", b.root / "copy")


async def test_bandwidth_cap_holds_the_copy_back(tmp_path):
    files = {f"f{i}.bin": bytes([i]) * 1_000_000 for i in range(4)}
    write_dataset(tmp_path / "src", files)
    cfg = config(SourceConfig(str(tmp_path / "src")), SourceConfig(str(tmp_path / "dst")), tmp_path,
                 bandwidth=4_000_000)
    began = time.monotonic()
    summary = await Replicator(cfg).run()
    assert summary["copied_bytes"] == 4_000_000
    assert time.monotonic() - began >= 0.7  # 4 MB at 4 MB/s, less the first quarter second of burst
    assert_replica(tmp_path / "src", tmp_path / "dst")


async def test_other_fsspec_destinations_take_the_spooled_upload_path(tmp_path):
    # memory:// stands in for gs:// and az://: no multipart API in the store, so parts are spooled.
    files = mixed_files(seed=30, large=(6 * MiB + 1,), small=3)
    write_dataset(tmp_path / "src", files)
    dst = f"memory://replicate-{tmp_path.name}/copy"
    summary = await Replicator(config(SourceConfig(str(tmp_path / "src")), SourceConfig(dst), tmp_path)).run()
    assert summary["failed"] == 0 and summary["manifest_published"]
    async with open_store(SourceConfig(dst)) as store:
        for name, data in files.items():
            assert await store.read(name) == data
        assert await store.read(MANIFEST_PATH) == (tmp_path / "src" / MANIFEST_PATH).read_bytes()


async def test_reads_follow_a_source_that_caps_each_connection(http_origin, fault_proxy, tmp_path):
    # an object store's source: every response capped, some first-byte latency; many small objects
    files = {f"obj/{i:04d}.bin": bytes([i % 251]) * 24_000 for i in range(160)}
    write_dataset(http_origin.root / "ds", files)
    proxy = fault_proxy(http_origin, FaultPlan(latency_s=0.02, connection_bps=50_000, path_contains="/obj/"))
    cfg = config(SourceConfig(f"{proxy.url}/ds"), SourceConfig(str(tmp_path / "out")), tmp_path, concurrency=256)
    replicator = Replicator(cfg)
    summary = await replicator.run()
    assert summary["failed"] == 0 and summary["manifest_published"]
    assert_replica(http_origin.root / "ds", tmp_path / "out")
    reads = replicator.copier.read_gate.controller
    assert reads.peak >= 4 * reads.initial  # from 16 to 64 and more, as each request kept its speed
    assert proxy.peak_in_flight >= 4 * reads.initial  # on the wire, not only the controller's number
    assert summary["concurrency_peak"]["source"] >= 4 * reads.initial


async def test_a_part_is_read_as_ranged_gets_of_whole_blocks_at_once(clusters, fault_proxy, tmp_path):
    # a source that caps each connection: one GET per part would hold the copy to (parts held) x (its rate)
    a, b = clusters
    files = mixed_files(seed=40, large=(10 * MiB,), small=0)
    write_dataset(a.root / "ds", files)  # 1 MiB blocks: parts of 5 MiB, each read as five GETs
    proxy = fault_proxy(a.server, FaultPlan(latency_s=0.02, connection_bps=4_000_000, path_contains="/big-",
                                            methods=("GET",)))
    replicator = Replicator(config(a.source("ds", proxy.url), b.source("copy"), tmp_path))
    summary = await replicator.run()
    assert summary["failed"] == 0 and summary["manifest_published"]
    assert_replica(a.root / "ds", b.root / "copy")
    assert proxy.stats().requests >= 10  # a GET per block of the two parts
    held = summary["concurrency_peak"]["parts_held"]
    assert proxy.peak_in_flight > held  # more GETs in flight than parts: each part's blocks at once


async def test_a_part_from_a_fast_source_is_not_cut_into_more_gets_than_it_needs(clusters, fault_proxy, tmp_path):
    # no cap per connection: once a GET has shown how fast one connection is from its first byte on,
    # parts are read whole again (the wait for the first byte is latency, which more GETs do not cut)
    a, b = clusters
    files = mixed_files(seed=41, large=(64 * MiB,), small=0)
    write_dataset(a.root / "ds", files)  # 1 MiB blocks, parts of 8 MiB: 64 GETs if every part were cut
    proxy = fault_proxy(a.server, FaultPlan(latency_s=0.05, path_contains="/big-", methods=("GET",)))
    replicator = Replicator(config(a.source("ds", proxy.url), b.source("copy"), tmp_path, part_size=8 * MiB))
    summary = await replicator.run()
    assert summary["failed"] == 0 and summary["manifest_published"]
    assert_replica(a.root / "ds", b.root / "copy")
    assert proxy.stats().requests < 48  # the first parts cut in eight, the rest in one or two
