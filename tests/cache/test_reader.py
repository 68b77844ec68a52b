"""The core cache reader's open files for readers that check blocks themselves (the mount), and its drop."""

from __future__ import annotations

import os

from stager.cache import CacheTier
from stager.cache.reader import BlockReads

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
