"""The consumer's session when a node daemon runs: the daemon's, and an engine of its own when the daemon stays away.

:class:`RemoteSession` wraps a :class:`~stager.session.remote.DaemonSession`
and, once needed, an :class:`~stager.session.embedded.EmbeddedSession` on the
same cache. Every call goes to the daemon; when it finds the daemon gone
(killed, restarted, upgraded) the session reconnects with bounded
exponential backoff, and once a daemon answers again every open plan is
registered again at its cursor and the call carries on, so the consumer's
stream goes on exactly where it was. If no daemon answers within
``reconnect_timeout``, the session falls back to the embedded engine (when
allowed, which is the default of ``open_session(mode="auto")``) and moves
every open dataset and plan over to it, again at their cursors; it stays
embedded from then on. A heartbeat keeps the consumer's lease while its
event loop runs, and re-registers plans a restarted daemon no longer has
even while the consumer is not asking for anything.

The daemon holds every manifest version its consumers bring (a dataset
indexed again while they read is a second version). Only a consumer whose
manifest is neither the origin's current one nor a version the daemon still
holds (the daemon restarted after a re-index) is refused
(:class:`~stager.errors.ManifestVersionGone`); the session then falls back to
an engine of its own, on its own manifest, when allowed. Should another
process have taken the consumer's id while the daemon had forgotten it (its
lease ran out), the session goes on under a new id, its plans registered
again at their cursors.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Sequence, TypeVar

import numpy as np

from ..config import CacheConfig, FetchConfig, SourceConfig
from ..errors import (ConfigError, ConsumerKeyMismatch, DaemonError, DaemonUnavailable, ManifestVersionGone,
                      StagerError)
from ..manifest import Manifest
from .base import DatasetHandle, PlanHandle, Session
from .embedded import EmbeddedPlan, EmbeddedSession
from .local_manifest import absolute_source, load_own_manifest
from .remote import POLL_TIMEOUT, DaemonSession, block_span
from .remote_plan import DaemonDataset, DaemonPlan

log = logging.getLogger(__name__)

T = TypeVar("T")

BACKOFF_FIRST, BACKOFF_MAX = 0.05, 1.0
MAX_RECOVERIES = 64  # reconnects within one call before giving up on a daemon that keeps dying


class FailoverDataset(DatasetHandle):
    """A dataset opened at the daemon, or (after a fallback) at the embedded engine, or both."""

    def __init__(self, source: SourceConfig, manifest: Manifest) -> None:
        self.source = source
        self.url = source.url
        self.manifest = manifest
        self.remote: DaemonDataset | None = None
        self.embedded: DatasetHandle | None = None


class FailoverPlan(PlanHandle):
    """A plan held by the daemon, moved to the embedded engine at its cursor after a fallback."""

    def __init__(self, session: "RemoteSession", dataset: FailoverDataset) -> None:
        self._session = session
        self.dataset = dataset
        self.remote: DaemonPlan | None = None
        self.embedded: EmbeddedPlan | None = None
        self.cursor = 0
        self.closed = False

    @property
    def id(self) -> str | None:
        """The plan's id at the daemon."""
        return self.remote.id if self.remote is not None else None

    def __len__(self) -> int:
        return len(self.remote) if self.remote is not None else len(self._embedded())

    async def ready(self, position: int, *, urgent: bool = True) -> Path:
        """See :meth:`PlanHandle.ready`; also ``DaemonError``: the daemon is gone and the session may not
        fall back."""
        if not 0 <= position < len(self):
            raise IndexError(f"position {position} is outside the plan's {len(self)} positions")
        session = self._session
        if session.mode == "daemon" and self.remote is not None:
            local = self.remote.cached(position)
            if local is not None:  # staged already: no round trip (see remote_plan.py)
                session.waits += 1
                return local
        began = time.monotonic()
        try:
            return await session.run(lambda: self._remote().ready(position, urgent=urgent),
                                     lambda: self._embedded().ready(position, urgent=urgent))
        finally:
            session.wait_seconds += time.monotonic() - began
            session.waits += 1

    def read_ahead(self) -> tuple[float | None, int] | None:
        return self.embedded.read_ahead() if self.embedded is not None else None

    async def advance(self, position: int) -> None:
        """The consumer is done with every position before ``position`` (see :meth:`DaemonPlan.advance`)."""
        self.cursor = max(self.cursor, min(max(position, 0), len(self)))
        await self._session.run(lambda: self._remote().advance(position),
                                lambda: self._embedded().advance(position))

    async def close(self) -> None:
        """Stop prefetching for this plan (best effort when the daemon is gone)."""
        if self.closed:
            return
        self.closed = True
        self._session.plans.discard(self)
        if self.embedded is not None:
            await self.embedded.close()
        elif self.remote is not None:
            await self.remote.close()

    def _remote(self) -> DaemonPlan:
        assert self.remote is not None
        return self.remote

    def _embedded(self) -> EmbeddedPlan:
        assert self.embedded is not None
        return self.embedded


class RemoteSession(Session):
    """A :class:`Session` served by the node daemon, reconnecting or falling back when it goes away.
    Usually made by :func:`~stager.session.open_session`.

    Args:
        socket_path: the daemon's socket.
        cache, fetch: the consumer's settings, for a fallback embedded engine; the
            daemon's own cache must be the same directory.
        fallback: fall back to an embedded engine when the daemon stays away
            (otherwise raise :class:`~stager.errors.DaemonError`).
        reconnect_timeout: seconds to wait for a lost daemon to come back.
        poll_timeout: seconds one readiness long-poll may wait at the daemon.
    """

    def __init__(self, socket_path: str | Path, cache: CacheConfig, fetch: FetchConfig = FetchConfig(), *,
                 fallback: bool = True, reconnect_timeout: float = 30.0, poll_timeout: float = POLL_TIMEOUT) -> None:
        if reconnect_timeout < 0 or poll_timeout <= 0:
            raise ConfigError(f"reconnect timeout must be >= 0 and poll timeout > 0, got {reconnect_timeout}, "
                              f"{poll_timeout}")
        self.daemon = DaemonSession(socket_path, cache, fetch, poll_timeout=poll_timeout)
        self.socket_path = self.daemon.socket_path
        self.cache = cache
        self.fetch = fetch
        self.fallback = fallback
        self.reconnect_timeout = reconnect_timeout
        self.plans: set[FailoverPlan] = set()
        self._datasets: list[FailoverDataset] = []
        self._generation = 0
        self._recovering = asyncio.Lock()
        self._embedded: EmbeddedSession | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._closed = False
        # Counters for stats().
        self.wait_seconds = 0.0
        self.waits = 0
        self.reconnects = 0

    @property
    def mode(self) -> str:
        """``"daemon"``, or ``"embedded"`` once the session fell back."""
        return "embedded" if self._embedded is not None else "daemon"

    @property
    def consumer_id(self) -> str:
        """This consumer's id at the daemon."""
        return self.daemon.consumer_id

    # -- Session ---------------------------------------------------------------------------------

    async def open_dataset(self, source: SourceConfig, manifest: Manifest | None = None) -> DatasetHandle:
        """Open a dataset: its manifest is loaded and validated here and by the daemon.

        Raises:
            ManifestError: no valid manifest, or the daemon's differs (it loaded an older one).
            OriginError: the origin cannot be read.
            DaemonError: the daemon is gone and the session may not fall back.
        """
        source = absolute_source(source)
        if manifest is None:
            manifest = await load_own_manifest(source, self.fetch)
        dataset = FailoverDataset(source, manifest)

        async def remote() -> DatasetHandle:
            dataset.remote = await self.daemon.open_dataset(source, manifest)
            dataset.url = dataset.remote.url
            self._datasets.append(dataset)
            return dataset

        async def embedded() -> DatasetHandle:
            assert self._embedded is not None
            dataset.embedded = await self._embedded.open_dataset(source, manifest)
            dataset.url = dataset.embedded.url
            self._datasets.append(dataset)
            return dataset

        return await self.run(remote, embedded)

    async def plan(self, dataset: DatasetHandle, order: Sequence[int] | np.ndarray | None = None, *,
                   window_bytes: int | None = None, name: str | None = None,
                   floor_bytes: int | None = None, ahead_seconds: float | None = None) -> PlanHandle:
        """Register a plan with the daemon (the daemon checks every index against its manifest).

        Raises:
            IndexError: an index is outside the manifest.
            DaemonError: the daemon is gone and the session may not fall back.
        """
        if not isinstance(dataset, FailoverDataset):
            raise TypeError("the dataset was not opened by this session")
        plan = FailoverPlan(self, dataset)

        async def remote() -> PlanHandle:  # the order is checked (and made an array) there
            assert dataset.remote is not None
            plan.remote = await self.daemon.plan(dataset.remote, order, window_bytes=window_bytes, name=name,
                                                 floor_bytes=floor_bytes, ahead_seconds=ahead_seconds)
            self.plans.add(plan)
            self._start_heartbeat()
            return plan

        async def embedded() -> PlanHandle:  # ... or by the engine
            assert self._embedded is not None
            if dataset.embedded is None:
                dataset.embedded = await self._embedded.open_dataset(dataset.source, dataset.manifest)
            plan.embedded = await self._embedded.plan(dataset.embedded, order, window_bytes=window_bytes, name=name,
                                                      floor_bytes=floor_bytes, ahead_seconds=ahead_seconds)
            self.plans.add(plan)
            return plan

        return await self.run(remote, embedded)

    async def read_block(self, dataset: DatasetHandle, index: int, block: int) -> bytes:
        """The verified bytes of one block of shard ``index`` (see :meth:`DaemonSession.read_block`).

        Raises:
            IndexError: no such shard or block.
            OriginError, CacheError: as :meth:`FailoverPlan.ready`.
            DaemonError: the daemon is gone and the session may not fall back.
        """
        if not isinstance(dataset, FailoverDataset):
            raise TypeError("the dataset was not opened by this session")
        block_span(dataset.manifest, index, block)

        async def embedded() -> bytes:
            assert self._embedded is not None and dataset.embedded is not None
            return await self._embedded.read_block(dataset.embedded, index, block)

        return await self.run(lambda: self.daemon.read_block(dataset.remote, index, block), embedded)

    def stats(self) -> dict[str, float]:
        """This consumer's counters: wait time and waits for readiness, long-polls, reconnects, plan
        re-registrations, whether it fell back; the daemon's node-wide engine and origin counters as of
        the last heartbeat, prefixed ``daemon_`` (``daemon_bytes_fetched``, ``daemon_origin_retries``; all
        of them in :meth:`daemon_status` and /metrics); after a fallback, the embedded engine's counters."""
        daemon = self.daemon.stats()
        own = {"consumer_wait_seconds": self.wait_seconds, "consumer_waits": float(self.waits),
               "daemon_polls": daemon.pop("daemon_polls"), "daemon_reconnects": float(self.reconnects),
               "daemon_reregistrations": daemon.pop("daemon_reregistrations"),
               "daemon_fallback": float(self._embedded is not None), **daemon}
        if self._embedded is not None:
            embedded = self._embedded.stats()
            embedded.pop("consumer_wait_seconds", None)
            embedded.pop("consumer_waits", None)
            own.update(embedded)
        return own

    async def daemon_status(self) -> dict[str, Any]:
        """The daemon's ``/v1/status`` (see :meth:`DaemonSession.daemon_status`)."""
        return await self.daemon.daemon_status()

    async def close(self) -> None:
        """Close every plan (at the daemon, or the fallback engine) and the connection. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            await asyncio.gather(self._heartbeat, return_exceptions=True)
        await self.daemon.close(leave=self._embedded is None)
        if self._embedded is not None:
            await self._embedded.close()

    # -- losing and finding the daemon -------------------------------------------------------------

    async def run(self, remote: Callable[[], Awaitable[T]], embedded: Callable[[], Awaitable[T]]) -> T:
        """``remote()``; when the daemon is lost, recover (reconnect or fall back) and go on."""
        for _ in range(MAX_RECOVERIES):
            if self._embedded is not None:
                return await embedded()
            generation = self._generation
            try:
                return await remote()
            except DaemonUnavailable as exc:
                log.info("lost the daemon at %s (%s); reconnecting", self.socket_path, exc)
                await self._recover(generation)
            except ManifestVersionGone as exc:  # our manifest is older than any the daemon can serve
                if not self.fallback:
                    raise
                async with self._recovering:
                    if self._embedded is None:
                        await self._fall_back(exc)
            except ConsumerKeyMismatch as exc:
                await self._new_identity(generation, exc)
        raise DaemonError(f"the daemon at {self.socket_path} keeps going away; giving up")

    async def _recover(self, generation: int) -> None:
        """Reconnect (registering every open plan again at its cursor) or fall back; once for all waiters."""
        async with self._recovering:
            if generation != self._generation or self._embedded is not None:
                return  # another call recovered meanwhile
            deadline = time.monotonic() + self.reconnect_timeout
            delay = BACKOFF_FIRST
            last: StagerError | None = None
            while True:
                try:
                    await self.daemon.reconnect()
                    self._generation += 1
                    self.reconnects += 1
                    log.info("reconnected to the daemon at %s; %d plan(s) registered again at their cursors",
                             self.socket_path, len(self.plans))
                    return
                except DaemonUnavailable as exc:
                    last = exc
                except StagerError as exc:  # it answers, but cannot take our plans (another cache, manifest)
                    last = exc
                    break
                if time.monotonic() + delay > deadline:
                    break
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX)
            if not self.fallback:
                if isinstance(last, ManifestVersionGone):
                    raise last
                raise DaemonUnavailable(f"the daemon at {self.socket_path} did not come back within "
                                        f"{self.reconnect_timeout:.0f}s: {last}") from last
            await self._fall_back(last)

    async def _new_identity(self, generation: int, reason: BaseException) -> None:
        """Go on as a new consumer (every open plan registered again at its cursor): another process took
        this consumer's id while the daemon had forgotten it (its lease ran out), and the daemon refuses
        our key for it."""
        async with self._recovering:
            if generation != self._generation or self._embedded is not None:
                return  # another call did meanwhile
            old = await self.daemon.new_identity()
            log.warning("the daemon at %s refused consumer id %s to this process (%s); going on as %s",
                        self.socket_path, old, reason, self.consumer_id)
            self._generation += 1

    async def _fall_back(self, reason: BaseException | None) -> None:
        log.warning("the daemon at %s is gone (%s); going on with an engine in this process on %s",
                    self.socket_path, reason, self.cache.directory)
        loop = asyncio.get_running_loop()
        engine = await loop.run_in_executor(None, EmbeddedSession.open, self.cache, self.fetch)
        # Everything moves over before the session says it is embedded, so no call sees half of it.
        # (The heartbeat ends by itself: it may be the very task running this.)
        try:
            for dataset in self._datasets:
                dataset.embedded = await engine.open_dataset(dataset.source, dataset.manifest)
            for plan in list(self.plans):
                await self._move_plan(plan, engine)
        except BaseException:
            for dataset in self._datasets:
                dataset.embedded = None
            await engine.close()
            raise
        self._embedded = engine

    async def _move_plan(self, plan: FailoverPlan, engine: EmbeddedSession) -> None:
        dataset, remote = plan.dataset, plan.remote
        if remote is None or plan.embedded is not None:
            return
        if dataset.embedded is None:
            dataset.embedded = await engine.open_dataset(dataset.source, dataset.manifest)
        plan.embedded = await engine.plan(dataset.embedded, remote.order, window_bytes=remote.window_bytes,
                                          name=remote.name, floor_bytes=remote.floor_bytes,
                                          ahead_seconds=remote.ahead_seconds)
        if plan.cursor:
            await plan.embedded.advance(plan.cursor)

    def _start_heartbeat(self) -> None:
        if self._heartbeat is None or self._heartbeat.done():
            self._heartbeat = asyncio.create_task(self._beat(), name=f"stager heartbeat {self.consumer_id}")

    async def _beat(self) -> None:
        """Renew the lease while the loop runs; register again what a restarted daemon lost."""
        while self._embedded is None and not self._closed:
            await asyncio.sleep(max(0.5, (self.daemon.lease or 60.0) / 4))
            generation = self._generation
            try:
                await self.daemon.heartbeat()
            except DaemonUnavailable:
                try:
                    await self._recover(generation)
                except StagerError as exc:
                    log.warning("heartbeat: %s", exc)
            except StagerError as exc:
                log.warning("heartbeat to the daemon at %s failed: %s", self.socket_path, exc)
