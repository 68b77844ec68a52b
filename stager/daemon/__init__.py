"""The node daemon (``stager serve``): one engine, one cache and one set of origin connections per node.

On a training node, eight ranks with several data loader workers each, the
FUSE mount and ``stager stage`` all read the same data. Run embedded, each
would run its own engine; through the daemon they share one, so each blob is
fetched from the origin once, one prefetch window per consumer is kept
ahead of its cursor, and eviction sees every consumer's plan.

How it works: consumers reach the daemon over a Unix socket (``config.py``
says where; ``listener.py`` keeps other users and a second daemon out) with
a small JSON API (``api.py``, validated in ``schema.py``, errors and dataset
fingerprints in ``protocol.py``). Each consumer is served only what its own
storage options can read: datasets are held per credential set and manifest
version, each proven at the origin (``datasets.py``, keyed by ``identity.py``).
A consumer registers plans (a dataset, the
order in which it will read its shards, a cursor); the daemon maps each onto
an engine plan (``plans.py``, which also drops the plans of consumers that
went away) and answers readiness long-polls with the path of a complete,
verified cache file. Data never crosses the socket: consumers read the cache
files themselves. ``metrics.py`` exports Prometheus metrics; ``server.py``
runs the whole and drains in-flight block requests on SIGTERM. The client
side is :class:`stager.session.remote.RemoteSession` (over ``client.py``),
which reconnects to a restarted daemon or falls back to an embedded engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .client import DaemonClient, probe
from .config import DaemonConfig, default_socket_path
from .protocol import (ConsumerKeyMismatch, DaemonRequestError, DaemonUnavailable, ManifestVersionGone, UnknownPlan,
                       manifest_fingerprint)

if TYPE_CHECKING:
    from .server import Daemon, run_daemon

__all__ = [
    "ConsumerKeyMismatch",
    "Daemon",
    "DaemonClient",
    "DaemonConfig",
    "DaemonRequestError",
    "DaemonUnavailable",
    "ManifestVersionGone",
    "UnknownPlan",
    "default_socket_path",
    "manifest_fingerprint",
    "probe",
    "run_daemon",
]


def __getattr__(name: str) -> Any:
    # The server side (engine, prometheus-client, aiohttp.web) loads only where a daemon runs,
    # not in every data loader worker that merely talks to one.
    if name in ("Daemon", "run_daemon"):
        from . import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
