"""What ``stager stage`` does once the engine's modules are loaded (see :mod:`.stage` for why apart)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np

from ..cache import BlobState, CacheTier
from ..config import CacheConfig, SourceConfig
from ..errors import BlobTooLarge, CacheFull, DiskFull, StagerError
from ..hashing import block_range
from ..manifest import Manifest
from ..progress import byte_progress
from ..session import EmbeddedSession, RemoteSession, Session, open_session

#: The most shards whose arrival a staging run waits for at once, in order (fewer at a low concurrency
#: ceiling: twice the ceiling). The plan's prefetcher does the fetching, as many shards at once as the
#: adaptive limit allows; these waiters count what arrives and fetch a shard themselves only where the
#: prefetcher's attempt failed. Twice the default ceiling of them (512) each began a blob hundreds of
#: shards ahead of the prefetcher, with its lock, its partial file open and allocated, and its index
#: row, all queued at the gate, which every request then scanned.
WAITERS = 32

__all__ = ["open_session", "stage"]


async def stage(source: SourceConfig, session: Session, cache_cfg: CacheConfig, limit: int | None, concurrency: int,
                *, manifest: Manifest | None = None) -> dict:
    """Stage the first shards of ``source`` up to ``limit`` bytes (all without), return the run's summary.

    ``manifest``: the dataset's, already loaded and verified (else the session loads it).
    """
    began = time.monotonic()
    async with session:
        cache, owned = _cache_of(session, cache_cfg)
        try:
            dataset = await session.open_dataset(source, manifest)
            capacity = await _capacity(session, cache)
            m = dataset.manifest
            sizes = m.sizes
            count = len(m)
            if limit is not None:
                count = int((sizes.cumsum() <= limit).sum()) if count else 0
            total = int(sizes[:count].sum())
            unit = cache.allocation_unit  # the cache charges each blob in whole units: count as it does
            charged = int((-(-sizes[:count] // unit) * unit).sum())
            if count and cache.charge(int(sizes[:count].max())) > capacity:
                big = int(sizes[:count].argmax())
                raise BlobTooLarge(f"{m.paths[big]}: {int(sizes[big]):,} bytes is larger than the cache capacity "
                                   f"{capacity:,}")
            if charged > capacity:
                what = f"{total:,} bytes" + (f" ({charged:,} in the cache's {unit:,}-byte units)"
                                             if charged != total else "")
                if capacity < cache.configured_capacity:  # the disk, not the capacity, is short
                    raise DiskFull(f"{dataset.url}: {what} do not fit: the disk holding the cache at "
                                   f"{cache.directory} has room for {capacity:,} (capacity "
                                   f"{cache.configured_capacity:,}); stage a part with --limit or free space")
                raise CacheFull(f"{dataset.url}: {what} do not fit in the cache capacity {capacity:,}; "
                                "stage a part with --limit or raise --capacity")
            cached_of = _cached_bytes(cache, m, count)
        finally:
            if owned:
                cache.close()
        cached = sum(cached_of)
        before = await _counters(session)
        failures: list[BaseException] = []
        with byte_progress("staging") as progress:
            progress.set_total(count, total)
            progress.advance(cached)
            by_blocks = isinstance(session, EmbeddedSession)
            if by_blocks:
                session.engine.add_block_listener(lambda ref, n: progress.advance(n))
            plan = await session.plan(dataset, np.arange(count, dtype=np.int64), window_bytes=max(total, 1),
                                      name="stage")
            jobs = asyncio.Semaphore(max(4, min(WAITERS, concurrency * 2)))
            arrived = 0  # bytes of the requested shards that were not in the cache when we started

            async def one(i: int) -> None:
                nonlocal arrived
                try:
                    await plan.ready(i, urgent=False)  # in order: blobs complete (and commit) one by one
                    arrived += int(sizes[i]) - cached_of[i]
                    if not by_blocks:
                        progress.advance(int(sizes[i]) - cached_of[i])
                except StagerError as exc:
                    failures.append(exc)
                    progress.describe(f"{count} files, {len(failures)} failed")
                finally:
                    jobs.release()

            async def describe_retries() -> None:
                while True:
                    await asyncio.sleep(1.0)
                    counters = await _counters(session)
                    now = _delta(before, counters)
                    progress.describe(f"{count} files, {counters['in_flight']} requests in flight "
                                      f"(limit {counters['concurrency']}), {now['retries']} retries"
                                      + (f", {len(failures)} failed" if failures else ""))

            ticker = asyncio.create_task(describe_retries())
            try:
                async with asyncio.TaskGroup() as tg:
                    for i in range(count):  # a bounded number of tasks alive, even for a million shards
                        await jobs.acquire()
                        tg.create_task(one(i))
            finally:
                ticker.cancel()
                await plan.close()
        seconds = time.monotonic() - began
        after = await _counters(session)
        done = _delta(before, after)
        if done["mode"] == "daemon":
            # The daemon's byte counter covers every consumer of the node: count what this run brought in.
            # (Its retry, hedge and corrupt-block counts over the run are node-wide too.)
            done["fetched"] = arrived
        return {
            "source": dataset.url,
            "blobs": count,
            "bytes": total,
            "fetched_bytes": done["fetched"],
            "cached_bytes": cached,
            "retries": done["retries"],
            "hedged": done["hedged"],
            "verify_failures": done["verify_failures"],
            "concurrency_peak": after["concurrency_peak"],  # the adaptive limit's highest (node-wide with a daemon)
            "failed": len(failures),
            "first_error": str(failures[0]) if failures else None,
            "seconds": round(seconds, 3),
            "mb_per_s": done["fetched"] / 1e6 / seconds if seconds > 0 else 0.0,
        }


def _cache_of(session: Session, config: CacheConfig) -> tuple[CacheTier, bool]:
    """The cache to read records from: the session's own, or (the daemon's) opened read-only here."""
    if isinstance(session, EmbeddedSession):
        return session.engine.cache, False
    return CacheTier(config, reconcile=False), True


async def _capacity(session: Session, cache: CacheTier) -> int:
    if isinstance(session, RemoteSession) and session.mode == "daemon":
        try:
            return int((await session.daemon_status())["cache"]["capacity"])
        except StagerError:
            pass  # gone already: the fallback engine uses our own capacity
    return cache.capacity


def _cached_bytes(cache: CacheTier, m, count: int) -> list[int]:
    """The bytes of each of the first ``count`` shards already in the cache (verified): the blob's size
    when complete, its verified blocks' when partial. The index is asked for the states of all of them
    at once; a dataset of 100,000 shards took a query or two each, seconds before the first request."""
    digests = [m.digest(i) for i in range(count)]
    states = cache.states(digests)
    sizes = m.sizes
    cached = [0] * count
    for i, digest in enumerate(digests):
        state = states.get(digest)
        if state is BlobState.COMPLETE:
            cached[i] = int(sizes[i])
        elif state is BlobState.PARTIAL:
            record = cache.record(digest)  # gone meanwhile: nothing cached
            if record is not None:
                size = int(sizes[i])
                cached[i] = size if record.state is BlobState.COMPLETE else sum(
                    end - start for start, end in (block_range(b, size, m.block_size) for b in record.verified))
    return cached


async def _counters(session: Session) -> dict[str, Any]:
    """What the engine doing the work counted so far (the daemon's counters cover all its consumers)."""
    if isinstance(session, RemoteSession) and session.mode == "daemon":
        try:
            status = await session.daemon_status()
            e, o = status["engine"], status["origin"]
            return {"mode": "daemon", "fetched": int(e["bytes_fetched"]), "retries": int(o["retries"]),
                    "hedged": int(e["hedged_requests"]), "verify_failures": int(e["verify_failures"]),
                    "in_flight": int(e.get("requests_in_flight", 0)), "concurrency": int(e.get("concurrency", 0)),
                    "concurrency_peak": int(e.get("concurrency_peak", 0))}
        except StagerError:
            pass
    stats = session.stats()
    return {"mode": "embedded", "fetched": int(stats.get("bytes_fetched", 0)),
            "retries": int(stats.get("origin_retries", 0)), "hedged": int(stats.get("hedged_requests", 0)),
            "verify_failures": int(stats.get("verify_failures", 0)),
            "in_flight": int(stats.get("requests_in_flight", 0)), "concurrency": int(stats.get("concurrency", 0)),
            "concurrency_peak": int(stats.get("concurrency_peak", 0))}


def _delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    keys = ("fetched", "retries", "hedged", "verify_failures")
    if before["mode"] != after["mode"]:  # the daemon went away mid-run: count what the fallback engine did
        return {"mode": "embedded", **{k: after[k] for k in keys}}
    return {"mode": after["mode"], **{k: after[k] - before[k] for k in keys}}

