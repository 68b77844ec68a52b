"""Talking to the daemon: a small JSON-over-HTTP client on its Unix socket, and a synchronous probe.

:class:`DaemonClient` sends one request and returns the status and JSON
body; anything that means "nobody is there" (no socket file, connection
refused or reset, a daemon answering 503 because it is stopping, a timeout)
becomes :class:`~stager.errors.DaemonUnavailable`, which callers
treat as a reason to reconnect or fall back, never as a failed read. Other
errors come back as the :class:`~stager.errors.StagerError` the daemon named.

:func:`probe` asks ``/healthz`` with a blocking socket and a short timeout,
so that choosing between the daemon and an embedded engine needs no event loop;
:func:`same_cache` tells from its answer whether the daemon serves a given
cache directory.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import DaemonUnavailable
from .protocol import error_from_body

if TYPE_CHECKING:
    import aiohttp

BASE = "http://stager"  # the host is ignored on a Unix socket


class DaemonClient:
    """Requests to one daemon socket (the aiohttp session is made on first use, on the caller's loop).

    aiohttp is imported then, not with this module: a command that finds no
    daemon and runs the engine itself never needs it.
    """

    def __init__(self, socket_path: str | Path, *, connect_timeout: float = 5.0,
                 headers: dict[str, str] | None = None) -> None:
        self.socket_path = Path(socket_path)
        self.connect_timeout = connect_timeout
        self.headers = dict(headers or {})  # sent with every request (a consumer's key)
        self._session: aiohttp.ClientSession | None = None
        self.instance: str | None = None  # the X-Stager-Instance of the last answer

    def _client(self) -> aiohttp.ClientSession:
        import aiohttp

        if self._session is None or self._session.closed:
            # limit=0: long-polls hold connections, and one stuck poll must not block the others.
            connector = aiohttp.UnixConnector(path=str(self.socket_path), limit=0)
            self._session = aiohttp.ClientSession(connector=connector, base_url=BASE)
        return self._session

    async def request(self, method: str, path: str, *, body: Any = None, params: dict[str, Any] | None = None,
                      timeout: float = 30.0) -> tuple[int, dict[str, Any]]:
        """One request; returns ``(status, json)`` for 2xx answers.

        Raises:
            DaemonUnavailable: nobody answers, the connection broke, or the daemon is stopping.
            StagerError: the error the daemon answered with (same class as on the daemon's side).
        """
        import aiohttp

        client_timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=self.connect_timeout)
        try:
            async with self._client().request(method, path, json=body, params=params, headers=self.headers,
                                              timeout=client_timeout) as response:
                self.instance = response.headers.get("X-Stager-Instance", self.instance)
                try:
                    payload = await response.json(content_type=None)
                except (ValueError, aiohttp.ContentTypeError):
                    payload = None
                status = response.status
        except (aiohttp.ClientConnectionError, TimeoutError, ConnectionError, FileNotFoundError) as exc:
            raise DaemonUnavailable(f"no answer from the daemon at {self.socket_path}: "
                                    f"{type(exc).__name__}: {exc}") from exc
        if 200 <= status < 300:
            return status, payload if isinstance(payload, dict) else {}
        error = error_from_body(status, payload, str(self.socket_path))
        if status == 503 and not isinstance(error, DaemonUnavailable):
            error = DaemonUnavailable(str(error))
        raise error

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def probe(socket_path: str | Path, timeout: float = 2.0) -> dict[str, Any] | None:
    """The daemon's ``/healthz`` answer, or None if no daemon that is not stopping answers at ``socket_path``."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(socket_path))
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: stager\r\nConnection: close\r\n\r\n")
        chunks = []
        while True:  # bounded by the socket timeout and the daemon closing the connection
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
            if sum(map(len, chunks)) > 1 << 20:
                return None
    except OSError:
        return None
    finally:
        sock.close()
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split()
    if len(status_line) < 2 or status_line[1] != b"200":
        return None
    try:
        answer = json.loads(body)
    except ValueError:
        return None
    return answer if isinstance(answer, dict) and answer.get("status") == "ok" else None


def same_cache(health: dict[str, Any], directory: Path) -> bool:
    """Whether the daemon's cache (by device and inode, so symlinks and bind mounts agree) is ``directory``."""
    try:
        st = os.stat(directory)
    except OSError:
        return False
    return (health.get("cache_dev"), health.get("cache_ino")) == (st.st_dev, st.st_ino)


__all__ = ["DaemonClient", "probe", "same_cache"]
