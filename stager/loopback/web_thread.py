"""Run an aiohttp application on 127.0.0.1 from its own event loop in a thread.

How it works: a daemon thread runs ``asyncio.run(main)``; ``main`` sets up an
``AppRunner`` and a ``SockSite`` on a socket bound to port 0 (so the OS picks
the port and nothing can race us for it), signals readiness through a
``threading.Event`` and then waits for a stop request. Because the loop is not
the test's loop, the server answers sync tests, async tests (whatever loop
pytest-asyncio gives them) and subprocesses alike. `call` runs a coroutine on
the server's loop from any other thread. `close_listener` / `reopen_listener`
stop and resume accepting connections on the same port, so a client sees
"connection refused" in between.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web

T = TypeVar("T")
_S = TypeVar("_S", bound="ServedApp")

_START_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 10.0


def abort_with_rst(transport: asyncio.Transport | None) -> None:
    """Close a TCP transport with a reset (SO_LINGER 0), not a clean FIN."""
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    transport.abort()


def _listen_socket(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


class ThreadedWebServer:
    """An aiohttp `web.Application` served on ``host``:OS-chosen port.

    Args:
        app: the application (built by the caller, not yet started).
        name: thread name, for debugging.
        host: loopback address to bind.
        shutdown_timeout: seconds in-flight handlers get at stop.

    Raises:
        RuntimeError: the server did not start within 10 s.
    """

    def __init__(
        self,
        app: web.Application,
        *,
        name: str = "web-thread",
        host: str = "127.0.0.1",
        shutdown_timeout: float = 1.0,
    ) -> None:
        self.host = host
        self.port = 0
        self._app = app
        self._shutdown_timeout = shutdown_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.SockSite | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        if not self._ready.wait(_START_TIMEOUT_S):
            raise RuntimeError(f"{name} did not start in {_START_TIMEOUT_S}s")
        if self._error is not None:
            raise RuntimeError(f"{name} failed to start") from self._error

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None
        return self._loop

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # noqa: BLE001 - reported to the starter
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        self._runner = web.AppRunner(
            self._app, shutdown_timeout=self._shutdown_timeout, access_log=None
        )
        await self._runner.setup()
        try:
            await self._open(0)
            self._ready.set()
            await self._stop_event.wait()
        finally:
            await self._runner.cleanup()

    async def _open(self, port: int) -> None:
        assert self._runner is not None
        sock = _listen_socket(self.host, port)
        self.port = sock.getsockname()[1]
        self._site = web.SockSite(self._runner, sock)
        await self._site.start()

    def call(self, fn: Callable[[], Awaitable[T]], timeout: float = 10.0) -> T:
        """Run ``fn()`` (a coroutine function) on the server loop and return its result."""

        async def _wrapped() -> Any:
            return await fn()

        return asyncio.run_coroutine_threadsafe(_wrapped(), self.loop).result(timeout)

    async def aclose_listener(self, abort_connections: bool = True) -> None:
        """On the server loop: stop accepting, optionally RST open connections."""
        if self._site is not None:
            await self._site.stop()
            self._site = None
        if abort_connections:
            self.abort_connections()

    async def areopen_listener(self) -> None:
        """On the server loop: accept connections again on the same port."""
        if self._site is None:
            await self._open(self.port)

    def abort_connections(self) -> None:
        """On the server loop: reset every open client connection."""
        server = self._runner.server if self._runner is not None else None
        for handler in server.connections if server is not None else ():
            if handler.transport is not None:
                abort_with_rst(handler.transport)

    def close_listener(self, abort_connections: bool = True) -> None:
        """Stop accepting connections (clients get ECONNREFUSED); keeps the port number."""
        self.call(lambda: self.aclose_listener(abort_connections))

    def reopen_listener(self) -> None:
        """Accept connections again on the same port."""
        self.call(self.areopen_listener)

    def stop(self) -> None:
        """Stop serving and join the thread (idempotent)."""
        if self._loop is not None and self._thread.is_alive() and self._stop_event:
            try:
                self._loop.call_soon_threadsafe(self._stop_event.set)
            except RuntimeError:  # loop already closed: the thread is ending
                pass
        self._thread.join(_STOP_TIMEOUT_S)
        if self._thread.is_alive():
            raise RuntimeError(f"{self._thread.name} did not stop in {_STOP_TIMEOUT_S}s")


class ServedApp:
    """A server of this package (the HTTP origin, the fault proxy): its app on a :class:`ThreadedWebServer`,
    its address, and stopping it (also at the end of a ``with`` block)."""

    _server: ThreadedWebServer

    def _start_serving(self, app: web.Application, name: str) -> None:
        self._server = ThreadedWebServer(app, name=name)

    @property
    def url(self) -> str:
        return self._server.url

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def running(self) -> bool:
        """Whether the server thread is alive."""
        return self._server.alive

    def stop(self) -> None:
        """Stop serving and join the thread (idempotent)."""
        self._server.stop()

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
