"""The blob-source seam: a second source before the origin, and the fallback to the next for what is left."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from stager.cache import CacheTier
from stager.config import CacheConfig, FetchConfig, RetryConfig, SourceConfig
from stager.engine import URGENT, Engine
from stager.engine.source import BlobSource, OriginSource
from stager.errors import PeerError
from stager.store import LocalStore, RangeSink, StoreOptions

from .corpus import BLOCK, assert_cache_matches, make_corpus

FAST_RETRY = RetryConfig(attempts=50, backoff_base=0.01, backoff_max=0.1, deadline=30, request_timeout=5)


def fetch_config(**kw) -> FetchConfig:
    return FetchConfig(**{"concurrency": 8, "retry": FAST_RETRY, "durable": False, "hedge": False, **kw})


class StoreSource(BlobSource):
    """A second copy of the dataset in a local store (standing where a peer will stand)."""

    def __init__(self, root: Path) -> None:
        self.store = LocalStore(str(root), options=StoreOptions(retry=FAST_RETRY))
        self.name = f"copy at {root.name}"
        self.reads = 0

    async def read_into(self, ref, start, end, open_sink) -> None:
        self.reads += 1
        await self.store.read_range_into(ref.path, start, end, open_sink)

    async def read(self, ref, start, end, *, check=None) -> bytes:
        return await self.store.read_range(ref.path, start, end, check=check)


class CutShort(StoreSource):
    """Sends the first ``blocks`` blocks of each range, then fails as a dead peer does."""

    def __init__(self, root: Path, blocks: int) -> None:
        super().__init__(root)
        self.blocks = blocks

    async def read_into(self, ref, start, end, open_sink) -> None:
        self.reads += 1
        data = await self.store.read_range(ref.path, start, end)
        sink: RangeSink = open_sink()
        try:
            await sink.write(data[:self.blocks * BLOCK])
            raise PeerError(f"{self.name}: connection lost")
        except BaseException:
            await sink.abort()
            raise


class Silent(StoreSource):
    """Never answers: the engine's timeout for the source moves on."""

    timeout = 0.2

    async def read_into(self, ref, start, end, open_sink) -> None:
        self.reads += 1
        await asyncio.Event().wait()


class Sources:
    def __init__(self, *first: BlobSource) -> None:
        self.sources = (*first, OriginSource())

    def for_blob(self, ref):
        return self.sources


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


async def stage(peer: BlobSource | None, proxy, root: Path, manifest, cache_dir: Path) -> tuple[dict, int]:
    """Every shard staged through ``proxy`` with ``peer`` before the origin (none: the origin alone),
    checked byte for byte: the engine's counters, and the bytes the origin sent meanwhile."""
    with CacheTier(CacheConfig(cache_dir, capacity=64 << 20)) as cache:
        async with Engine(cache, fetch_config(), sources=None if peer is None else Sources(peer)) as engine:
            dataset = await engine.open_dataset(SourceConfig(f"{proxy.url}/corpus"))
            before = proxy.bytes_forwarded
            await asyncio.wait_for(asyncio.gather(*(engine.ensure(dataset.ref(i)) for i in range(len(manifest)))), 30)
            assert_cache_matches(cache, manifest, root)
            return engine.stats.as_dict(), proxy.bytes_forwarded - before


async def test_a_source_serving_flipped_bytes_is_skipped_for_the_blocks_it_did_not_verify(http_origin, fault_proxy,
                                                                                          tmp_path):
    root = http_origin.root / "corpus"
    manifest = make_corpus(root, shards=3)
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    bad = manifest.paths[1]
    flip(copy / bad, BLOCK + 7)  # block 1 of one shard rotted in the second copy
    peer = StoreSource(copy)
    total = sum(int(s) for s in manifest.sizes)
    stats, from_origin = await stage(peer, fault_proxy(http_origin), root, manifest, tmp_path / "cache")
    await peer.store.close()
    # block 0 of the bad shard came from the copy; its first bad attempt is retried within the
    # copy's budget, its second moves to the origin, which sends the blocks of that shard the copy
    # did not verify: block 1 and those after it, but for any the copy's attempts verified while the
    # check of block 1 was on its way (blocks are checked by the disk threads, behind the stream)
    rest = int(manifest.sizes[list(manifest.paths).index(bad)]) - BLOCK
    assert BLOCK <= from_origin <= rest and from_origin % BLOCK in (0, rest % BLOCK)  # whole blocks
    assert (stats["bytes_from_origin"], stats["bytes_from_peers"]) == (from_origin, total - from_origin)
    assert stats["bytes_fetched"] == total
    assert (stats["source_failures_peer"], stats["source_failures_origin"]) == (1, 0)
    assert stats["verify_failures"] == 2


async def test_a_source_that_fails_midway_leaves_the_remaining_blocks_to_the_origin(http_origin, fault_proxy,
                                                                                    tmp_path):
    root = http_origin.root / "corpus"
    manifest = make_corpus(root, shards=2)
    peer = CutShort(root, blocks=2)
    total = sum(int(s) for s in manifest.sizes)
    stats, from_origin = await stage(peer, fault_proxy(http_origin), root, manifest, tmp_path / "cache")
    await peer.store.close()
    from_peer = 2 * BLOCK * len(manifest)
    assert (stats["bytes_from_peers"], stats["bytes_from_origin"]) == (from_peer, total - from_peer)
    assert from_origin == total - from_peer  # the blocks verified from the peer are not asked again
    assert (peer.reads, stats["source_failures_peer"]) == (len(manifest), len(manifest))


class Rerouted:
    """Names ``first`` before the origin until it has failed; then ``then`` instead (as a ring without a
    peer found dead names a blob's new parent)."""

    def __init__(self, first: CutShort, then: BlobSource) -> None:
        self.first, self.then = first, then

    def for_blob(self, ref):
        if self.first.reads:
            return (self.then, OriginSource())
        return (self.first, OriginSource())


async def test_after_a_source_fails_the_sources_are_named_again_and_the_rest_comes_from_the_new_one(
        http_origin, fault_proxy, tmp_path):
    root = http_origin.root / "corpus"
    manifest = make_corpus(root, shards=1)
    dead, successor = CutShort(root, blocks=2), StoreSource(root)
    successor.name = "successor"  # sources are told apart by name
    proxy = fault_proxy(http_origin)
    total = int(manifest.sizes[0])
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20)) as cache:
        async with Engine(cache, fetch_config(), sources=Rerouted(dead, successor)) as engine:
            dataset = await engine.open_dataset(SourceConfig(f"{proxy.url}/corpus"))
            before = proxy.bytes_forwarded
            await asyncio.wait_for(engine.ensure(dataset.ref(0)), 30)
            assert_cache_matches(cache, manifest, root)
            stats, from_origin = engine.stats.as_dict(), proxy.bytes_forwarded - before
    await dead.store.close()
    await successor.store.close()
    assert from_origin == 0  # the blocks the dead source did not send came from its successor
    assert (stats["bytes_from_peers"], stats["bytes_from_origin"]) == (total, 0)
    assert (dead.reads, successor.reads, stats["source_failures_peer"]) == (1, 1, 1)


async def test_a_source_that_does_not_answer_times_out_to_the_origin_and_a_block_read_works_too(
        http_origin, fault_proxy, tmp_path):
    root = http_origin.root / "corpus"
    manifest = make_corpus(root, shards=1)
    proxy = fault_proxy(http_origin)
    peer = Silent(root)
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20)) as cache:
        async with Engine(cache, fetch_config(), sources=Sources(peer)) as engine:
            dataset = await engine.open_dataset(SourceConfig(f"{proxy.url}/corpus"))
            ref = dataset.ref(0)
            data = await asyncio.wait_for(engine.read_block(ref, 1), 10)
            assert data == (root / ref.path).read_bytes()[BLOCK:2 * BLOCK]
            await asyncio.wait_for(engine.ensure(ref), 10)
            assert_cache_matches(cache, manifest, root)
            stats = engine.stats.as_dict()
            assert (stats["bytes_from_origin"], stats["bytes_from_peers"]) == (ref.size, 0)
            assert stats["source_failures_peer"] == peer.reads >= 2
        await peer.store.close()


async def test_without_sources_every_byte_is_from_the_origin(http_origin, fault_proxy, tmp_path):
    root = http_origin.root / "corpus"
    manifest = make_corpus(root, shards=2)
    total = sum(int(s) for s in manifest.sizes)
    stats, from_origin = await stage(None, fault_proxy(http_origin), root, manifest, tmp_path / "cache")
    assert stats["bytes_from_origin"] == stats["bytes_fetched"] == from_origin == total
    assert (stats["bytes_from_peers"], stats["source_failures_peer"], stats["source_failures_origin"]) == (0, 0, 0)


class Staggered(Sources):
    """Sources that stagger a whole-blob fetch at block ``head`` (as a cluster node's children do)."""

    def __init__(self, head: int, *first: BlobSource) -> None:
        super().__init__(*first)
        self.head = head

    def first_block(self, ref, span_blocks):
        return self.head


class Recording(StoreSource):
    """Records each range asked for (in blocks); the ranges that start at ``hold_from`` or later wait for
    ``release``."""

    def __init__(self, root: Path, hold_from: int) -> None:
        super().__init__(root)
        self.hold_from = hold_from
        self.release = asyncio.Event()
        self.asked: list[tuple[int, int]] = []
        self.done: list[tuple[int, int]] = []

    async def read_into(self, ref, start, end, open_sink) -> None:
        blocks = (start // BLOCK, -(-end // BLOCK))
        self.asked.append(blocks)
        if blocks[0] >= self.hold_from:
            await self.release.wait()
        await super().read_into(ref, start, end, open_sink)
        self.done.append(blocks)


async def test_a_staggered_fetch_starts_at_its_block_takes_the_head_last_and_a_reader_never_waits(
        http_origin, fault_proxy, tmp_path):
    root = http_origin.root / "corpus"
    manifest = make_corpus(root, shards=1)
    peer = Recording(root, hold_from=2)
    proxy = fault_proxy(http_origin)
    n = len(manifest.block_digests(0))
    assert n >= 4
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20)) as cache:
        async with Engine(cache, fetch_config(), sources=Staggered(2, peer)) as engine:
            dataset = await engine.open_dataset(SourceConfig(f"{proxy.url}/corpus"))
            ref = dataset.ref(0)
            whole = asyncio.ensure_future(engine.ensure(ref))
            for _ in range(200):  # at most 2 s
                if peer.asked:
                    break
                await asyncio.sleep(0.01)
            assert peer.asked == [(2, n)]  # the staggered start; blocks 0 and 1 wait for the rest
            data = await asyncio.wait_for(engine.read_block(ref, 0), 10)  # a reader's block does not wait
            assert data == (root / ref.path).read_bytes()[:BLOCK]
            assert peer.asked == [(2, n), (0, 1)]
            peer.release.set()
            await asyncio.wait_for(whole, 10)
            assert_cache_matches(cache, manifest, root)
            assert peer.asked == [(2, n), (0, 1), (1, 2)] and peer.done[1:] == [(2, n), (1, 2)]
            stats = engine.stats.as_dict()
            assert (stats["bytes_from_peers"], stats["bytes_from_origin"]) == (ref.size, 0)
    await peer.store.close()


async def test_a_blob_a_consumer_is_blocked_on_is_not_staggered(http_origin, fault_proxy, tmp_path):
    root = http_origin.root / "corpus"
    manifest = make_corpus(root, shards=1)
    peer = Recording(root, hold_from=2)
    proxy = fault_proxy(http_origin)
    n = len(manifest.block_digests(0))
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20)) as cache:
        async with Engine(cache, fetch_config(), sources=Staggered(2, peer)) as engine:
            dataset = await engine.open_dataset(SourceConfig(f"{proxy.url}/corpus"))
            ref = dataset.ref(0)
            whole = asyncio.ensure_future(engine.ensure(ref, priority=URGENT))
            await asyncio.wait_for(whole, 10)
            assert peer.asked == [(0, n)]  # in order, in one request
            assert_cache_matches(cache, manifest, root)
    await peer.store.close()
