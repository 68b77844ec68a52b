"""A full disk (ENOSPC) becomes CacheFull and leaves the cache consistent.

The real test mounts a 1 MiB tmpfs (we run as root here) under the test's
temporary directory and fills it for real; where mounting is not allowed it
is skipped and the injected variant still runs.
"""

from __future__ import annotations

import errno
import os
import subprocess

import pytest

from stager.cache import BlobState, CacheTier
from stager.errors import CacheFull

from .blobs import check_invariants, config, fill, make_blob

KiB = 1024


@pytest.fixture
def tiny_disk(tmp_path):
    mountpoint = tmp_path / "tiny"
    mountpoint.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mountpoint)],
                              capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a tmpfs: {exc}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.decode().strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True, timeout=10)


def test_real_disk_full(tiny_disk):
    cfg = config(tiny_disk / "cache", 64 * 1024 * KiB)  # the capacity says yes, the disk says no
    big = make_blob(2 * 1024 * KiB, block_size=64 * KiB, seed=1)
    with CacheTier(cfg) as tier:
        with tier.begin(big.digest, big.size, big.block_size, big.blocks) as partial:
            written = []
            with pytest.raises(CacheFull, match="disk is full") as info:
                for i in range(big.block_count):
                    partial.write_block(i, big.block(i))
                    written.append(i)
            assert info.value.errno == errno.ENOSPC
            assert 0 < len(written) < big.block_count
            assert partial.verified == set(written)  # the failed block is not recorded
        assert tier.record(big.digest).verified == set(written)
        check_invariants(tier)

        # The index itself cannot grow either: one clear error, nothing half-recorded.
        many = [(f"{i:032x}", 1) for i in range(50_000)]
        with pytest.raises(CacheFull):
            tier.register_dataset("too-big", many)
        assert tier.datasets() == []

        # Room comes back when the blob goes; the cache works again.
        assert tier.remove(big.digest)
        small = make_blob(200 * KiB, seed=2)
        fill(tier, small)
        check_invariants(tier)
    with CacheTier(cfg) as tier:  # and reopens consistent
        assert tier.state(small.digest) is BlobState.COMPLETE
        check_invariants(tier)


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
