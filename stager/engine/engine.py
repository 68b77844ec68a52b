"""The staging engine: plans in, verified blobs in the cache out.

One :class:`Engine` owns, for one process (or for the node, inside the
daemon): the cache tier, the datasets (store + manifest) it fetches from, the
plans of its consumers, the single-flight table of blob jobs, the priority
gate that bounds block requests in flight, the latency tracker for hedging,
and two small thread pools (disk writes and sqlite; waits on other processes'
blob locks) so the event loop never blocks on the disk.

Eviction asks the engine which blobs are safe to drop: blobs inside any
plan's window or being fetched are protected, and the rest are ranked by
how far away their next use is in the active plans (never needed again this
epoch ranks highest), so a dataset larger than the cache streams through it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..cache import BlobState, CacheTier
from ..config import FetchConfig, SourceConfig
from ..manifest import Manifest
from ..store import OriginStats
from .dataset import BlobRef, Dataset
from .fetcher import BlobJob
from .gate import PriorityGate
from .hedging import LatencyTracker
from .plan import Plan
from .stats import EngineStats

log = logging.getLogger(__name__)


class Engine:
    """Fetches blobs for plans into a cache tier. Use as ``async with Engine(cache) as engine``."""

    def __init__(self, cache: CacheTier, config: FetchConfig = FetchConfig()) -> None:
        self.cache = cache
        self.config = config
        self.gate = PriorityGate(config.concurrency)
        self.latency = LatencyTracker()
        self.stats = EngineStats()
        self.origin_stats = OriginStats()
        self._jobs: dict[str, BlobJob] = {}
        self._plans: list[Plan] = []
        self._datasets: dict[str, Dataset] = {}
        self._disk = ThreadPoolExecutor(max_workers=min(8, max(2, config.concurrency // 2)), thread_name_prefix="stager-disk")
        self.lock_waiters = ThreadPoolExecutor(max_workers=8, thread_name_prefix="stager-lock")
        self._block_listeners: list[Callable[[BlobRef, int], None]] = []
        self._closed = False

    async def __aenter__(self) -> "Engine":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # -- datasets and plans -------------------------------------------------

    async def open_dataset(self, source: SourceConfig, manifest: Manifest | None = None) -> Dataset:
        """Open (once per URL) the dataset at ``source`` and register its blobs with the cache."""
        key = source.url
        if key not in self._datasets:
            dataset = await Dataset.open(source, self.config, self.origin_stats, manifest)
            m = dataset.manifest
            await self.in_disk_thread(self.cache.register_dataset, dataset.name,
                                      [(m.digest(i), int(m.sizes[i])) for i in range(len(m))])
            self._datasets[key] = dataset
        return self._datasets[key]

    def plan(self, dataset: Dataset, order: Sequence[int] | np.ndarray | None = None, *,
             window_bytes: int | None = None, name: str | None = None, start: bool = True) -> Plan:
        """Register a consumer's future reads; its prefetcher starts at once unless ``start`` is false."""
        window = window_bytes or self.config.window_bytes
        window = min(window, max(1, self.cache.capacity // 2))  # leave room to stream through a small cache
        plan = Plan(self, dataset, order, window, name or f"plan-{len(self._plans)}")
        self._plans.append(plan)
        if start:
            plan.start()
        return plan

    def forget_plan(self, plan: Plan) -> None:
        if plan in self._plans:
            self._plans.remove(plan)

    # -- blobs ---------------------------------------------------------------

    async def ensure(self, ref: BlobRef, *, priority: float = 0.0) -> Path:
        """Bring ``ref`` into the cache (one fetch however many ask) and return its complete path.

        Raises:
            OriginError: it could not be fetched within the retry budget.
            CacheError: the cache cannot hold it (BlobTooLarge, CacheFull).
        """
        job = self._jobs.get(ref.digest)
        if job is None:
            job = BlobJob(self, ref, priority)
            job.task = asyncio.create_task(job.run(), name=f"fetch {ref.path}")
            self._jobs[ref.digest] = job
            job.task.add_done_callback(functools.partial(self._job_done, ref.digest))
        else:
            job.boost(priority)
        assert job.task is not None
        return await asyncio.shield(job.task)

    def _job_done(self, digest: str, task: asyncio.Task) -> None:
        if self._jobs.get(digest) is not None and self._jobs[digest].task is task:
            del self._jobs[digest]
        if not task.cancelled():
            task.exception()  # retrieved here so an unawaited failure is not logged as lost

    def state(self, ref: BlobRef) -> BlobState:
        return self.cache.state(ref.digest)

    # -- eviction policy -----------------------------------------------------

    def protected_digests(self) -> frozenset[str]:
        """Blobs that must not be evicted now: inside a plan's window, or being fetched."""
        digests: set[str] = set(self._jobs)
        for plan in self._plans:
            digests |= plan.window_digests()
        return frozenset(digests)

    def eviction_rank(self, digest: str) -> float:
        """Higher is evicted first: the distance to the blob's next use in any plan (inf: none)."""
        nearest = math.inf
        for plan in self._plans:
            distance = plan.next_use(digest)
            if distance is not None:
                nearest = min(nearest, float(distance))
        return nearest

    def mark_consumed(self, digests: list[str], token: str) -> None:
        """Tell the cache a consumer is done with these blobs for this round (eviction takes them first)."""
        if digests:
            self._disk.submit(self._mark_consumed, digests, token)

    def _mark_consumed(self, digests: list[str], token: str) -> None:
        for digest in digests:
            self.cache.mark_consumed(digest, token)

    # -- plumbing ------------------------------------------------------------

    async def in_disk_thread(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run blocking cache work (pwrite, fsync, sqlite) off the event loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._disk, functools.partial(fn, *args, **kwargs))

    def add_block_listener(self, listener: Callable[[BlobRef, int], None]) -> None:
        """Call ``listener(ref, nbytes)`` for every verified block written (progress bars, metrics)."""
        self._block_listeners.append(listener)

    def on_block_fetched(self, ref: BlobRef, nbytes: int) -> None:
        for listener in self._block_listeners:
            listener(ref, nbytes)

    async def close(self) -> None:
        """Stop prefetching, cancel fetches in flight (their verified blocks stay), close stores."""
        if self._closed:
            return
        self._closed = True
        for plan in list(self._plans):
            await plan.close()
        tasks = [job.task for job in self._jobs.values() if job.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for dataset in self._datasets.values():
            await dataset.close()
        self._disk.shutdown(wait=True)
        self.lock_waiters.shutdown(wait=False, cancel_futures=True)
