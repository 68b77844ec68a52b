"""The node daemon (``stager serve``): one engine, one cache and one set of origin connections per node.

On a training node, eight ranks with several data loader workers each, the
FUSE mount and ``stager stage`` all read the same data. Run embedded, each
would run its own engine; through the daemon they share one, so each blob is
fetched from the origin once, one prefetch window per consumer is kept
ahead of its cursor, and eviction sees every consumer's plan.

This package is the server half, a front end like the mount and the
iterator. Consumers reach it over a Unix socket (``config.py`` says which;
``listener.py`` keeps other users and a second daemon out) with a small JSON
API (``api.py``, validated in ``schema.py``; routes, errors and dataset
fingerprints are the client half's, :mod:`stager.daemon_client`). Each
consumer is served only what its own storage options can read: datasets are
held per credential set and manifest version, each proven at the origin
(``datasets.py``, keyed by ``identity.py``). A consumer registers plans (a
dataset, the order in which it will read its shards, a cursor); the daemon
maps each onto an engine plan (``plans.py``, which also drops the plans of
consumers that went away) and answers readiness long-polls with the path of
a complete, verified cache file. Data never crosses the socket: consumers
read the cache files themselves. ``metrics.py`` exports Prometheus metrics;
``server.py`` runs the whole and drains in-flight block requests on SIGTERM.
The consumer side is :class:`stager.session.RemoteSession`, which reconnects
to a restarted daemon or falls back to an embedded engine.

Importing this package loads the server (the engine, prometheus-client,
aiohttp.web); a consumer imports only :mod:`stager.daemon_client`.
"""

from __future__ import annotations

from .config import DaemonConfig
from .server import Daemon, run_daemon

__all__ = ["Daemon", "DaemonConfig", "run_daemon"]
