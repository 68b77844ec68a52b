"""Choosing a consumer's session: the node daemon when one serves its cache directory, else an engine of its own."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Literal

from ..config import CacheConfig, FetchConfig
from ..daemon_client import default_socket_path, probe, same_cache
from ..errors import ConfigError, DaemonError
from .base import Session
from .embedded import EmbeddedSession
from .failover import RemoteSession

log = logging.getLogger(__name__)

Mode = Literal["auto", "daemon", "embedded"]


def open_session(cache: CacheConfig, fetch: FetchConfig = FetchConfig(), *,
                 socket: str | os.PathLike[str] | None = None, mode: Mode = "auto",
                 reconnect_timeout: float | None = None) -> Session:
    """A session for one consumer process: through the node daemon when one serves this cache, else embedded.

    Args:
        cache: the cache directory (and capacity, for an embedded engine).
        fetch: fetch settings for an embedded engine (the daemon uses its own).
        socket: the daemon's socket (default: ``STAGER_SOCKET`` or the
            default path, see :func:`stager.daemon_client.default_socket_path`).
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
    if health is not None and same_cache(health, cache.directory):
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
