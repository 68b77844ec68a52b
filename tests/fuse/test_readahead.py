"""Read-ahead: sequential access is detected, and stages the next blocks and files through a real engine."""

from __future__ import annotations

import asyncio
import time

from stager.fuse.readahead import SLACK, STRAYS, STREAK, Access, ReadAhead, ReadAheadConfig
from stager.fuse.tree import Tree
from stager.cache import BlobState, CacheTier
from stager.config import CacheConfig, FetchConfig, SourceConfig
from stager.engine import Engine
from stager.session import EmbeddedSession
from stager.write import generate_corpus

KiB = 1024


def test_adjacent_reads_from_the_start_are_sequential_random_ones_are_not():
    access = Access()
    seen = [access.observe(offset, 128 * KiB) for offset in range(0, 128 * KiB * STREAK, 128 * KiB)]
    assert seen == [False] * (STREAK - 1) + [True]
    # the kernel's read-ahead sends reads slightly out of order: still sequential
    assert access.observe(128 * KiB * (STREAK + 1), 128 * KiB) and access.observe(128 * KiB * STREAK, 128 * KiB)
    scattered = Access()
    assert not any(scattered.observe(offset, 4 * KiB) for offset in (50 * SLACK, 3 * SLACK, 90 * SLACK, 20 * SLACK,
                                                                      70 * SLACK, 0, 40 * SLACK))


async def wait_complete(cache: CacheTier, digests: list[str], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(cache.state(d) is BlobState.COMPLETE for d in digests):
        assert time.monotonic() < deadline, "read-ahead did not stage the next files"
        await asyncio.sleep(0.02)


async def test_sequential_reads_stage_the_files_that_follow_and_random_reads_stage_nothing(tmp_path):
    manifest = generate_corpus(tmp_path / "corpus", shards=12, tokens_per_shard=40_000, seed=2, block_size=16 * KiB)
    tree = Tree.from_manifest(manifest)
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=1 << 30)) as cache:
        session = EmbeddedSession(Engine(cache, FetchConfig(concurrency=4, durable=False)), owns_cache=False)
        async with session:
            dataset = await session.open_dataset(SourceConfig(str(tmp_path / "corpus")))
            readahead = ReadAhead(session, dataset, tree.order, tree.positions,
                                  ReadAheadConfig(window_bytes=1 << 30, first_window=1, ramp=1 << 24, files=4,
                                                  streams=2))
            readahead.start()
            try:
                # random reads of a few files: nothing is planned
                for index in (7, 2, 9):
                    readahead.on_read(index, Access(), 20_000, 4096)
                await asyncio.sleep(0.2)
                assert readahead.plans_made == 0
                # one file read front to back: a stream stages the rest of it, then (once the reader moves
                # on, ramping up) the next files in walk order
                first = int(tree.order[3])
                access = Access()
                for offset in range(0, 16 * KiB * STREAK, 16 * KiB):
                    readahead.on_read(first, access, offset, 16 * KiB)
                await wait_complete(cache, [manifest.digest(first)])
                assert readahead.plans_made == 1
                assert cache.state(manifest.digest(int(tree.order[4]))) is BlobState.ABSENT
                readahead.on_read(int(tree.order[4]), Access(), 0, 16 * KiB)
                await wait_complete(cache, [manifest.digest(int(i)) for i in tree.order[4:7]])
                assert readahead.plans_made == 2  # the first step of the ramp makes a plan with a wider window
                assert cache.state(manifest.digest(int(tree.order[7]))) is BlobState.ABSENT  # 4 files per stream
                # files read whole one after the other (cp -r, tar) make a stream too
                def whole(position: int) -> None:
                    index = int(tree.order[position])
                    readahead.on_read(index, Access(), 0, int(manifest.sizes[index]))

                for position in (9, 10):
                    whole(position)
                await wait_complete(cache, [manifest.digest(int(tree.order[10]))])
                assert readahead.plans_made == 3
                # a third stream closes the least recently used one: at most `streams` plans stay open
                whole(0)
                whole(1)
                deadline = time.monotonic() + 10
                while readahead.plans_made < 4 or len(session.engine._plans) > 2:
                    assert time.monotonic() < deadline, "the oldest stream was never closed"
                    await asyncio.sleep(0.02)
            finally:
                await readahead.close()
            assert session.engine._plans == []


async def test_a_random_reader_that_looks_like_a_walk_for_a_moment_does_not_ramp_a_stream_over_the_dataset(tmp_path):
    """fio's random reads round-robin over the files: the first bytes of two files in a row start no stream;
    a stream started by adjacent reads (by chance) is neither widened nor advanced by random reads in the files
    after it, and STRAYS of them close it."""
    manifest = generate_corpus(tmp_path / "corpus", shards=12, tokens_per_shard=40_000, seed=3, block_size=16 * KiB)
    tree = Tree.from_manifest(manifest)
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=1 << 30)) as cache:
        session = EmbeddedSession(Engine(cache, FetchConfig(concurrency=4, durable=False)), owns_cache=False)
        async with session:
            dataset = await session.open_dataset(SourceConfig(str(tmp_path / "corpus")))
            readahead = ReadAhead(session, dataset, tree.order, tree.positions,
                                  ReadAheadConfig(window_bytes=1 << 30, first_window=1, ramp=1 << 24, files=12))
            readahead.start()
            try:
                handles = {int(i): Access() for i in tree.order}
                for position in (0, 1):  # by chance, at offset 0 of two files in walk order
                    readahead.on_read(int(tree.order[position]), handles[int(tree.order[position])], 0, 4096)
                await asyncio.sleep(0.2)
                assert readahead.plans_made == 0
                first = int(tree.order[1])
                for offset in (4096, 8192):  # by chance, adjacent reads of one file
                    readahead.on_read(first, handles[first], offset, 4096)
                deadline = time.monotonic() + 10
                while readahead.plans_made < 1:
                    assert time.monotonic() < deadline, "no stream started"
                    await asyncio.sleep(0.01)
                for n, position in enumerate(range(2, 2 + STRAYS)):  # then random offsets of the files after
                    index = int(tree.order[position])
                    readahead.on_read(index, handles[index], 16 * KiB * (3 + 2 * n), 4096)
                deadline = time.monotonic() + 10
                while session.engine._plans:
                    assert time.monotonic() < deadline, "the false start was never closed"
                    await asyncio.sleep(0.01)
                assert readahead.plans_made == 1  # never re-planned with a wider window
                await asyncio.sleep(0.3)
                later = [manifest.digest(int(i)) for i in tree.order[3:]]
                assert sum(cache.state(d) is BlobState.COMPLETE for d in later) <= 1
            finally:
                await readahead.close()
            assert session.engine._plans == []


async def test_readers_walking_a_few_files_apart_keep_their_stream(tmp_path):
    """Loader workers reading whole files in walk order, several at once (each a few files ahead of the
    others), follow one stream: it advances and widens, and is not closed as random access."""
    manifest = generate_corpus(tmp_path / "corpus", shards=24, tokens_per_shard=8_000, seed=4, block_size=16 * KiB)
    tree = Tree.from_manifest(manifest)
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=1 << 30)) as cache:
        session = EmbeddedSession(Engine(cache, FetchConfig(concurrency=4, durable=False)), owns_cache=False)
        async with session:
            dataset = await session.open_dataset(SourceConfig(str(tmp_path / "corpus")))
            readahead = ReadAhead(session, dataset, tree.order, tree.positions,
                                  ReadAheadConfig(window_bytes=1 << 30, first_window=1, ramp=2, files=24))
            readahead.start()
            try:
                def start_of(position: int, whole: bool = False) -> None:
                    index = int(tree.order[position])
                    readahead.on_read(index, Access(), 0, int(manifest.sizes[index]) if whole else 4096)

                start_of(0, whole=True)
                start_of(1)  # the walk is seen: a stream from here
                deadline = time.monotonic() + 10
                while readahead.plans_made < 1:
                    assert time.monotonic() < deadline, "no stream started"
                    await asyncio.sleep(0.01)
                for position in (7, 8, 9, 2, 3, 4, 5, 6, 12, 10):  # eight workers, out of step
                    start_of(position)
                    await asyncio.sleep(0.01)
                deadline = time.monotonic() + 10
                while readahead.plans_made < 2:
                    assert time.monotonic() < deadline, "the stream never widened"
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.2)
                assert len(session.engine._plans) == 1  # one stream, still open
            finally:
                await readahead.close()
            assert session.engine._plans == []
