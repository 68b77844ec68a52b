"""The cache does not trust its own disk: a verified block that changes on disk is never committed.

A partial file's recorded block is flipped on disk (as a rotting disk, or a
stray writer, would): the commit re-hashes the whole file, refuses it, forgets
the bad block and the engine fetches it again. The real case: ``stager stage``
SIGKILLed after some blocks are recorded, a byte flipped inside one of them,
``stager stage`` again.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from stager.cache import BlobState, CacheTier
from stager.config import CacheConfig
from stager.errors import CacheCorrupt
from stager.loopback.fault_plan import FaultPlan
from tests.cli.runner import run, start
from tests.engine.corpus import BLOCK, assert_cache_matches, make_corpus

from .blobs import config, make_blob


def flip_byte(path, offset: int) -> None:
    """Flip one bit of the byte at ``offset`` of the file at ``path``, in place (chmod'ing it writable)."""
    os.chmod(path, 0o644)
    fd = os.open(path, os.O_RDWR)
    try:
        byte = os.pread(fd, 1, offset)
        os.pwrite(fd, bytes([byte[0] ^ 0x10]), offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def test_commit_refuses_a_recorded_block_that_changed_on_disk(tmp_path):
    blob = make_blob(5 * 16 * 1024 + 100, block_size=16 * 1024, seed=3)
    with CacheTier(config(tmp_path / "cache", 1 << 20)) as tier:
        partial = tier.begin(blob.digest, blob.size, blob.block_size, blob.blocks)
        for index in range(blob.block_count):
            partial.write_block(index, blob.block(index))
        flip_byte(partial.path, 2 * blob.block_size + 7)  # inside recorded block 2
        with pytest.raises(CacheCorrupt) as caught:
            partial.commit()
        assert caught.value.blocks == (2,)
        assert tier.state(blob.digest) is BlobState.PARTIAL
        assert partial.missing_blocks() == [2] and tier.record(blob.digest).verified == {0, 1, 3, 4, 5}
        assert not tier.complete_path(blob.digest).exists()
        partial.write_block(2, blob.block(2))  # fetched again
        path = partial.commit()
        partial.close()
        assert path.read_bytes() == blob.data


def stage_args(url, cache):
    return ["stage", url, "--cache", str(cache), "--capacity", "200MB", "--concurrency", "2", "--no-hedge", "--json"]


def recorded_partial(cache_dir, manifest):
    """(shard index, partial file, a recorded block) of a partial blob with a recorded block, or None."""
    with CacheTier(CacheConfig(cache_dir, capacity=200 << 20), reconcile=False) as cache:
        for index in range(len(manifest)):
            record = cache.record(manifest.digest(index))
            if record is not None and record.state is BlobState.PARTIAL and record.verified:
                handle = cache.open_partial(manifest.digest(index))
                try:
                    return index, handle.path, min(record.verified)
                finally:
                    handle.close()
    return None


def test_stage_killed_then_a_recorded_block_rots_the_next_stage_refetches_it(http_origin, fault_proxy, tmp_path):
    manifest = make_corpus(http_origin.root / "corpus", shards=3, tokens=400_000)  # 800 KB, 13 blocks each
    proxy = fault_proxy(http_origin, FaultPlan(bandwidth_bps=400_000))  # ~6 s for everything
    url = f"{proxy.url}/corpus"
    cache_dir = tmp_path / "cache"
    proc = start(stage_args(url, cache_dir))
    found = None
    deadline = time.monotonic() + 30
    try:
        while found is None and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
            if cache_dir.joinpath("index.sqlite").exists():
                found = recorded_partial(cache_dir, manifest)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    assert found is not None, "no partial blob with a recorded block before the stage ended"
    index, partial_path, block = found
    flip_byte(partial_path, block * BLOCK + 11)
    served_before = len(http_origin.requests)

    result = run(stage_args(f"{http_origin.url}/corpus", cache_dir), timeout=120)

    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["failed"] == 0
    with CacheTier(CacheConfig(cache_dir, capacity=200 << 20)) as cache:
        assert_cache_matches(cache, manifest, http_origin.root / "corpus")  # the committed blob is the origin's
    # The rotted block itself was asked of the origin again.
    start_byte = block * BLOCK
    ranges = [r.range for r in http_origin.requests[served_before:]
              if r.method == "GET" and r.status == 206 and manifest.paths[index] in r.path]
    spans = [tuple(int(x) for x in r.removeprefix("bytes=").split("-")) for r in ranges]
    assert any(lo <= start_byte <= hi for lo, hi in spans), (block, spans)


async def test_a_block_read_from_a_complete_blob_that_changed_on_disk_is_fetched_again(http_origin, tmp_path):
    # Engine.read_block is how the daemon serves the mount's and other consumers' single blocks.
    from stager.config import FetchConfig, SourceConfig
    from stager.engine import Engine

    root = http_origin.root / "corpus"
    manifest = make_corpus(root, shards=1)
    origin = (root / manifest.paths[0]).read_bytes()
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 << 20)) as cache:
        async with Engine(cache, FetchConfig(concurrency=4, durable=False, hedge=False)) as engine:
            dataset = await engine.open_dataset(SourceConfig(f"{http_origin.url}/corpus"))
            ref = dataset.ref(0)
            path = await engine.ensure(ref)
            flip_byte(path, 2 * BLOCK + 5)
            served = len(http_origin.requests)
            assert await engine.read_block(ref, 2) == origin[2 * BLOCK:3 * BLOCK]
            assert engine.stats.verify_failures == 1
            assert len(http_origin.requests) > served  # fetched again, not served from the bad file
            assert cache.state(ref.digest) is not BlobState.COMPLETE or path.read_bytes() == origin
