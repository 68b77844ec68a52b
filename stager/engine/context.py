"""What the engine's parts share: the one small object a blob job, a plan and a span fetch are given.

The engine builds one :class:`FetchContext` and hands it down, so its parts
use the gate, the counters, the disk threads, the settings, the single-flight
table, the latency tracker and the blob sources without holding the engine
itself (and none of them can reach the engine's plans or datasets).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ..cache import CacheTier
from ..config import FetchConfig
from .disk_threads import DiskThreads
from .gate import PriorityGate
from .hedging import LatencyTracker
from .source import BlobSources
from .stats import EngineStats

if TYPE_CHECKING:
    from .dataset import BlobRef
    from .job import BlobJob


@dataclass(frozen=True, slots=True, eq=False)
class FetchContext:
    """The engine's shared parts, as its blob jobs, plans and span fetches use them."""

    cache: CacheTier
    config: FetchConfig
    gate: PriorityGate
    stats: EngineStats
    latency: LatencyTracker
    sources: BlobSources
    disk: DiskThreads  # blocking cache work (pwrite, fsync, sqlite)
    lock_waiters: ThreadPoolExecutor  # waits on other processes' blob locks
    #: ``(ref, nbytes)`` for every verified block written (progress, metrics, the adaptive limit).
    block_fetched: Callable[["BlobRef", int], None]
    #: The eviction policy a job's reservation of room follows: rank of a digest, and what must stay.
    eviction_rank: Callable[[str], float]
    protected_digests: Callable[[], Iterable[str]]  # also asked whether it holds a digest (in)
    #: The single flight: the job of each digest being fetched in this process.
    jobs: dict[str, "BlobJob"] = field(default_factory=dict)

    async def in_disk_thread(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run blocking cache work off the event loop."""
        return await self.disk.start(fn, *args, **kwargs)

    def start_in_disk_thread(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
        """Start blocking cache work off the event loop; its future is done once the thread is.

        Await it through :func:`~stager.aio.to_the_end` or :func:`asyncio.shield` (or not at all)
        when the caller may be cancelled: cancelling it would not stop the thread.
        """
        return self.disk.start(fn, *args, **kwargs)
