"""The daemon's own settings: its socket and who may use it, the metrics listener, a stop's drain, leases.

Cache and fetch settings are the usual :class:`~stager.config.CacheConfig`
and :class:`~stager.config.FetchConfig`; :class:`DaemonConfig` holds what only
the daemon has: its Unix socket and who may use it, the optional TCP
listener for Prometheus, the bound on a graceful stop, and consumer leases.

The default socket path is found the same way by the daemon and by its
consumers (``stager.socket_path``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..socket_path import MAX_SOCKET_PATH, default_socket_path
from ..config import parse_address
from ..errors import ConfigError

DRAIN_TIMEOUT = 10.0
LEASE = 60.0


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    """What ``stager serve`` needs beside the cache and fetch settings.

    Attributes:
        socket: the Unix socket of the control API.
        socket_group: a group whose members may use the socket too (mode 0660);
            None: only the daemon's user (mode 0600).
        metrics_address: also serve ``/metrics`` and ``/healthz`` (read-only)
            on this TCP ``HOST:PORT``; None: only on the socket.
        drain_timeout: seconds a stop waits for block requests in flight to
            land in the cache before cancelling them.
        lease: seconds without a request or heartbeat after which a
            consumer's plans are dropped (a consumer whose process died is
            dropped sooner, when the daemon can see its pid).
        max_poll: the longest readiness long-poll granted, in seconds.
        max_request_bytes: the largest request body accepted (plans of a
            million shards are about 11 MB).
        local_sources: allow datasets on local paths (``file://`` or a bare
            absolute path), read with the daemon's own permissions; false:
            only the remote protocols of ``schema.REMOTE_PROTOCOLS``, unchained.
    """

    socket: Path = field(default_factory=default_socket_path)
    socket_group: str | None = None
    metrics_address: str | None = None
    drain_timeout: float = DRAIN_TIMEOUT
    lease: float = LEASE
    max_poll: float = 60.0
    max_request_bytes: int = 64 << 20
    local_sources: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "socket", Path(self.socket).expanduser())
        if len(os.fsencode(str(self.socket.absolute()))) > MAX_SOCKET_PATH:
            raise ConfigError(f"socket {self.socket}: a Unix socket path may have at most "
                              f"{MAX_SOCKET_PATH} bytes; choose a shorter --socket")
        if self.metrics_address is not None:
            parse_address(self.metrics_address)
        if self.drain_timeout <= 0:
            raise ConfigError(f"drain timeout must be > 0 seconds, got {self.drain_timeout}")
        if self.lease < 1:
            raise ConfigError(f"lease must be >= 1 second, got {self.lease}")
        if self.max_poll <= 0:
            raise ConfigError(f"max poll must be > 0 seconds, got {self.max_poll}")
        if self.max_request_bytes < 1 << 16:
            raise ConfigError(f"max request size must be >= 64KiB, got {self.max_request_bytes}")
