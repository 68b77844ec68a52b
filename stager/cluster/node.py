"""One node of a cluster inside the daemon: membership, the peer listener, and the engine's peer sources.

The daemon makes a :class:`ClusterNode` from its :class:`~.config.PeerConfig`,
loads the member list (:meth:`prepare`), builds its engine with
``sources=node.sources``, then :meth:`start` serves the peer API on
``--peer-listen`` and starts the health checks; :meth:`stop` undoes both.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

from aiohttp import web

from ..engine import Engine
from ..errors import ConfigError
from .auth import PeerAuth
from .config import PeerConfig
from .holdings import Holdings
from .identity import ClusterIdentities
from .membership import Membership
from .peer_client import PeerClient
from .peer_server import build_peer_app
from .peer_source import ClusterSources
from .stats import ClusterStats

log = logging.getLogger(__name__)


class ClusterNode:
    """Everything the cluster adds to one daemon."""

    def __init__(self, config: PeerConfig) -> None:
        self.config = config
        self.stats = ClusterStats()
        self.auth = PeerAuth(config.secret)
        self.identities = ClusterIdentities(config.secret)
        self.membership = Membership(config.spec, config.listen, refresh=config.refresh)
        self.client = PeerClient(self.auth, lambda: self.membership.me, ssl_context=config.client_ssl(),
                                 per_peer=config.per_peer)
        self.sources = ClusterSources(self.membership, self.client, self.identities, self.stats,
                                      fanout=config.fanout)
        self.port: int | None = None
        self._runner: web.AppRunner | None = None
        self._health: asyncio.Task[None] | None = None
        self._holdings: Holdings | None = None

    async def prepare(self) -> None:
        """Read the member list once (before the engine exists). Raises ConfigError if it cannot be read."""
        await self.membership.load()

    async def start(self, engine: Engine, versions: Callable[[], Iterable[tuple[Any, str]]],
                    stopping: asyncio.Event) -> None:
        """Serve the peer API and start the health checks.

        Raises:
            ConfigError: ``--peer-listen`` cannot be listened on, or a TLS file is unusable.
        """
        self._holdings = Holdings(engine, versions, self.identities, self.sources.ring, self.stats)
        app = build_peer_app(self.auth, self._holdings, self.stats, per_peer=self.config.per_peer,
                             bandwidth=self.config.bandwidth, stopping=stopping)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        host, port = self.config.listen
        try:
            await web.TCPSite(self._runner, host, port, ssl_context=self.config.server_ssl()).start()
        except OSError as exc:
            raise ConfigError(f"--peer-listen {host}:{port}: cannot listen there: {exc.strerror or exc}") from exc
        self.port = self._runner.addresses[0][1] if self._runner.addresses else port
        self._health = asyncio.create_task(self.membership.run(self.client.healthy, self.config.health_interval),
                                           name="stager peer health")
        log.info("peer listener on %s:%d%s; this node is %s of %d members (%s)", host, self.port,
                 " (TLS)" if self.config.tls else "", self.membership.me, len(self.membership.members),
                 self.config.spec)

    def version_held(self) -> None:
        """The daemon holds a new dataset version (peers waiting for it may be served now)."""
        if self._holdings is not None:
            self._holdings.version_held()

    def status(self) -> dict[str, Any]:
        """The membership as this node sees it, and the counters (``stager status``, ``/metrics``)."""
        m = self.membership
        return {"me": m.me, "spec": str(self.config.spec), "listen_port": self.port,
                "members": list(m.members), "live": m.live(), "down": m.down(), **self.stats.as_dict()}

    async def stop(self) -> None:
        if self._health is not None:
            self._health.cancel()
            await asyncio.gather(self._health, return_exceptions=True)
        if self._holdings is not None:
            await self._holdings.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.client.close()
