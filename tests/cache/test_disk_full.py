"""A full disk (ENOSPC) fails at once as DiskFull, and the cache stays usable: it can still record,
evict, show its status and verify, and resumes when room comes back.

These run on real small tmpfs mounts (see small_disk.py), filled for real, by the cache itself or by
another process; only the last test injects ENOSPC, for the write and sync calls a tmpfs cannot fail.
"""

from __future__ import annotations

import errno
import json
import os
import time

import pytest

from stager.cache import BlobState, CacheTier
from stager.cache.reserve import RESERVE_FILE
from stager.errors import CacheFull, DiskFull

from ..cli.runner import run
from .blobs import check_invariants, config, fill, make_blob
from .small_disk import fill_disk, free_bytes, mounted_ext4, mounted_tmpfs

KiB = 1024
MiB = 1024 * KiB


@pytest.fixture
def tiny_disk(tmp_path):
    with mounted_tmpfs(tmp_path / "tiny", "1m") as mountpoint:
        yield mountpoint


@pytest.fixture
def small_disk(tmp_path):
    with mounted_tmpfs(tmp_path / "small", "8m") as mountpoint:
        yield mountpoint


def test_a_blob_larger_than_the_disk_is_refused_at_begin(tiny_disk):
    cfg = config(tiny_disk / "cache", 64 * MiB)  # the capacity says yes, the disk says no
    big = make_blob(2 * MiB, block_size=64 * KiB, seed=1)
    with CacheTier(cfg) as tier:
        assert tier.capacity < 1 * MiB  # the capacity follows the disk
        began = time.monotonic()
        with pytest.raises(DiskFull, match="its disk is full") as info:
            tier.begin(big.digest, big.size, big.block_size, big.blocks)
        assert time.monotonic() - began < 2
        assert str(tier.directory) in str(info.value) and f"{big.size:,}" in str(info.value)
        assert info.value.errno == errno.ENOSPC
        assert tier.record(big.digest) is None  # nothing half-made
        check_invariants(tier)

        small = make_blob(200 * KiB, seed=2)
        fill(tier, small)
        check_invariants(tier)

        # The index itself cannot grow past the disk either: one clear error, nothing half-recorded.
        many = [(f"{i:032x}", 1) for i in range(50_000)]
        with pytest.raises(CacheFull):
            tier.register_dataset("too-big", many)
        assert tier.datasets() == []
        assert tier.state(small.digest) is BlobState.COMPLETE
        check_invariants(tier)
    with CacheTier(cfg) as tier:  # and reopens consistent, and can still remove on the full disk
        assert tier.state(small.digest) is BlobState.COMPLETE
        check_invariants(tier)
        assert tier.remove(small.digest)
        check_invariants(tier)


@pytest.fixture(params=["tmpfs", "ext4"])
def any_small_disk(request, tmp_path):
    """8 MiB of tmpfs (buffered writes), or of ext4 on a loop device (O_DIRECT writes)."""
    if request.param == "tmpfs":
        with mounted_tmpfs(tmp_path / "small", "8m") as mountpoint:
            yield mountpoint
    else:
        with mounted_ext4(tmp_path / "small", tmp_path / "ext4.img", 8) as mountpoint:
            yield mountpoint


def test_partial_blobs_take_their_room_on_disk_at_begin(any_small_disk):
    """Reserved room is allocated, so the writes of a begun blob never meet a disk another program filled."""
    blob = make_blob(3 * MiB, block_size=256 * KiB, seed=4)
    with CacheTier(config(any_small_disk / "cache", 1024 * MiB)) as tier:
        with tier.begin(blob.digest, blob.size, blob.block_size, blob.blocks) as partial:
            partial.write_block(0, blob.block(0))
            fill_disk(any_small_disk / "filler")
            assert free_bytes(any_small_disk) < 64 * KiB
            for i in partial.missing_blocks():
                partial.write_block(i, blob.block(i))
            partial.commit()
        check_invariants(tier)


def test_eviction_makes_room_on_a_disk_another_program_filled(small_disk):
    cfg = config(small_disk / "cache", 1024 * MiB)
    olds = [make_blob(1 * MiB, block_size=256 * KiB, seed=10 + i) for i in range(3)]
    with CacheTier(cfg) as tier:
        for blob in olds:
            fill(tier, blob)
    fill_disk(small_disk / "filler")
    new = make_blob(2 * MiB, block_size=256 * KiB, seed=20)
    with CacheTier(cfg) as tier:  # opens on the full disk, evicts there, and records the new blob
        fill(tier, new)
        assert tier.state(new.digest) is BlobState.COMPLETE
        assert sum(tier.state(b.digest) is BlobState.ABSENT for b in olds) >= 2
        check_invariants(tier)
        # Nothing left to evict: the next blob fails at once, naming the cache and its disk.
        with pytest.raises(DiskFull, match="its disk is full"):
            fill(tier, make_blob(3 * MiB, block_size=256 * KiB, seed=21), protect={new.digest})
        check_invariants(tier)
        assert tier.state(new.digest) is BlobState.COMPLETE
    os.unlink(small_disk / "filler")
    with CacheTier(cfg) as tier:  # room is back: the reserve is made again, staging goes on
        assert (tier.directory / RESERVE_FILE).exists()
        fill(tier, make_blob(3 * MiB, block_size=256 * KiB, seed=21))
        check_invariants(tier)


def test_status_and_verify_work_on_a_disk_another_program_filled(small_disk):
    cfg = config(small_disk / "cache", 1024 * MiB)
    blobs = [make_blob(1 * MiB, block_size=256 * KiB, seed=30 + i) for i in range(3)]
    half = make_blob(1 * MiB, block_size=256 * KiB, seed=40)
    with CacheTier(cfg) as tier:
        for blob in blobs:
            fill(tier, blob)
        with tier.begin(half.digest, half.size, half.block_size, half.blocks) as partial:
            partial.write_block(0, half.block(0))
            partial.write_block(2, half.block(2))
    fill_disk(small_disk / "filler")
    assert free_bytes(small_disk) < 64 * KiB
    cache = str(small_disk / "cache")
    for _ in range(2):  # and again, once the reserve is spent
        status = run(["status", "--cache", cache, "--json"], timeout=60)
        assert status.returncode == 0, status.stderr
        report = json.loads(status.stdout)
        assert (report["complete_blobs"], report["partial_blobs"]) == (3, 1)
        verify = run(["verify", "--cache", cache], timeout=60)
        assert verify.returncode == 0, verify.stderr
        assert "verified 4 blobs" in verify.stdout and "0 bad" in verify.stdout
    # The reserve spent, and its room taken too: status and verify read the index file itself.
    (small_disk / "cache" / RESERVE_FILE).unlink(missing_ok=True)
    fill_disk(small_disk / "filler-2")
    status = run(["status", "--cache", cache, "--json"], timeout=60)
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert (report["complete_blobs"], report["partial_blobs"]) == (3, 1)
    assert report["used"] == 4 * MiB and report["capacity"] >= report["used"]
    verify = run(["verify", "--cache", cache], timeout=60)
    assert verify.returncode == 0, verify.stderr
    assert "verified 4 blobs" in verify.stdout and "0 bad" in verify.stdout
    os.unlink(small_disk / "filler-2")
    os.unlink(small_disk / "filler")
    with CacheTier(cfg) as tier:  # nothing verified was lost
        assert tier.record(half.digest).verified == {0, 2}
        assert all(tier.state(b.digest) is BlobState.COMPLETE for b in blobs)
        check_invariants(tier)


def test_reconcile_sweeps_reserves_half_made_by_a_dead_process(tmp_path):
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True, timeout=30)
    cache = tmp_path / "cache"
    with CacheTier(config(cache, 64 * MiB)):
        pass
    left = cache / f".{RESERVE_FILE}.{dead.stdout.strip()}.0badf00d"
    mine = cache / f".{RESERVE_FILE}.{os.getpid()}.0badf00d"
    left.write_bytes(bytes(4096))
    mine.write_bytes(bytes(4096))
    with CacheTier(config(cache, 64 * MiB)):
        assert not left.exists() and mine.exists()  # a live maker's file is its own business
    mine.unlink()


def test_injected_enospc_on_write_and_on_sync(tmp_path, monkeypatch):
    blob = make_blob(64 * KiB, seed=3)
    with CacheTier(config(tmp_path / "cache", 1024 * KiB)) as tier:
        partial = tier.begin(blob.digest, blob.size, blob.block_size, blob.blocks)
        partial.write_block(0, blob.block(0))

        def no_space(*args):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(os, "pwritev", no_space)  # direct writes and those through the page cache
        with pytest.raises(CacheFull, match=f"block 1 of blob {blob.digest}"):
            partial.write_block(1, blob.block(1))
        monkeypatch.undo()
        monkeypatch.setattr(os, "fdatasync", no_space)
        with pytest.raises(CacheFull):
            partial.write_block(2, blob.block(2))
        monkeypatch.undo()
        assert tier.record(blob.digest).verified == {0}
        for i in partial.missing_blocks():
            partial.write_block(i, blob.block(i))
        monkeypatch.setattr(os, "fsync", no_space)
        with pytest.raises(CacheFull):
            partial.commit()
        monkeypatch.undo()
        assert tier.state(blob.digest) is BlobState.PARTIAL
        partial.commit()
        partial.close()
        check_invariants(tier)
