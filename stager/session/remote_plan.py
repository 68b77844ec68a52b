"""A dataset and a plan held by the node daemon, as its consumer sees them.

:class:`DaemonPlan` registers its order with the daemon at its cursor and
answers :meth:`~DaemonPlan.ready` with the path of the blob's complete,
verified file in the shared cache, which the consumer then reads itself (data
never crosses the socket). A blob already complete in the cache is not asked
for at all (:meth:`DaemonPlan.cached`): such hits are reported to the daemon
with the next ``advance``. Advances that come while one is on its way are
folded into one request. A daemon that no longer holds the plan (its
consumer's lease ran out) gets it again, at the cursor; a daemon that is
gone is not this module's business: the error goes up to the session that
reconnects or falls back (:mod:`.failover`).
"""

from __future__ import annotations

import asyncio
import base64
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..config import SourceConfig
from ..daemon_client.protocol import API, PENDING
from ..errors import DaemonError, DaemonRequestError, StagerError, UnknownPlan
from ..manifest import Manifest
from .base import DatasetHandle, PlanHandle

if TYPE_CHECKING:
    from .remote import DaemonSession

log = logging.getLogger(__name__)

REQUEST_TIMEOUT = 30.0  # seconds for a control request
MAX_REREGISTER = 8  # re-registrations of one plan within one call
#: Plan fields a daemon of an earlier version does not know (and refuses, naming them).
NEWER_PLAN_FIELDS = ("floor_bytes", "ahead_seconds")


class DaemonDataset(DatasetHandle):
    """A dataset opened through the daemon; the manifest here is this process's own, validated copy."""

    def __init__(self, source: SourceConfig, name: str, manifest: Manifest, fingerprint: str) -> None:
        self.source = source
        self.url = name
        self.manifest = manifest
        self.fingerprint = fingerprint

    def wire(self) -> dict[str, Any]:
        return {"url": self.source.url, "storage_options": dict(self.source.storage_options)}


class DaemonPlan(PlanHandle):
    """A plan held by the daemon; the cursor is kept here too, to register again after a restart."""

    def __init__(self, session: "DaemonSession", dataset: DaemonDataset, plan_id: str, order: np.ndarray | None,
                 window_bytes: int | None, name: str | None, *, floor_bytes: int | None = None,
                 ahead_seconds: float | None = None) -> None:
        self._session = session
        self.dataset = dataset
        self.id = plan_id
        self.order = order
        self.window_bytes = window_bytes
        self.floor_bytes = floor_bytes
        self.ahead_seconds = ahead_seconds
        self.name = name
        self.cursor = 0
        self.closed = False
        self._sent_cursor = 0
        self._hits = 0  # blobs found complete here, not yet reported to the daemon
        self._hit_bytes = 0
        self.sending: asyncio.Future[None] | None = None

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
        if self.floor_bytes is not None:
            body["floor_bytes"] = self.floor_bytes
        if self.ahead_seconds is not None:
            body["ahead_seconds"] = self.ahead_seconds
        if self.order is not None:
            body["order_b64"] = base64.b64encode(self.order.astype("<i8").tobytes()).decode()
        client = self._session.client()
        try:
            _, answer = await client.request("PUT", self._path, body=body, timeout=REQUEST_TIMEOUT)
        except DaemonRequestError as exc:
            newer = [k for k in NEWER_PLAN_FIELDS if k in body]
            if not newer or "unknown fields" not in str(exc):
                raise
            # A daemon of an earlier version: it stages the whole byte window, which holds the floor.
            log.info("the daemon does not know %s (an earlier version): its plan stages the whole window",
                     " or ".join(newer))
            for key in newer:
                del body[key]
            _, answer = await client.request("PUT", self._path, body=body, timeout=REQUEST_TIMEOUT)
        self._session.lease = float(answer.get("lease", 60.0))
        self._sent_cursor = self.cursor

    def cached(self, position: int) -> Path | None:
        """The blob's complete file when it is in the cache already (no round trip: the daemon hears of
        the hit with the next advance), else None."""
        index = self.index(position)
        path = self._session.reads.complete(self.dataset.manifest.digest(index))
        if path is not None:
            self._hits += 1
            self._hit_bytes += int(self.dataset.manifest.sizes[index])
        return path

    async def ready(self, position: int, *, urgent: bool = True) -> Path:
        """The complete, verified cache file of the blob at ``position``, long-polling the daemon.

        Raises:
            IndexError: ``position`` is outside the plan.
            OriginError: the daemon could not fetch it (the same class as the daemon's error).
            CacheError: the cache cannot hold it.
            DaemonUnavailable: the daemon is gone.
        """
        if not 0 <= position < len(self):
            raise IndexError(f"position {position} is outside the plan's {len(self)} positions")
        session = self._session
        digest = self.dataset.manifest.digest(self.index(position))
        for _ in range(MAX_REREGISTER):
            try:
                params = {"position": position, "timeout": session.poll_timeout, "urgent": int(urgent)}
                while True:  # each poll waits at the daemon; 202 means "ask again"
                    session.polls += 1
                    status, body = await session.client().request(
                        "GET", f"{self._path}/ready", timeout=session.poll_timeout + REQUEST_TIMEOUT, params=params)
                    if status != PENDING:
                        return session.checked_path(body, digest)
                    params["again"] = 1
            except UnknownPlan:
                session.reregistrations += 1
                await self.register()
        raise DaemonError(f"the daemon at {session.socket_path} keeps losing plan {self.id}")

    async def advance(self, position: int) -> None:
        """The consumer is done with every position before ``position``.

        Calls that come while one is on its way to the daemon are folded into
        one request carrying the newest cursor (they return at once).
        """
        position = min(max(position, 0), len(self))
        if position <= self.cursor:
            return
        self.cursor = position
        if self.sending is not None and not self.sending.done():
            return  # the request in flight is followed by one with this cursor
        self.sending = asyncio.ensure_future(self._send())
        await asyncio.shield(self.sending)

    async def _send(self) -> None:
        """Tell the daemon the newest cursor and the local hits, until it is up to date."""
        while not self.closed and (self._sent_cursor < self.cursor or self._hits):
            position, body = self.cursor, {"position": self.cursor, "hits": self._hits, "hit_bytes": self._hit_bytes}
            self._hits = self._hit_bytes = 0
            for _ in range(MAX_REREGISTER):
                try:
                    await self._session.client().request("POST", f"{self._path}/advance", body=body,
                                                         timeout=REQUEST_TIMEOUT)
                    break
                except UnknownPlan:
                    self._session.reregistrations += 1
                    await self.register()  # registered at the newest cursor: nothing more to say
            self._sent_cursor = max(self._sent_cursor, position)

    async def close(self) -> None:
        """Stop prefetching for this plan (best effort when the daemon is gone)."""
        if self.closed:
            return
        if self._hits and (self.sending is None or self.sending.done()):
            self.sending = asyncio.ensure_future(self._send())  # report the last local hits
        if self.sending is not None:
            await asyncio.gather(self.sending, return_exceptions=True)
        self.closed = True
        self._session.plans.discard(self)
        try:
            await self._session.client().request("DELETE", self._path, timeout=REQUEST_TIMEOUT)
        except StagerError as exc:  # the daemon is gone or forgot it: nothing is left to close
            log.debug("closing plan %s: %s", self.id, exc)
