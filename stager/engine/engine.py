"""The staging engine: plans in, verified blobs in the cache out.

One :class:`Engine` owns, for one process (or for the node, inside the
daemon): the cache tier, the datasets (store + manifest) it fetches from, the
plans of its consumers, the single-flight table of blob jobs, the priority
gate that bounds block requests in flight (its limit learned from the origin
by a :class:`~.concurrency.ConcurrencyController`, under ``concurrency``), the latency tracker for hedging,
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
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..cache import BlobState, CacheTier
from ..cache.reader import BlockReads
from ..config import FetchConfig, SourceConfig
from ..errors import CacheError, DiskFull
from ..hashing import block_range
from ..manifest import Manifest
from ..store import OriginStats
from .dataset import BlobRef, Dataset
from .concurrency import ConcurrencyController, memory_ceiling
from .disk_threads import DiskThreads
from .fetcher import BlobJob
from .gate import PriorityGate
from .hedging import LatencyTracker
from .plan import URGENT, Plan
from .stats import EngineStats

log = logging.getLogger(__name__)

class Engine:
    """Fetches blobs for plans into a cache tier. Use as ``async with Engine(cache) as engine``."""

    def __init__(self, cache: CacheTier, config: FetchConfig = FetchConfig()) -> None:
        self.cache = cache
        self.config = config
        self.origin_stats = OriginStats()
        self.concurrency = ConcurrencyController(
            memory_ceiling(config.concurrency, config.request_bytes), full_request=config.request_bytes,
            throttled=lambda: self.origin_stats.throttled)
        self.gate = PriorityGate(self.concurrency.limit, controller=self.concurrency)
        self.latency = LatencyTracker()
        self.stats = EngineStats(gauges=self._gauges)
        self._jobs: dict[str, BlobJob] = {}
        self._job_tasks: set[asyncio.Task] = set()  # also jobs that left the table and are closing their blob
        self._plans: list[Plan] = []
        self._datasets: dict[str, Dataset] = {}
        self._disk = DiskThreads(min(8, max(2, config.concurrency // 2)), "stager-disk")
        self.lock_waiters = ThreadPoolExecutor(max_workers=8, thread_name_prefix="stager-lock")
        self._block_listeners: list[Callable[[BlobRef, int], None]] = [self._count_for_concurrency]
        self._closed = False
        self._room = asyncio.Event()  # set whenever room may have been made: a job ended, a plan moved on
        self._reads = BlockReads(cache.complete_path, lambda: cache, on_corrupt=self._read_back_corrupt)

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
            try:
                await self.in_disk_thread(self.cache.register_dataset, dataset.name,
                                          [(m.digest(i), int(m.sizes[i])) for i in range(len(m))])
            except DiskFull as exc:  # only `stager status` needs it: the staging itself says if the disk is full
                log.info("%s: not registered with the cache for `stager status`: %s", dataset.name, exc)
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
        return await asyncio.shield(self._job(ref).want_all(priority))

    async def read_block(self, ref: BlobRef, block: int, *, priority: float = URGENT) -> bytes:
        """The verified bytes of block ``block`` of ``ref``; if the cache lacks it, that block alone is
        fetched (at ``priority``, urgent by default) and returned as soon as it is verified.

        Shares the blob's single flight with ``ensure`` and plans: a block already being fetched is
        not fetched again, only moved up the queue. The blob stays partial unless someone wants it whole.

        Raises:
            ValueError: ``block`` is out of range.
            OriginError: it could not be fetched within the retry budget.
            CacheError: the cache cannot hold the blob, or it kept being evicted under the reader.
        """
        if not 0 <= block < len(ref.blocks):
            raise ValueError(f"{ref.path}: block {block} out of range (it has {len(ref.blocks)})")
        start, end = block_range(block, ref.size, ref.block_size)

        async def fetch() -> bytes | None:  # None: it was verified already, to be read back from the cache
            began = time.monotonic()
            try:
                return await asyncio.shield(self._job(ref).want(block, priority))
            finally:
                self.stats.consumer_wait_seconds += time.monotonic() - began
                self.stats.consumer_waits += 1

        return await self._reads.read(ref.digest, block, start, end, ref.blocks[block], fetch, self.in_disk_thread,
                                      what=f"{ref.path}: block {block} (cache {self.cache.directory})")

    def _read_back_corrupt(self, digest: str) -> None:
        self.stats.verify_failures += 1  # changed on the disk since it was verified: dropped, fetched again

    def _job(self, ref: BlobRef) -> BlobJob:
        """The blob's single flight in this process (started on first use; it ends when served)."""
        job = self._jobs.get(ref.digest)
        if job is None:
            job = BlobJob(self, ref)
            self._jobs[ref.digest] = job
            job.task = asyncio.create_task(job.run(), name=f"fetch {ref.path}")
            self._job_tasks.add(job.task)
            job.task.add_done_callback(functools.partial(self._job_done, ref.digest))
        return job

    def _job_done(self, digest: str, task: asyncio.Task) -> None:
        self._room.set()
        self._job_tasks.discard(task)
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
            self._room.set()

    async def wait_for_room(self, timeout: float) -> None:
        """Return once a fetch ends or a consumer moves on (either may free cache room), or after ``timeout``."""
        self._room.clear()
        try:
            async with asyncio.timeout(timeout):
                await self._room.wait()
        except TimeoutError:
            pass

    def _mark_consumed(self, digests: list[str], token: str) -> None:
        for digest in digests:
            self.cache.mark_consumed(digest, token)

    # -- plumbing ------------------------------------------------------------

    def _count_for_concurrency(self, _ref: BlobRef, nbytes: int) -> None:
        """Throughput (and slow start's growth) as the verified bytes arrive."""
        gate = self.gate
        gate.set_limit(self.concurrency.count_bytes(nbytes, gate.holders >= gate.limit or gate.waiting > 0))

    def _gauges(self) -> dict[str, float]:
        return {"concurrency": self.gate.limit, "concurrency_peak": self.concurrency.peak,
                "concurrency_ceiling": self.concurrency.ceiling, "requests_in_flight": self.gate.holders,
                "throughput_bps": self.concurrency.throughput_bps,
                "throttle_backoffs": self.concurrency.throttle_cuts}

    async def in_disk_thread(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run blocking cache work (pwrite, fsync, sqlite) off the event loop."""
        return await self.start_in_disk_thread(fn, *args, **kwargs)

    def start_in_disk_thread(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
        """Start blocking cache work off the event loop; its future is done once the thread is.

        Await it through :func:`asyncio.shield` (or not at all) when the caller may be
        cancelled: cancelling this future would not stop the thread, only hide when it ends.
        """
        return self._disk.start(fn, *args, **kwargs)

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
        tasks = list(self._job_tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for dataset in self._datasets.values():
            await dataset.close()
        self._disk.shutdown()
        self.lock_waiters.shutdown(wait=False, cancel_futures=True)
