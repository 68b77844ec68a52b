"""Fetching one blob into the cache: lock, resume, parallel verified blocks, commit.

A :class:`BlobJob` is the single flight for one blob in this process (the
engine keeps one per digest and every waiter shares it). Across processes
that share the cache directory, the cache's per-blob file lock plays the same
role: the job takes it first, and a job that finds it held waits for the other
process, then finds the blob complete (or resumes what that process left).

Blocks are fetched in parallel as ranged reads through the engine's priority
gate, each one hashed and checked against the manifest inside the store's
retry loop (a corrupted or short body is retried, never written), raced by a
hedged request when it straggles, then written with pwrite and recorded as
verified by the cache. Blocks a previous run already verified are not fetched
again. When every block is verified the partial file is committed by rename.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..cache import BlobState
from ..errors import CorruptData
from ..hashing import block_digest, block_range
from .hedging import hedged

if TYPE_CHECKING:
    from .dataset import BlobRef
    from .engine import Engine

log = logging.getLogger(__name__)

FOREIGN_LOCK_POLL = 0.25  # seconds per blocking try on another process's blob lock


class BlobJob:
    """Brings one blob to COMPLETE in the cache, once, however many wait for it."""

    def __init__(self, engine: "Engine", ref: "BlobRef", priority: float) -> None:
        self.engine = engine
        self.ref = ref
        self.priority = priority
        self.task: asyncio.Task[Path] | None = None

    def boost(self, priority: float) -> None:
        """A consumer now waits for this blob: let its queued blocks go first."""
        if priority < self.priority:
            self.priority = priority
            self.engine.gate.boost(self, priority)

    async def run(self) -> Path:
        engine, ref = self.engine, self.ref
        cache = engine.cache
        if cache.state(ref.digest) is BlobState.COMPLETE:
            engine.stats.blobs_already_cached += 1
            return cache.complete_path(ref.digest)
        lock = cache.lock(ref.digest)
        if not lock.try_lock():
            await self._wait_foreign_lock(lock)
            if cache.state(ref.digest) is BlobState.COMPLETE:
                lock.release()
                engine.stats.blobs_from_other_process += 1
                return cache.complete_path(ref.digest)
        try:
            return await self._fetch_locked()
        finally:
            lock.release()

    async def _wait_foreign_lock(self, lock) -> None:
        # flock has no async wake-up: wait in a thread, in short tries so cancellation is prompt.
        loop = asyncio.get_running_loop()
        while not await loop.run_in_executor(self.engine.lock_waiters, lock.acquire, FOREIGN_LOCK_POLL):
            pass

    async def _fetch_locked(self) -> Path:
        engine, ref = self.engine, self.ref
        cache = engine.cache
        if cache.state(ref.digest) is BlobState.COMPLETE:
            engine.stats.blobs_from_other_process += 1
            return cache.complete_path(ref.digest)
        partial = await engine.in_disk_thread(
            cache.begin, ref.digest, ref.size, ref.block_size, ref.blocks,
            rank=engine.eviction_rank, protect=engine.protected_digests())
        try:
            missing = partial.missing_blocks()
            if missing:
                async with asyncio.TaskGroup() as tg:
                    for index in missing:
                        tg.create_task(self._fetch_block(partial, index))
            await engine.in_disk_thread(partial.commit)
        except BaseException:
            await engine.in_disk_thread(partial.close)
            raise
        engine.stats.blobs_completed += 1
        return cache.complete_path(ref.digest)

    async def _fetch_block(self, partial, index: int) -> None:
        engine, ref = self.engine, self.ref
        start, end = block_range(index, ref.size, ref.block_size)
        expected = ref.blocks[index]

        def check(data: bytes) -> None:
            if block_digest(data) != expected:
                engine.stats.verify_failures += 1
                raise CorruptData(f"{ref.dataset.name}/{ref.path}: block {index} (bytes {start}-{end}) "
                                  "does not match the manifest digest")

        def read():
            return ref.dataset.store.read_range(ref.path, start, end, check=check)

        def count_hedge() -> None:
            engine.stats.hedged_requests += 1

        config = engine.config
        async with engine.gate.slot(self.priority + index * 1e-6, owner=self):
            delay = engine.latency.hedge_delay(end - start, config.hedge_factor, config.hedge_min_delay) \
                if config.hedge else None
            began = time.monotonic()
            data, hedge_won = await hedged(read, delay, count_hedge)
            engine.latency.record(time.monotonic() - began, end - start)
            if hedge_won:
                engine.stats.hedges_won += 1
            # The write stays inside the slot: in-flight memory is bounded by concurrency x block size.
            await engine.in_disk_thread(partial.write_block, index, data, durable=config.durable)
        engine.stats.bytes_fetched += len(data)
        engine.stats.blocks_fetched += 1
        engine.on_block_fetched(ref, len(data))
