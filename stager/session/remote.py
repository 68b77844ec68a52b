"""A session served by the node daemon over its Unix socket, with no engine in the consumer's process.

:class:`DaemonSession` implements :class:`~stager.session.base.Session` by
asking the daemon (``stager serve``): datasets are opened there by their
source (the manifest is loaded and validated here too, and both sides compare
the manifests' fingerprints, so a position names the same blob on both);
plans are registered there (:mod:`.remote_plan`); a block that a reader wants
alone is fetched by the daemon and read here from the shared cache, checked
against its digest (:class:`~stager.cache.reader.BlockReads`).

Every request carries a key this process made at random, which binds its
plans to it at the daemon; a forked child (a data loader worker) is a new
consumer with a new id and key. A lease keeps the consumer's plans at the
daemon; :meth:`DaemonSession.heartbeat` renews it and registers again what a
restarted daemon lost.

Losing the daemon is not handled here: a call that finds it gone raises
:class:`~stager.errors.DaemonUnavailable` (or :class:`ManifestVersionGone`,
:class:`ConsumerKeyMismatch`), and :class:`~stager.session.failover.RemoteSession`
reconnects (:meth:`DaemonSession.reconnect`, :meth:`DaemonSession.new_identity`)
or falls back to an embedded engine.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import secrets
import socket as _socket
import threading
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..cache import CacheTier
from ..cache.layout import CacheLayout
from ..cache.reader import BlockReads
from ..config import CacheConfig, FetchConfig, SourceConfig
from ..daemon_client import DaemonClient, manifest_fingerprint, same_cache
from ..daemon_client.protocol import API, CONSUMER_KEY_HEADER, PENDING
from ..errors import DaemonError, StagerError
from ..hashing import block_range
from ..manifest import Manifest
from .base import Session
from .local_manifest import absolute_source, load_own_manifest
from .remote_plan import REQUEST_TIMEOUT, DaemonDataset, DaemonPlan

log = logging.getLogger(__name__)

POLL_TIMEOUT = 30.0  # seconds one readiness long-poll may wait at the daemon


def checked_order(order: Sequence[int] | np.ndarray | None, shards: int) -> np.ndarray | None:
    """A plan's order as its own int64 array, every index checked to be a shard of the manifest.

    Raises:
        IndexError: an index is outside the manifest.
    """
    array = None if order is None else np.asarray(order, dtype=np.int64).copy()
    if array is not None and len(array) and (int(array.min()) < 0 or int(array.max()) >= shards):
        raise IndexError(f"plan: shard indexes must be in 0..{shards - 1}")
    return array


def block_span(manifest: Manifest, index: int, block: int) -> tuple[int, int]:
    """Where block ``block`` of shard ``index`` lies in the shard, ``(start, end)``.

    Raises:
        IndexError: no such shard or block.
    """
    if not 0 <= index < len(manifest):
        raise IndexError(f"shard {index} is outside the manifest's {len(manifest)} shards")
    size = int(manifest.sizes[index])
    start, end = block_range(block, size, manifest.block_size)
    if block < 0 or start >= size:
        raise IndexError(f"shard {index} has no block {block}")
    return start, end


class DaemonSession(Session):
    """A :class:`Session` served by the daemon at ``socket_path``; raises when the daemon is gone.

    Args:
        socket_path: the daemon's socket.
        cache: the consumer's cache directory; the daemon's must be the same.
        fetch: the consumer's fetch settings (its retries, to load the manifest here).
        poll_timeout: seconds one readiness long-poll may wait at the daemon.
    """

    def __init__(self, socket_path: str | Path, cache: CacheConfig, fetch: FetchConfig = FetchConfig(), *,
                 poll_timeout: float = POLL_TIMEOUT) -> None:
        self.socket_path = Path(socket_path)
        self.cache = cache
        self.fetch = fetch
        self.poll_timeout = poll_timeout
        self._pid = os.getpid()
        self.consumer_id, self._consumer_key = _consumer_id(), secrets.token_urlsafe(24)
        self._http: DaemonClient | None = None
        self.plans: set[DaemonPlan] = set()
        self._plan_ids = itertools.count()
        self.lease: float | None = None
        self.daemon_counters: dict[str, float] = {}  # node-wide, from the last heartbeat
        self._cache_view: CacheTier | None = None  # read-only, for blocks of partial blobs and dropping bad ones
        self._cache_lock = threading.Lock()
        self.reads = BlockReads(CacheLayout(cache.directory).complete_path, self._view)
        # Counters for stats().
        self.polls = 0
        self.reregistrations = 0

    def client(self) -> DaemonClient:
        """The client on the daemon's socket (a forked process is a new consumer, with a new client)."""
        if self._pid != os.getpid():  # forked (a data loader worker): a new process is a new consumer
            self._pid, self.consumer_id, self._http = os.getpid(), _consumer_id(), None
            self._consumer_key = secrets.token_urlsafe(24)
        if self._http is None:
            self._http = DaemonClient(self.socket_path, headers={CONSUMER_KEY_HEADER: self._consumer_key})
        return self._http

    # -- Session ---------------------------------------------------------------------------------

    async def open_dataset(self, source: SourceConfig, manifest: Manifest | None = None) -> DaemonDataset:
        """Open a dataset: its manifest is loaded and validated here and by the daemon.

        Raises:
            ManifestError: no valid manifest, or the daemon's differs (it loaded an older one).
            OriginError: the origin cannot be read.
            DaemonUnavailable: the daemon is gone.
        """
        source = absolute_source(source)
        if manifest is None:
            manifest = await load_own_manifest(source, self.fetch)
        fingerprint = manifest_fingerprint(manifest)
        dataset = DaemonDataset(source, source.url, manifest, fingerprint)
        _, body = await self.client().request("POST", f"{API}/datasets", timeout=REQUEST_TIMEOUT * 4,
                                              body={"dataset": dataset.wire(), "fingerprint": fingerprint})
        dataset.url = str(body.get("name", source.url))
        return dataset

    async def plan(self, dataset: Any, order: Sequence[int] | np.ndarray | None = None, *,
                   window_bytes: int | None = None, name: str | None = None,
                   floor_bytes: int | None = None, ahead_seconds: float | None = None) -> DaemonPlan:
        """Register a plan with the daemon (the daemon checks every index against its manifest too).

        Raises:
            IndexError: an index is outside the manifest.
            DaemonUnavailable: the daemon is gone.
        """
        if not isinstance(dataset, DaemonDataset):
            raise TypeError("the dataset was not opened by this session")
        array = checked_order(order, len(dataset.manifest))
        plan = DaemonPlan(self, dataset, f"p{next(self._plan_ids)}", array, window_bytes, name,
                          floor_bytes=floor_bytes, ahead_seconds=ahead_seconds)
        await plan.register()
        self.plans.add(plan)
        return plan

    async def read_block(self, dataset: Any, index: int, block: int) -> bytes:
        """The verified bytes of one block of shard ``index``; if the cache lacks it, the daemon fetches
        that block alone, urgently, and this process reads it from the cache (the blob may stay partial).

        Raises:
            IndexError: no such shard or block.
            OriginError, CacheError: as :meth:`DaemonPlan.ready`.
            DaemonUnavailable: the daemon is gone.
        """
        if not isinstance(dataset, DaemonDataset):
            raise TypeError("the dataset was not opened by this session")
        m = dataset.manifest
        start, end = block_span(m, index, block)
        digest = m.digest(index)
        loop = asyncio.get_running_loop()

        async def fetch() -> Path | None:
            body = {"dataset": dataset.wire(), "fingerprint": dataset.fingerprint, "index": index,
                    "block": block, "timeout": self.poll_timeout}
            status = PENDING
            while status == PENDING:  # each poll waits at the daemon; 202 means "ask again"
                self.polls += 1
                status, answer = await self.client().request(
                    "POST", f"{API}/blocks/ready", body=body, timeout=self.poll_timeout + REQUEST_TIMEOUT)
                body["again"] = True
            return self.checked_path(answer, digest) if answer.get("path") else None

        return await self.reads.read(digest, block, start, end, m.block_digests(index)[block], fetch,
                                     lambda fn, *args: loop.run_in_executor(None, fn, *args),
                                     what=f"{dataset.url}/{m.paths[index]}: block {block} (cache "
                                          f"{self.cache.directory})")

    def stats(self) -> dict[str, float]:
        """Long-polls and plan re-registrations of this consumer; the daemon's node-wide engine and
        origin counters as of the last heartbeat, prefixed ``daemon_``."""
        return {"daemon_polls": float(self.polls), "daemon_reregistrations": float(self.reregistrations),
                **{f"daemon_{k}": float(v) for k, v in self.daemon_counters.items()}}

    async def daemon_status(self) -> dict[str, Any]:
        """The daemon's ``/v1/status``: cache, datasets, consumers, plans, engine and origin counters.

        Raises:
            DaemonUnavailable: the daemon does not answer.
        """
        _, body = await self.client().request("GET", f"{API}/status", timeout=REQUEST_TIMEOUT)
        return body

    async def close(self, *, leave: bool = True) -> None:
        """Send what is on its way (not waiting long for a daemon that is gone), leave the daemon (when
        ``leave``: it drops this consumer's plans) and close the connection."""
        pending = [p.sending for p in self.plans if p.sending is not None and not p.sending.done()]
        if pending:  # the last cursors and hits on their way
            _, late = await asyncio.wait(pending, timeout=2.0)
            for task in late:
                task.cancel()
        if self._http is not None:
            if leave and self._pid == os.getpid():
                try:
                    await self._http.request("DELETE", f"{API}/consumers/{self.consumer_id}", timeout=5.0)
                except StagerError as exc:
                    log.debug("closing consumer %s at the daemon: %s", self.consumer_id, exc)
            await self._http.close()
        if self._cache_view is not None:
            self._cache_view.close()

    # -- the daemon's side of staying connected -----------------------------------------------------

    async def heartbeat(self) -> None:
        """Renew the lease, take the daemon's counters, register again what a restarted daemon lost.

        Raises:
            DaemonUnavailable: the daemon is gone.
        """
        _, body = await self.client().request("POST", f"{API}/consumers/{self.consumer_id}/heartbeat",
                                              timeout=REQUEST_TIMEOUT)
        self.lease = float(body.get("lease", 60.0))
        counters = body.get("counters")
        if isinstance(counters, dict):
            self.daemon_counters = {k: v for k, v in counters.items() if isinstance(v, (int, float))}
        held = set(body.get("plans", ()))
        for plan in list(self.plans):
            if not plan.closed and plan.id not in held:
                self.reregistrations += 1
                await plan.register()

    async def reconnect(self) -> None:
        """Ask a (restarted) daemon whether it serves our cache, and register every open plan again at
        its cursor.

        Raises:
            DaemonUnavailable: still nobody there.
            DaemonError: it serves another cache directory.
        """
        _, health = await self.client().request("GET", "/healthz", timeout=REQUEST_TIMEOUT)
        if not same_cache(health, self.cache.directory):
            raise DaemonError(f"the daemon at {self.socket_path} now serves the cache {health.get('cache')}, "
                              f"not {self.cache.directory}")
        await self._register_all()

    async def new_identity(self) -> str:
        """Go on as a new consumer, every open plan registered again at its cursor; returns the old id."""
        old = self.consumer_id
        self.consumer_id, self._consumer_key = _consumer_id(), secrets.token_urlsafe(24)
        self.client().headers[CONSUMER_KEY_HEADER] = self._consumer_key
        await self._register_all()
        return old

    async def _register_all(self) -> None:
        for plan in list(self.plans):
            if not plan.closed:
                await plan.register()

    @staticmethod
    def checked_path(body: dict[str, Any], digest: str) -> Path:
        """The path in a readiness answer, which must be the blob's own file (absolute, named by its digest)."""
        path = Path(str(body.get("path", "")))
        if path.name != digest or not path.is_absolute():
            raise DaemonError(f"the daemon answered {str(path)!r} for blob {digest}")
        return path

    def _view(self) -> CacheTier:
        with self._cache_lock:
            if self._cache_view is None:
                self._cache_view = CacheTier(self.cache, reconcile=False)
            return self._cache_view


def _consumer_id() -> str:
    host = "".join(c for c in _socket.gethostname() if c.isalnum() or c in "-.")[:64] or "host"
    return f"{host}-{os.getpid()}-{secrets.token_hex(4)}"
