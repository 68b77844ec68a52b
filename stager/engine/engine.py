"""The staging engine: plans in, verified blobs in the cache out.

One :class:`Engine` owns, for one process (or for the node, inside the
daemon): the cache tier, the datasets (store + manifest) it fetches from, the
plans of its consumers, the single-flight table of blob jobs, the priority
gate that bounds block requests in flight (its limit learned from the origin
by a :class:`~.concurrency.ConcurrencyController`, under ``concurrency``), the latency tracker for hedging,
the sources a blob's bytes may come from (:mod:`.source`: the origin unless told otherwise),
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
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..aio import AsyncClosing, wait_until_set
from ..cache import BlobState, CacheTier
from ..cache.reader import BlockReads
from ..config import FetchConfig, SourceConfig
from ..errors import CacheError, DiskFull
from ..hashing import block_range
from ..manifest import Manifest
from ..open_files import request_ceiling
from ..store import OriginStats
from ..store.held import held_bytes, paused_connections, receiving_requests
from .dataset import BlobRef, Dataset
from .concurrency import MEMORY_BUDGET, ConcurrencyController, MemoryBound
from .context import FetchContext
from .disk_threads import DiskThreads
from .job import BlobJob
from .gate import PriorityGate
from .hedging import LatencyTracker
from .plan import URGENT, Plan
from .read_ahead import DEFAULT_AHEAD_SECONDS
from .source import BlobSources, OriginOnly
from .stats import EngineStats

log = logging.getLogger(__name__)


def disk_thread_count(concurrency: int, *, waits_for_device: bool) -> int:
    """Threads for the cache's writes, records and commits.

    A write that waits for the device (``O_DIRECT``, or fdatasync with ``durable``) leaves its
    core idle: more threads keep the device's queue full, up to one for two requests in flight.
    A write into the page cache is a copy, CPU work: threads beyond the cores this process may
    run on only take turns at the interpreter's lock, with a wake-up and a context switch at
    each turn (on two cores, eight threads against two cost up to 0.7 CPU s more kernel time
    per GiB behind a latency-shaped origin, and 10 to 30% more wall time on 2,000 small blobs).
    """
    threads = min(8, max(2, concurrency // 2))
    if not waits_for_device:
        threads = min(threads, max(2, len(os.sched_getaffinity(0))))
    return threads


class Engine(AsyncClosing):
    """Fetches blobs for plans into a cache tier. Use as ``async with Engine(cache) as engine``."""

    def __init__(self, cache: CacheTier, config: FetchConfig = FetchConfig(), *,
                 sources: BlobSources | None = None) -> None:
        self.cache = cache
        self.config = config
        self.origin_stats = OriginStats()
        ceiling = request_ceiling(config.concurrency, descriptors_per_blob=2 if cache.config.direct_writes else 1)
        self.concurrency = ConcurrencyController(
            ceiling, full_request=config.request_bytes, throttled=lambda: self.origin_stats.throttled,
            memory=MemoryBound(MEMORY_BUDGET, held_bytes, receiving_requests, paused_connections))
        self.gate = PriorityGate(self.concurrency.initial, controller=self.concurrency)
        self.stats = EngineStats(gauges=self._gauges)
        self._block_listeners: list[Callable[[BlobRef, int], None]] = [self._count_for_concurrency]
        #: What the engine's jobs, plans and span fetches are given of it.
        self.context = FetchContext(
            cache=cache, config=config, gate=self.gate, stats=self.stats, latency=LatencyTracker(),
            sources=sources if sources is not None else OriginOnly(),
            disk=DiskThreads(disk_thread_count(config.concurrency, waits_for_device=config.durable
                                               or cache.config.direct_writes), "stager-disk"),
            lock_waiters=ThreadPoolExecutor(max_workers=8, thread_name_prefix="stager-lock"),
            block_fetched=self.on_block_fetched, eviction_rank=self.eviction_rank,
            protected_digests=self.protected_digests)
        self._jobs = self.context.jobs
        self._job_tasks: set[asyncio.Task] = set()  # also jobs that left the table and are closing their blob
        self._plans: list[Plan] = []
        self._datasets: dict[str, Dataset] = {}
        self._closed = False
        self._room = asyncio.Event()  # set whenever room may have been made: a job ended, a plan moved on
        self._reads = BlockReads(cache.complete_path, lambda: cache, on_corrupt=self._read_back_corrupt)

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
             window_bytes: int | None = None, floor_bytes: int | None = None, ahead_seconds: float | None = None,
             name: str | None = None, start: bool = True, clock: Callable[[], float] | None = None) -> Plan:
        """Register a consumer's future reads; its prefetcher starts at once unless ``start`` is false.

        Args:
            window_bytes: the most staged ahead of the cursor (default: the fetch window; at most half
                the cache).
            floor_bytes: staged ahead of the cursor whatever the consumer's rate; None (a consumer that
                does not say, or one of an earlier version through the daemon): the whole window, as
                before read-ahead was measured in time. Only a plan that names its floor (0 is one) is
                bounded by time.
            ahead_seconds: seconds of the consumer's measured rate staged past the floor (default: the
                fetch settings', else DEFAULT_AHEAD_SECONDS).
            clock: the time base of the consumer's rate (tests pass their own).

        Raises:
            StagerError: an order outside the manifest, or a bound that is not positive.
        """
        window = window_bytes or self.config.window_bytes
        window = min(window, max(1, self.cache.capacity // 2))  # leave room to stream through a small cache
        seconds = ahead_seconds if ahead_seconds is not None else self.config.ahead_seconds or DEFAULT_AHEAD_SECONDS
        plan = Plan(self.context, self, dataset, order, window, name or f"plan-{len(self._plans)}",
                    floor_bytes=window if floor_bytes is None else floor_bytes, ahead_seconds=seconds,
                    clock=clock or time.monotonic)
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
            job = BlobJob(self.context, ref)
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

    def protected_digests(self) -> "Protected":
        """Blobs that must not be evicted now: inside a plan's window, or being fetched (a snapshot)."""
        return Protected(frozenset(self._jobs), tuple(plan.window_digests() for plan in self._plans))

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
            self.context.disk.submit(self._mark_consumed, digests, token)
            self._room.set()

    async def wait_for_room(self, timeout: float) -> None:
        """Return once a fetch ends or a consumer moves on (either may free cache room), or after ``timeout``."""
        self._room.clear()
        await wait_until_set(self._room, timeout)

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
        return await self.context.in_disk_thread(fn, *args, **kwargs)

    def start_in_disk_thread(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
        """Start blocking cache work off the event loop; its future is done once the thread is.

        Await it through :func:`asyncio.shield` (or not at all) when the caller may be
        cancelled: cancelling this future would not stop the thread, only hide when it ends.
        """
        return self.context.start_in_disk_thread(fn, *args, **kwargs)

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
        self.context.disk.shutdown()
        self.context.lock_waiters.shutdown(wait=False, cancel_futures=True)


class Protected:
    """A snapshot of the digests an engine protects from eviction: its jobs' and its plans' windows.

    Taken for every blob's reservation of room, which looks into it only when it must evict: the
    sets are the engine's own (each plan's made once per window), not copied into one.
    """

    __slots__ = ("_sets",)

    def __init__(self, jobs: frozenset[str], windows: tuple[frozenset[str], ...]) -> None:
        self._sets = (jobs, *windows)

    def __contains__(self, digest: object) -> bool:
        return any(digest in digests for digests in self._sets)

    def __iter__(self) -> Iterator[str]:
        return iter(frozenset().union(*self._sets))
