"""The daemon's own settings, and where its socket lives by default.

Cache and fetch settings are the usual :class:`~stager.config.CacheConfig`
and :class:`~stager.config.FetchConfig`; :class:`DaemonConfig` holds what only
the daemon has: its Unix socket and who may use it, the optional TCP
listener for Prometheus, the bound on a graceful stop, and consumer leases.

The default socket path is found the same way by the daemon and by its
consumers, so neither needs telling when both run with default settings:

1. ``STAGER_SOCKET``, when set;
2. ``/run/stager/stager.sock`` when ``/run/stager`` exists and this user may
   enter it (the systemd unit creates it), or when running as root;
3. ``$XDG_RUNTIME_DIR/stager/stager.sock`` when ``XDG_RUNTIME_DIR`` is set;
4. ``/tmp/stager-<uid>/stager.sock`` otherwise.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from ..errors import ConfigError

SYSTEM_SOCKET_DIR = Path("/run/stager")
SOCKET_NAME = "stager.sock"
DRAIN_TIMEOUT = 10.0
LEASE = 60.0
#: Linux limits a Unix socket address to 107 bytes (sun_path is 108 with its NUL).
MAX_SOCKET_PATH = 107


def default_socket_path(environ: Mapping[str, str] | None = None, *, uid: int | None = None,
                        system_dir: Path = SYSTEM_SOCKET_DIR) -> Path:
    """The socket path a daemon serves and consumers look for when none is given (see the module doc)."""
    env = os.environ if environ is None else environ
    if env.get("STAGER_SOCKET"):
        return Path(env["STAGER_SOCKET"]).expanduser()
    uid = os.getuid() if uid is None else uid
    if uid == 0 or (system_dir.is_dir() and os.access(system_dir, os.X_OK)):
        return system_dir / SOCKET_NAME
    if env.get("XDG_RUNTIME_DIR"):
        return Path(env["XDG_RUNTIME_DIR"]) / "stager" / SOCKET_NAME
    return Path(f"/tmp/stager-{uid}") / SOCKET_NAME


def parse_address(text: str, *, what: str = "--metrics-address") -> tuple[str, int]:
    """``"127.0.0.1:9464"``, ``"[::1]:9464"`` or ``":9464"`` (all interfaces) to (host, port).

    Raises:
        ConfigError: not HOST:PORT with a port in 0..65535.
    """
    host, sep, port = str(text).strip().rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{what}: {text!r} is not HOST:PORT (example: 127.0.0.1:9464)")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


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
