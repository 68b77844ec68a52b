"""One process's link to staging: a loop thread, a session, and the plan being read.

The iterator is synchronous; the session is async. A :class:`StagingLink`
owns a :class:`~.loop_thread.LoopThread` that runs the session (and, for the
embedded session, the whole engine: prefetching goes on while the training
step computes) and turns the few calls the iterator makes into blocking
ones: ``start_plan`` once per epoch, ``ready`` once per shard, ``advance``
(not waited for) once per shuffle window. Nothing is called per sample.

The session is chosen by :func:`stager.session.open_session`, the one place
that chooses: the node daemon when one serves this cache directory, else an
engine embedded in this process ("daemon" insists on the daemon, "embedded"
never asks it). Either way the iterator only sees the Session ABC and reads
verified files from the cache directory itself.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import logging
import os
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from ..config import CacheConfig, FetchConfig, SourceConfig
from ..manifest import Manifest
from ..session import DatasetHandle, PlanHandle, Session, open_session
from .loop_thread import LoopThread
from .shard_plan import AheadBounds

log = logging.getLogger(__name__)

CLOSE_TIMEOUT = 30.0  # seconds to close the session before giving up on it


class StagingLink:
    """A session and the current plan of one consumer, driven from synchronous code.

    Raises (constructor):
        ManifestError, OriginError: the dataset cannot be opened.
        CacheError: the cache directory cannot be opened.
    """

    def __init__(self, source: SourceConfig, manifest: Manifest, cache: CacheConfig, fetch: FetchConfig,
                 mode: str = "auto", socket: str | os.PathLike[str] | None = None) -> None:
        self.loop = LoopThread()
        self.ahead_seconds = fetch.ahead_seconds  # None: the engine's (or the daemon's) setting
        self.session: Session | None = None
        self.dataset: DatasetHandle | None = None
        self.plan: PlanHandle | None = None
        try:
            self.session, self.dataset = self.loop.run(self._open(source, manifest, cache, fetch, mode, socket))
        except BaseException:
            self.loop.stop()
            raise
        _OPEN.add(self)

    @staticmethod
    async def _open(source: SourceConfig, manifest: Manifest, cache: CacheConfig, fetch: FetchConfig,
                    mode: str, socket: str | os.PathLike[str] | None) -> tuple[Session, DatasetHandle]:
        # Blocking (a socket probe, or opening and reconciling the cache): in a thread.
        session = await asyncio.get_running_loop().run_in_executor(
            None, functools.partial(open_session, cache, fetch, socket=socket, mode=mode))
        try:
            return session, await session.open_dataset(source, manifest)
        except BaseException:
            await session.close()
            raise

    @property
    def usable(self) -> bool:
        return self.loop.usable

    def start_plan(self, order: np.ndarray, ahead: AheadBounds | int | None, name: str) -> None:
        """Replace the current plan by one over ``order`` (manifest indexes, first touch first).

        ``ahead``: the shard planner's floor and window, with which the engine stages the fetch
        settings' ``ahead_seconds`` of this consumer's measured rate past the floor, within the
        window; or a window in bytes alone, or None (the session's), staged whole.
        """
        self.loop.run(self._start_plan(order, ahead, name))

    async def _start_plan(self, order: np.ndarray, ahead: AheadBounds | int | None, name: str) -> None:
        await self._end_plan()
        assert self.session is not None and self.dataset is not None
        window, floor = (ahead.window_bytes, ahead.floor_bytes) if isinstance(ahead, AheadBounds) else (ahead, None)
        self.plan = await self.session.plan(self.dataset, order, window_bytes=window, name=name, floor_bytes=floor,
                                            ahead_seconds=self.ahead_seconds)

    def end_plan(self) -> None:
        if self.plan is not None and self.usable:
            self.loop.run(self._end_plan())

    async def _end_plan(self) -> None:
        plan, self.plan = self.plan, None
        if plan is not None:
            await plan.close()

    def ready(self, position: int) -> Path:
        """Block until the blob at plan ``position`` is verified in the cache; its complete file.

        Raises:
            OriginError: it could not be fetched within the retry budget.
            CacheError: the cache cannot hold it.
        """
        assert self.plan is not None
        return self.loop.run(self.plan.ready(position))

    def advance(self, position: int) -> None:
        """Tell the plan every position before ``position`` is done (not waited for; ordered with ``ready``)."""
        if self.plan is not None:
            self.loop.submit(self.plan.advance(position))

    def stats(self) -> dict[str, float]:
        if self.session is None or not self.usable:
            return {}
        return self.loop.run(self._stats())

    async def _stats(self) -> dict[str, float]:
        assert self.session is not None
        stats = dict(self.session.stats())
        ahead = self.plan.read_ahead() if self.plan is not None else None
        if ahead is not None:  # the plan runs in this process (through the daemon, `stager status` shows it)
            rate, stats["plan_ahead_bytes"] = ahead
            if rate is not None:
                stats["plan_rate"] = rate
        return stats

    def close(self) -> None:
        """Close the plan and the session, stop the loop. Idempotent; a no-op in a forked child.

        Best effort: the cache is safe against a process that never closes, so a failure here
        (at interpreter exit the executors the store needs are already gone) is logged, not raised.
        """
        if not self.usable:
            return
        try:
            self.loop.run(self._close(), timeout=CLOSE_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - teardown: report and go on stopping the loop
            log.debug("closing the staging session failed: %r", exc)
        finally:
            self.loop.stop()

    def close_soon(self) -> None:
        """Start :meth:`close` on the link's loop and return without waiting; the loop stops when it is done.

        For a finalizer: the garbage collector runs one on whatever thread allocates, inside whatever
        lock that thread holds (an executor's, say), and closing hands work to executors, so waiting
        there can wait for itself. At interpreter exit the links still open are closed with
        :meth:`close` (:func:`_close_open_links`).
        """
        if not self.usable:
            return
        loop = self.loop

        async def close_then_stop() -> None:
            try:
                await asyncio.wait_for(self._close(), CLOSE_TIMEOUT)
            except Exception as exc:  # noqa: BLE001 - teardown, nobody waits: report and stop the loop
                log.debug("closing the staging session failed: %r", exc)
            finally:
                asyncio.get_running_loop().stop()

        loop.submit(close_then_stop())

    async def _close(self) -> None:
        try:
            await self._end_plan()
        finally:
            session, self.session = self.session, None
            if session is not None:
                await session.close()


#: Every link not yet collected: those still open at interpreter exit are closed there, waiting for it.
_OPEN: "weakref.WeakSet[StagingLink]" = weakref.WeakSet()


@atexit.register
def _close_open_links() -> None:
    for link in list(_OPEN):
        link.close()


def load_manifest_sync(source: SourceConfig, fetch: FetchConfig) -> Manifest:
    """Read and validate the manifest of ``source`` from synchronous code (a short-lived loop thread).

    Raises:
        ManifestError: no manifest, or an invalid one.
        OriginError: the origin cannot be read.
    """
    from ..manifest import load_manifest
    from ..store import open_store

    async def load() -> Manifest:
        store = open_store(source, retry=fetch.retry, bandwidth=fetch.bandwidth, concurrency=4)
        try:
            return await load_manifest(store)
        finally:
            await store.close()

    with LoopThread("stager-manifest") as loop:
        return loop.run(load())


def describe(stats: dict[str, Any]) -> str:
    """One log line out of :meth:`TokenIterator.stats`."""
    line = ("stager: waited {wait_seconds:.2f}s for data ({waits} waits), {cache_hits} of {shards_opened} shards "
            "ready on arrival, {bytes_staged:,} bytes staged, {retries} retries, {ready_steps} steps ready ahead"
            ).format(**stats)
    if "session_plan_ahead_bytes" in stats:
        rate = stats.get("session_plan_rate")
        line += (", reading " + ("at a rate not measured yet" if rate is None else f"{rate / 1e6:,.1f} MB/s")
                 + f", staging {stats['session_plan_ahead_bytes'] / 1e6:,.0f} MB ahead")
    return line
