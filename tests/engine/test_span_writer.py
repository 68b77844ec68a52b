"""The span writer: a body's blocks hashed and written on the disk threads, checked, and only then recorded."""

from __future__ import annotations

import asyncio
import os

import pytest
import xxhash

from stager.cache import CacheTier
from stager.config import CacheConfig
from stager.engine.dataset import BlobRef
from stager.engine.disk_threads import DiskThreads
from stager.engine.span_writer import SpanWriter
from stager.errors import CorruptData, DiskFull

BLOCK = 64 * 1024
PIECE = 20 * 1024  # each piece of the body in a buffer of its own: a block goes in several batches


@pytest.fixture
def threads():
    pool = DiskThreads(2, "test-disk")
    yield pool
    pool.shutdown()


def blob(blocks: int = 3) -> tuple[bytes, BlobRef]:
    data = os.urandom(blocks * BLOCK - 1000)
    digests = tuple(xxhash.xxh3_64_intdigest(data[i:i + BLOCK]) for i in range(0, len(data), BLOCK))
    return data, BlobRef(xxhash.xxh3_128_hexdigest(data), len(data), BLOCK, digests, "shard.bin", None)


async def stream(writer: SpanWriter, body: bytes) -> None:
    try:
        for at in range(0, len(body), PIECE):
            await writer.write(memoryview(bytearray(body[at:at + PIECE])))  # a fresh buffer each time
        await writer.close()
    except BaseException:
        await writer.abort()
        raise


async def test_a_body_is_written_in_batches_and_each_block_recorded_once_checked(threads, tmp_path):
    data, ref = blob()
    recorded: list[tuple[int, int]] = []
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=16 << 20)) as cache:
        partial = cache.begin(ref.digest, ref.size, BLOCK, ref.blocks, unsynced=True)
        writer = SpanWriter(threads, partial, ref, 0, 2, durable=False, corrupt=lambda i: CorruptData(str(i)),
                            verified=lambda i, n: recorded.append((i, n)))
        await asyncio.wait_for(stream(writer, data), 30)
        assert sorted(recorded) == [(0, BLOCK), (1, BLOCK), (2, len(data) - 2 * BLOCK)]
        assert partial.verified == {0, 1, 2}
        assert partial.commit().read_bytes() == data
        partial.close()


async def test_a_block_that_does_not_match_fails_the_attempt_and_is_never_recorded(threads, tmp_path):
    data, ref = blob()
    bad = bytearray(data)
    bad[BLOCK + 3 * PIECE // 2] ^= 0x40  # in block 1, in a batch after its first
    recorded: list[int] = []
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=16 << 20)) as cache:
        partial = cache.begin(ref.digest, ref.size, BLOCK, ref.blocks, unsynced=True)
        writer = SpanWriter(threads, partial, ref, 0, 2, durable=False,
                            corrupt=lambda i: CorruptData(f"block {i} is bad"),
                            verified=lambda i, n: recorded.append(i))
        with pytest.raises(CorruptData, match="block 1 is bad"):
            await asyncio.wait_for(stream(writer, bytes(bad)), 30)
        assert 1 not in partial.verified and 1 not in recorded
        assert 0 in partial.verified and recorded[0] == 0
        partial.close()


async def test_a_block_whose_earlier_batch_failed_to_write_is_not_recorded(threads, tmp_path):
    data, ref = blob()
    recorded: list[int] = []
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=16 << 20)) as cache:
        partial = cache.begin(ref.digest, ref.size, BLOCK, ref.blocks, unsynced=True)
        write = partial.write_into_block

        def failing(index, offset, batch):
            if index == 1 and offset == BLOCK:  # block 1's first batch: the disk is full (for a moment)
                raise DiskFull("no space left on the cache's disk")
            return write(index, offset, batch)

        partial.write_into_block = failing
        writer = SpanWriter(threads, partial, ref, 0, 2, durable=False, corrupt=lambda i: CorruptData(str(i)),
                            verified=lambda i, n: recorded.append(i))
        with pytest.raises(DiskFull):
            await asyncio.wait_for(stream(writer, data), 30)
        # block 1's later batches were written and its bytes match, but one of its writes failed
        assert 1 not in partial.verified and 1 not in recorded
        partial.close()
