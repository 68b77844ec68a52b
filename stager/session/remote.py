"""A session that asks the node daemon, over its Unix socket, instead of running an engine.

:class:`RemoteSession` implements :class:`~stager.session.base.Session`
with no engine in the consumer's process: plans are registered with the
daemon (``stager serve``), and :meth:`RemotePlan.ready` long-polls it for the
path of the blob's complete, verified file in the shared cache, which the
consumer then reads itself (data never crosses the socket). A blob already
complete in the cache is not asked for at all: a file under the cache's
``blobs/`` is always complete and verified, so ``ready`` finds it by its
digest and reports such hits to the daemon with the next ``advance``.
Advances that come while one is on its way are folded into one request.

The manifest is loaded and validated here too (it is small): the consumer
needs it to know its shards, and only the source (URL and storage options)
travels to the daemon, which loads its own copy. Both sides compare the
manifests' fingerprints, so a position names the same blob on both.

When the daemon goes away mid-epoch (killed, restarted, upgraded), the next
call finds it gone and the session reconnects with bounded exponential
backoff; once a daemon answers again, every open plan is registered again at
its current cursor and the call carries on, so the consumer's stream goes on
exactly where it was. If no daemon answers within ``reconnect_timeout``, the
session falls back to an embedded engine on the same cache (when allowed,
which is the default of ``open_session(mode="auto")``) and moves every open
dataset and plan over to it, again at their cursors; it stays embedded from
then on. A heartbeat keeps the consumer's lease while its event loop runs, and
re-registers plans a restarted daemon no longer has even while the consumer
is not asking for anything.

The daemon holds every manifest version its consumers bring (a dataset
indexed again while they read is a second version), reading each with the
consumer's own storage options. Only a consumer whose manifest is neither
the origin's current one nor a version the daemon still holds (the daemon
restarted after a re-index) is refused (:class:`ManifestVersionGone`); the
session then falls back to an engine of its own, on its own manifest, when
allowed. Every request carries a key this process made at random, which
binds its plans to it at the daemon; should another process have taken the
consumer's id while the daemon had forgotten it (its lease ran out), the
session goes on under a new id, its plans registered again at their cursors.

:func:`open_session` chooses: the daemon when one answers on the socket and
serves the consumer's cache directory, an embedded engine otherwise.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import itertools
import logging
import os
import secrets
import socket as _socket
import threading
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Literal, Sequence, TypeVar

import numpy as np

from ..cache import CacheTier
from ..cache.layout import CacheLayout
from ..config import CacheConfig, FetchConfig, SourceConfig
from ..daemon.client import DaemonClient, probe
from ..daemon.config import default_socket_path
from ..daemon.protocol import (API, CONSUMER_KEY_HEADER, PENDING, ConsumerKeyMismatch, DaemonUnavailable,
                               ManifestVersionGone, UnknownPlan, manifest_fingerprint)
from ..errors import CacheError, ConfigError, DaemonError, StagerError
from ..hashing import block_digest, block_range
from ..manifest import Manifest, load_manifest
from ..store import open_store, split_protocol
from .base import DatasetHandle, PlanHandle, Session
from .embedded import EmbeddedSession

log = logging.getLogger(__name__)

T = TypeVar("T")
Mode = Literal["auto", "daemon", "embedded"]

POLL_TIMEOUT = 30.0  # seconds one readiness long-poll may wait at the daemon
REQUEST_TIMEOUT = 30.0  # seconds for a control request
BACKOFF_FIRST, BACKOFF_MAX = 0.05, 1.0
MAX_RECOVERIES = 64  # reconnects within one call before giving up on a daemon that keeps dying
MAX_REREGISTER = 8  # re-registrations of one plan within one call
READ_ATTEMPTS = 4  # a block read back from a blob that is evicted under the reader, again and again


class RemoteDataset(DatasetHandle):
    """A dataset opened through the daemon; the manifest here is this process's own, validated copy."""

    def __init__(self, source: SourceConfig, name: str, manifest: Manifest, fingerprint: str) -> None:
        self.source = source
        self.url = name
        self.manifest = manifest
        self.fingerprint = fingerprint
        self.embedded: DatasetHandle | None = None  # after a fallback

    def wire(self) -> dict[str, Any]:
        return {"url": self.source.url, "storage_options": dict(self.source.storage_options)}


class RemotePlan(PlanHandle):
    """A plan held by the daemon; the cursor is kept here too, to register again after a restart."""

    def __init__(self, session: "RemoteSession", dataset: RemoteDataset, plan_id: str, order: np.ndarray | None,
                 window_bytes: int | None, name: str | None) -> None:
        self._session = session
        self.dataset = dataset
        self.id = plan_id
        self.order = order
        self.window_bytes = window_bytes
        self.name = name
        self.cursor = 0
        self.closed = False
        self.embedded: PlanHandle | None = None  # after a fallback
        self._sent_cursor = 0
        self._hits = 0  # blobs found complete here, not yet reported to the daemon
        self._hit_bytes = 0
        self._sending: asyncio.Future[None] | None = None

    def __len__(self) -> int:
        return len(self.order) if self.order is not None else len(self.dataset.manifest)

    def index(self, position: int) -> int:
        return int(self.order[position]) if self.order is not None else position

    @property
    def _path(self) -> str:
        return f"{API}/consumers/{self._session.consumer_id}/plans/{self.id}"

    async def register(self) -> None:
        """(Re-)register this plan with the daemon at the current cursor."""
        body: dict[str, Any] = {"dataset": self.dataset.wire(), "fingerprint": self.dataset.fingerprint,
                                "cursor": self.cursor, "window_bytes": self.window_bytes, "name": self.name}
        if self.order is not None:
            body["order_b64"] = base64.b64encode(self.order.astype("<i8").tobytes()).decode()
        _, answer = await self._session._client().request("PUT", self._path, body=body, timeout=REQUEST_TIMEOUT)
        self._session._lease = float(answer.get("lease", 60.0))
        self._sent_cursor = self.cursor

    async def ready(self, position: int) -> Path:
        """The complete, verified cache file of the blob at ``position`` (long-polls the daemon when it is
        not in the cache yet; a file under the cache's ``blobs/`` is always complete and verified).

        Raises:
            IndexError: ``position`` is outside the plan.
            OriginError: the daemon could not fetch it (the same class as the daemon's error).
            CacheError: the cache cannot hold it.
            DaemonError: the daemon is gone and the session may not fall back.
        """
        if not 0 <= position < len(self):
            raise IndexError(f"position {position} is outside the plan's {len(self)} positions")
        session = self._session
        index = self.index(position)
        digest = self.dataset.manifest.digest(index)
        if session.mode == "daemon":
            local = session.layout.complete_path(digest)
            if local.exists():  # staged already: no round trip (the daemon hears of it with the next advance)
                self._hits += 1
                self._hit_bytes += int(self.dataset.manifest.sizes[index])
                session.waits += 1
                return local
        began = time.monotonic()

        async def remote() -> Path:
            for _ in range(MAX_REREGISTER):
                try:
                    params = {"position": position, "timeout": session.poll_timeout}
                    while True:  # each poll waits at the daemon; 202 means "ask again"
                        session.polls += 1
                        status, body = await session._client().request(
                            "GET", f"{self._path}/ready", timeout=session.poll_timeout + REQUEST_TIMEOUT,
                            params=params)
                        if status != PENDING:
                            return session._checked_path(body, digest)
                        params["again"] = 1
                except UnknownPlan:
                    session.reregistrations += 1
                    await self.register()
            raise DaemonError(f"the daemon at {session.socket_path} keeps losing plan {self.id}")

        async def embedded() -> Path:
            assert self.embedded is not None
            return await self.embedded.ready(position)

        try:
            return await session._run(remote, embedded)
        finally:
            session.wait_seconds += time.monotonic() - began
            session.waits += 1

    async def advance(self, position: int) -> None:
        """The consumer is done with every position before ``position``.

        Calls that come while one is on its way to the daemon are folded into
        one request carrying the newest cursor (they return at once).
        """
        position = min(max(position, 0), len(self))
        if position <= self.cursor:
            return
        self.cursor = position
        if self._sending is not None and not self._sending.done():
            return  # the request in flight is followed by one with this cursor
        self._sending = asyncio.ensure_future(self._send())
        await asyncio.shield(self._sending)

    async def _send(self) -> None:
        """Tell the daemon (or the fallback engine) the newest cursor and the local hits, until up to date."""
        session = self._session
        while not self.closed and (self._sent_cursor < self.cursor or self._hits):
            position, body = self.cursor, {"position": self.cursor, "hits": self._hits, "hit_bytes": self._hit_bytes}
            self._hits = self._hit_bytes = 0
            await session._run(functools.partial(self._send_remote, body),
                               functools.partial(self._send_embedded, position))
            self._sent_cursor = max(self._sent_cursor, position)

    async def _send_remote(self, body: dict[str, Any]) -> None:
        session = self._session
        for _ in range(MAX_REREGISTER):
            try:
                await session._client().request("POST", f"{self._path}/advance", body=body, timeout=REQUEST_TIMEOUT)
                return
            except UnknownPlan:
                session.reregistrations += 1
                await self.register()  # registered at the newest cursor: nothing more to say

    async def _send_embedded(self, position: int) -> None:
        assert self.embedded is not None
        await self.embedded.advance(position)

    async def close(self) -> None:
        """Stop prefetching for this plan (best effort when the daemon is gone)."""
        if self.closed:
            return
        if self._hits and self.embedded is None and (self._sending is None or self._sending.done()):
            self._sending = asyncio.ensure_future(self._send())  # report the last local hits
        if self._sending is not None:
            await asyncio.gather(self._sending, return_exceptions=True)
        self.closed = True
        self._session._plans.discard(self)
        if self.embedded is not None:
            await self.embedded.close()
            return
        try:
            await self._session._client().request("DELETE", self._path, timeout=REQUEST_TIMEOUT)
        except StagerError as exc:  # the daemon is gone or forgot it: nothing is left to close
            log.debug("closing plan %s: %s", self.id, exc)


class RemoteSession(Session):
    """A :class:`Session` served by the node daemon. Usually made by :func:`open_session`.

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
        self.socket_path = Path(socket_path)
        self.cache = cache
        self.fetch = fetch
        self.fallback = fallback
        self.reconnect_timeout = reconnect_timeout
        self.poll_timeout = poll_timeout
        self._pid = os.getpid()
        self.consumer_id, self._consumer_key = _consumer_id(), secrets.token_urlsafe(24)
        self.layout = CacheLayout(cache.directory)
        self._http: DaemonClient | None = None
        self._plans: set[RemotePlan] = set()
        self._datasets: list[RemoteDataset] = []
        self._plan_ids = itertools.count()
        self._generation = 0
        self._recovering = asyncio.Lock()
        self._embedded: EmbeddedSession | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._lease: float | None = None
        self._daemon_counters: dict[str, float] = {}  # node-wide, from the last heartbeat
        self._closed = False
        self._cache_view: CacheTier | None = None  # read-only, for blocks of partial blobs
        self._cache_lock = threading.Lock()
        # Counters for stats().
        self.wait_seconds = 0.0
        self.waits = 0
        self.polls = 0
        self.reconnects = 0
        self.reregistrations = 0

    @property
    def mode(self) -> str:
        """``"daemon"``, or ``"embedded"`` once the session fell back."""
        return "embedded" if self._embedded is not None else "daemon"

    def _client(self) -> DaemonClient:
        if self._pid != os.getpid():  # forked (a data loader worker): a new process is a new consumer
            self._pid, self.consumer_id, self._http = os.getpid(), _consumer_id(), None
            self._consumer_key = secrets.token_urlsafe(24)
        if self._http is None:
            self._http = DaemonClient(self.socket_path, headers={CONSUMER_KEY_HEADER: self._consumer_key})
        return self._http

    # -- Session ---------------------------------------------------------------------------------

    async def open_dataset(self, source: SourceConfig, manifest: Manifest | None = None) -> DatasetHandle:
        """Open a dataset: its manifest is loaded and validated here and by the daemon.

        Raises:
            ManifestError: no valid manifest, or the daemon's differs (it loaded an older one).
            OriginError: the origin cannot be read.
            DaemonError: the daemon is gone and the session may not fall back.
        """
        source = _absolute(source)
        if manifest is None:
            manifest = await _load_manifest(source, self.fetch)
        fingerprint = manifest_fingerprint(manifest)
        dataset = RemoteDataset(source, source.url, manifest, fingerprint)

        async def remote() -> DatasetHandle:
            _, body = await self._client().request("POST", f"{API}/datasets", timeout=REQUEST_TIMEOUT * 4,
                                                   body={"dataset": dataset.wire(), "fingerprint": fingerprint})
            dataset.url = str(body.get("name", source.url))
            self._datasets.append(dataset)
            return dataset

        async def embedded() -> DatasetHandle:
            assert self._embedded is not None
            dataset.embedded = await self._embedded.open_dataset(source, manifest)
            dataset.url = dataset.embedded.url
            self._datasets.append(dataset)
            return dataset

        return await self._run(remote, embedded)

    async def plan(self, dataset: DatasetHandle, order: Sequence[int] | np.ndarray | None = None, *,
                   window_bytes: int | None = None, name: str | None = None) -> PlanHandle:
        """Register a plan with the daemon (the daemon checks every index against its manifest).

        Raises:
            IndexError: an index is outside the manifest.
            DaemonError: the daemon is gone and the session may not fall back.
        """
        if not isinstance(dataset, RemoteDataset):
            raise TypeError("the dataset was not opened by this session")
        array = None if order is None else np.asarray(order, dtype=np.int64).copy()
        shards = len(dataset.manifest)
        if array is not None and len(array) and (int(array.min()) < 0 or int(array.max()) >= shards):
            raise IndexError(f"plan: shard indexes must be in 0..{shards - 1}")
        plan = RemotePlan(self, dataset, f"p{next(self._plan_ids)}", array, window_bytes, name)

        async def remote() -> PlanHandle:
            await plan.register()
            self._plans.add(plan)
            self._start_heartbeat()
            return plan

        async def embedded() -> PlanHandle:
            assert self._embedded is not None
            await self._move_plan(plan, self._embedded)
            self._plans.add(plan)
            return plan

        return await self._run(remote, embedded)

    async def read_block(self, dataset: DatasetHandle, index: int, block: int) -> bytes:
        """The verified bytes of one block of shard ``index``; if the cache lacks it, the daemon fetches
        that block alone, urgently, and this process reads it from the cache (the blob may stay partial).

        Raises:
            IndexError: no such shard or block.
            OriginError, CacheError: as :meth:`RemotePlan.ready`.
        """
        if not isinstance(dataset, RemoteDataset):
            raise TypeError("the dataset was not opened by this session")
        m = dataset.manifest
        if not 0 <= index < len(m):
            raise IndexError(f"shard {index} is outside the manifest's {len(m)} shards")
        size = int(m.sizes[index])
        start, end = block_range(block, size, m.block_size)
        if block < 0 or start >= size:
            raise IndexError(f"shard {index} has no block {block}")
        digest = m.digest(index)
        expected = m.block_digests(index)[block]
        loop = asyncio.get_running_loop()
        if self.mode == "daemon":  # a complete blob needs no question (see the module doc)
            data = await loop.run_in_executor(None, self._read_checked, digest, self.layout.complete_path(digest),
                                              start, end, expected)
            if data is not None:
                return data

        async def remote() -> bytes:
            for _ in range(READ_ATTEMPTS):
                body = {"dataset": dataset.wire(), "fingerprint": dataset.fingerprint, "index": index,
                        "block": block, "timeout": self.poll_timeout}
                status = PENDING
                while status == PENDING:  # each poll waits at the daemon; 202 means "ask again"
                    self.polls += 1
                    status, answer = await self._client().request(
                        "POST", f"{API}/blocks/ready", body=body, timeout=self.poll_timeout + REQUEST_TIMEOUT)
                    body["again"] = True
                if answer.get("path"):
                    path = self._checked_path(answer, digest)
                    data = await loop.run_in_executor(None, self._read_checked, digest, path, start, end, expected)
                else:
                    data = await loop.run_in_executor(None, self._read_verified, digest, block, expected)
                if data is not None:
                    return data  # else gone, or changed on the disk and dropped: the daemon fetches it again
            raise CacheError(f"{dataset.url}/{m.paths[index]}: block {block} kept being evicted from the cache "
                             f"at {self.cache.directory} before it could be read")

        async def embedded() -> bytes:
            assert self._embedded is not None and dataset.embedded is not None
            return await self._embedded.read_block(dataset.embedded, index, block)

        return await self._run(remote, embedded)

    def _view(self) -> CacheTier:
        with self._cache_lock:
            if self._cache_view is None:
                self._cache_view = CacheTier(self.cache, reconcile=False)
            return self._cache_view

    def _read_checked(self, digest: str, path: Path, start: int, end: int, expected: int) -> bytes | None:
        """Bytes ``[start, end)`` (one block) of a complete cache file, checked against the block's digest
        (in a thread); None if the file is gone, or changed on the disk (then it is dropped, to be fetched
        again)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            data = os.pread(fd, end - start, start)
            if len(data) == end - start and block_digest(data) == expected:
                return data
            st = os.fstat(fd)
        finally:
            os.close(fd)
        log.warning("blob %s changed on the cache disk since it was verified; dropping it", digest)
        self._view().drop_corrupt(digest, (st.st_dev, st.st_ino))
        return None

    def _read_verified(self, digest: str, block: int, expected: int) -> bytes | None:
        """A verified block of a blob that may still be partial, read from the shared cache and checked
        against its digest (in a thread); None if the blob went away meanwhile (evicted, or dropped and
        begun again) or the block changed on the disk (then it is dropped, to be fetched again)."""
        handle = self._view().open_partial(digest)  # complete blobs too; the open file survives eviction
        if handle is None:
            return None
        try:
            data = handle.read_block(block)
            if block_digest(data) == expected:
                return data
            st = os.stat(handle.path)
            bad = None if handle.complete else [block]
        except (CacheError, FileNotFoundError):
            return None
        finally:
            handle.close()
        log.warning("blob %s: block %d changed on the cache disk since it was verified; dropping it", digest, block)
        self._view().drop_corrupt(digest, (st.st_dev, st.st_ino), bad)
        return None

    def stats(self) -> dict[str, float]:
        """This consumer's counters: wait time and waits for readiness, long-polls, reconnects, plan
        re-registrations, whether it fell back; the daemon's node-wide engine and origin counters as of
        the last heartbeat, prefixed ``daemon_`` (``daemon_bytes_fetched``, ``daemon_origin_retries``; all
        of them in :meth:`daemon_status` and /metrics); after a fallback, the embedded engine's counters."""
        own = {"consumer_wait_seconds": self.wait_seconds, "consumer_waits": float(self.waits),
               "daemon_polls": float(self.polls), "daemon_reconnects": float(self.reconnects),
               "daemon_reregistrations": float(self.reregistrations),
               "daemon_fallback": float(self._embedded is not None),
               **{f"daemon_{k}": float(v) for k, v in self._daemon_counters.items()}}
        if self._embedded is not None:
            embedded = self._embedded.stats()
            embedded.pop("consumer_wait_seconds", None)
            embedded.pop("consumer_waits", None)
            own.update(embedded)
        return own

    async def daemon_status(self) -> dict[str, Any]:
        """The daemon's ``/v1/status``: cache, datasets, consumers, plans, engine and origin counters.

        Raises:
            DaemonUnavailable: the daemon does not answer.
        """
        _, body = await self._client().request("GET", f"{API}/status", timeout=REQUEST_TIMEOUT)
        return body

    async def close(self) -> None:
        """Close every plan (at the daemon, or the fallback engine) and the connection. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            await asyncio.gather(self._heartbeat, return_exceptions=True)
        pending = [p._sending for p in self._plans if p._sending is not None and not p._sending.done()]
        if pending:  # the last cursors and hits on their way; not waiting long for a daemon that is gone
            _, late = await asyncio.wait(pending, timeout=2.0)
            for task in late:
                task.cancel()
        if self._http is not None:
            if self._embedded is None and self._pid == os.getpid():
                try:
                    await self._http.request("DELETE", f"{API}/consumers/{self.consumer_id}", timeout=5.0)
                except StagerError as exc:
                    log.debug("closing consumer %s at the daemon: %s", self.consumer_id, exc)
            await self._http.close()
        if self._embedded is not None:
            await self._embedded.close()
        if self._cache_view is not None:
            self._cache_view.close()

    # -- losing and finding the daemon -------------------------------------------------------------

    async def _run(self, remote: Callable[[], Awaitable[T]], embedded: Callable[[], Awaitable[T]]) -> T:
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
                    await self._reconnect()
                    self._generation += 1
                    self.reconnects += 1
                    log.info("reconnected to the daemon at %s; %d plan(s) registered again at their cursors",
                             self.socket_path, len(self._plans))
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
            old = self.consumer_id
            self.consumer_id, self._consumer_key = _consumer_id(), secrets.token_urlsafe(24)
            self._client().headers[CONSUMER_KEY_HEADER] = self._consumer_key
            log.warning("the daemon at %s refused consumer id %s to this process (%s); going on as %s",
                        self.socket_path, old, reason, self.consumer_id)
            for plan in list(self._plans):
                if not plan.closed:
                    await plan.register()
            self._generation += 1

    async def _reconnect(self) -> None:
        _, health = await self._client().request("GET", "/healthz", timeout=REQUEST_TIMEOUT)
        if not _same_cache(health, self.cache.directory):
            raise DaemonError(f"the daemon at {self.socket_path} now serves the cache {health.get('cache')}, "
                              f"not {self.cache.directory}")
        for plan in list(self._plans):
            if not plan.closed:
                await plan.register()

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
            for plan in list(self._plans):
                await self._move_plan(plan, engine)
        except BaseException:
            for dataset in self._datasets:
                dataset.embedded = None
            await engine.close()
            raise
        self._embedded = engine

    async def _move_plan(self, plan: RemotePlan, engine: EmbeddedSession) -> None:
        dataset = plan.dataset
        if dataset.embedded is None:
            dataset.embedded = await engine.open_dataset(dataset.source, dataset.manifest)
        plan.embedded = await engine.plan(dataset.embedded, plan.order, window_bytes=plan.window_bytes,
                                          name=plan.name)
        if plan.cursor:
            await plan.embedded.advance(plan.cursor)

    def _start_heartbeat(self) -> None:
        if self._heartbeat is None or self._heartbeat.done():
            self._heartbeat = asyncio.create_task(self._beat(), name=f"stager heartbeat {self.consumer_id}")

    async def _beat(self) -> None:
        """Renew the lease while the loop runs; register again what a restarted daemon lost."""
        while self._embedded is None and not self._closed:
            await asyncio.sleep(max(0.5, (self._lease or 60.0) / 4))
            generation = self._generation
            try:
                _, body = await self._client().request("POST", f"{API}/consumers/{self.consumer_id}/heartbeat",
                                                       timeout=REQUEST_TIMEOUT)
                self._lease = float(body.get("lease", 60.0))
                counters = body.get("counters")
                if isinstance(counters, dict):
                    self._daemon_counters = {k: v for k, v in counters.items() if isinstance(v, (int, float))}
                held = set(body.get("plans", ()))
                for plan in list(self._plans):
                    if not plan.closed and plan.id not in held:
                        self.reregistrations += 1
                        await plan.register()
            except DaemonUnavailable:
                try:
                    await self._recover(generation)
                except StagerError as exc:
                    log.warning("heartbeat: %s", exc)
            except StagerError as exc:
                log.warning("heartbeat to the daemon at %s failed: %s", self.socket_path, exc)

    @staticmethod
    def _checked_path(body: dict[str, Any], digest: str) -> Path:
        path = Path(str(body.get("path", "")))
        if path.name != digest or not path.is_absolute():
            raise DaemonError(f"the daemon answered {str(path)!r} for blob {digest}")
        return path


def open_session(cache: CacheConfig, fetch: FetchConfig = FetchConfig(), *,
                 socket: str | os.PathLike[str] | None = None, mode: Mode = "auto",
                 reconnect_timeout: float | None = None) -> Session:
    """A session for one consumer process: through the node daemon when one serves this cache, else embedded.

    Args:
        cache: the cache directory (and capacity, for an embedded engine).
        fetch: fetch settings for an embedded engine (the daemon uses its own).
        socket: the daemon's socket (default: ``STAGER_SOCKET`` or the
            default path, see :func:`stager.daemon.default_socket_path`).
        mode: ``"auto"``: the daemon if it answers and serves ``cache.directory``,
            else an embedded engine, and fall back to one if the daemon goes
            away for longer than ``reconnect_timeout`` (default 10 s);
            ``"daemon"``: the daemon or an error, waiting up to
            ``reconnect_timeout`` (default 60 s) for it to come back;
            ``"embedded"``: always an engine in this process.

    Raises:
        DaemonError: ``mode="daemon"`` and no daemon serving this cache answers.
        ConfigError: an unknown mode.
    """
    if mode not in ("auto", "daemon", "embedded"):
        raise ConfigError(f"session mode must be auto, daemon or embedded, got {mode!r}")
    if mode == "embedded":
        return EmbeddedSession.open(cache, fetch)
    path = Path(socket).expanduser() if socket else default_socket_path()
    health = probe(path)
    if health is not None and _same_cache(health, cache.directory):
        timeout = reconnect_timeout if reconnect_timeout is not None else (10.0 if mode == "auto" else 60.0)
        return RemoteSession(path, cache, fetch, fallback=mode == "auto", reconnect_timeout=timeout)
    if health is None:
        problem = f"no stager daemon answers at {path}"
    else:
        problem = (f"the daemon at {path} serves the cache {health.get('cache')}, not {cache.directory} "
                   "(give both the same cache directory)")
    if mode == "daemon":
        raise DaemonError(f"{problem}; start one with `stager serve`, or use an embedded engine")
    if health is not None:
        log.warning("%s; running an engine in this process instead", problem)
    return EmbeddedSession.open(cache, fetch)


def _same_cache(health: dict[str, Any], directory: Path) -> bool:
    """Whether the daemon's cache (by device and inode, so symlinks and bind mounts agree) is ``directory``."""
    try:
        st = os.stat(directory)
    except OSError:
        return False
    return (health.get("cache_dev"), health.get("cache_ino")) == (st.st_dev, st.st_ino)


def _absolute(source: SourceConfig) -> SourceConfig:
    """A local relative path made absolute: the daemon's working directory is not ours."""
    protocol, path = split_protocol(source.url)
    if (protocol or "file").lower() in ("file", "local") and not os.path.isabs(path):
        url = f"{protocol}://{os.path.abspath(path)}" if protocol else os.path.abspath(path)
        return SourceConfig(url, source.storage_options)
    return source


async def _load_manifest(source: SourceConfig, fetch: FetchConfig) -> Manifest:
    store = open_store(source, retry=fetch.retry, concurrency=2)
    try:
        return await load_manifest(store)
    finally:
        await store.close()


def _consumer_id() -> str:
    host = "".join(c for c in _socket.gethostname() if c.isalnum() or c in "-.")[:64] or "host"
    return f"{host}-{os.getpid()}-{secrets.token_hex(4)}"
