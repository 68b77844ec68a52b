"""The core cache reader's open files for readers that check blocks themselves (the mount), and its drop."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import xxhash

from stager.cache import CacheTier
from stager.cache.reader import REHASH_WINDOW, BlockReads

from .blobs import config, make_blob


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def test_a_blob_opens_partial_with_its_verified_blocks_then_complete_as_the_same_file(tmp_path):
    blob = make_blob(3 * 16 * 1024 + 5, block_size=16 * 1024, seed=7)
    with CacheTier(config(tmp_path / "cache", 1 << 20)) as tier:
        reads = BlockReads(tier.complete_path, lambda: tier)
        assert reads.open_complete(blob.digest) is None and reads.open_any(blob.digest) is None
        partial = tier.begin(blob.digest, blob.size, blob.block_size, blob.blocks)
        partial.write_block(1, blob.block(1))
        found = reads.open_any(blob.digest)
        assert found is not None and not found.complete and found.verified == {1}
        try:
            assert reads.open_complete(blob.digest) is None
            for index in (0, 2, 3):
                partial.write_block(index, blob.block(index))
            partial.commit()
            partial.close()
            fd = reads.open_complete(blob.digest)
            assert fd is not None
            try:  # the commit renamed the partial file: an open descriptor on it reads the complete blob
                assert _identity(fd) == _identity(found.fd)
                assert os.pread(fd, blob.size, 0) == blob.data
            finally:
                os.close(fd)
        finally:
            os.close(found.fd)
        complete = reads.open_any(blob.digest)
        assert complete is not None and complete.complete
        os.close(complete.fd)


def test_a_bad_block_of_a_partial_blob_is_forgotten_and_of_a_complete_one_drops_the_blob(tmp_path, caplog):
    blob = make_blob(2 * 16 * 1024, block_size=16 * 1024, seed=8)
    with CacheTier(config(tmp_path / "cache", 1 << 20)) as tier:
        reported: list[str] = []
        reads = BlockReads(tier.complete_path, lambda: tier, on_corrupt=reported.append)
        partial = tier.begin(blob.digest, blob.size, blob.block_size, blob.blocks)
        partial.write_block(0, blob.block(0))
        partial.write_block(1, blob.block(1))
        found = reads.open_any(blob.digest)
        assert found is not None
        try:
            reads.drop(blob.digest, _identity(found.fd), [1], where=" (shard-0) block 1")
        finally:
            os.close(found.fd)
        assert tier.record(blob.digest).verified == {0}
        assert "(shard-0) block 1 changed on the cache disk" in caplog.text
        partial.close()
        partial = tier.begin(blob.digest, blob.size, blob.block_size, blob.blocks)  # the writer's next look
        assert partial.missing_blocks() == [1]
        partial.write_block(1, blob.block(1))
        partial.commit()
        partial.close()
        fd = reads.open_complete(blob.digest)
        assert fd is not None
        try:
            reads.drop(blob.digest, _identity(fd))
        finally:
            os.close(fd)
        assert reads.open_complete(blob.digest) is None and reads.open_any(blob.digest) is None
        assert reported == [blob.digest, blob.digest]


_REHASH_PEAK = r"""
import os, sys, xxhash
from stager.cache.reader import file_digest

def hwm_kib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))

path, size = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_RDONLY)
before = hwm_kib()
digest = file_digest(fd, size)
print(digest, hwm_kib() - before)
"""


def test_the_commits_rehash_holds_a_window_of_the_file_resident_not_the_file(tmp_path):
    # The engine re-hashes several blobs at once before their commits: mapped whole, each one's
    # pages counted in the process's RSS for as long as its hash ran.
    size = 96 << 20
    path = tmp_path / "blob"
    chunk = os.urandom(1 << 20)
    expected = xxhash.xxh3_128()
    with open(path, "wb") as fh:  # through the page cache: every page resident, so every page maps in
        for _ in range(size >> 20):
            fh.write(chunk)
            expected.update(chunk)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run([sys.executable, "-c", _REHASH_PEAK, str(path), str(size)], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    assert out[0] == expected.hexdigest()
    assert int(out[1]) < 4 * REHASH_WINDOW // 1024, f"peak RSS grew by {int(out[1]) >> 10} MiB re-hashing 96 MiB"
