"""An event loop on a background thread, for synchronous consumers of async sessions.

The training loop is synchronous; sessions and the engine are async. A
:class:`LoopThread` runs a uvloop event loop (asyncio's own when uvloop is
missing) on a daemon thread, and :meth:`LoopThread.run` hands it a
coroutine and blocks until the result. Prefetching keeps running on that
loop between calls, while the consumer computes.

Fork safety: a forked child (a DataLoader worker) inherits the object but
not the thread. Every loop thread remembers the pid that started it and
refuses to be used from another process; owners check :attr:`usable` and
make a fresh one in the child, lazily, on first use. Stopping an inherited
one in the child is a no-op (the thread to stop is in the parent).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from typing import Any, Coroutine, TypeVar

from ..errors import StagerError

T = TypeVar("T")

_START_TIMEOUT = 10.0


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; asyncio's loop works the same
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class LoopThread:
    """A running event loop on a daemon thread. Use :meth:`run` to execute coroutines on it."""

    def __init__(self, name: str = "stager-loop") -> None:
        self.pid = os.getpid()
        self._loop = _new_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        if not self._started.wait(_START_TIMEOUT):
            raise StagerError(f"{name}: the event loop thread did not start")

    def _main(self) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        loop.call_soon(self._started.set)
        try:
            loop.run_forever()
        finally:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    @property
    def usable(self) -> bool:
        """Whether this process started the loop and it still runs."""
        return self.pid == os.getpid() and self._thread.is_alive() and not self._loop.is_closed()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and return its result (or raise its exception).

        Interrupting the caller (KeyboardInterrupt, a timeout) cancels the coroutine.

        Raises:
            StagerError: the loop is not usable from this process.
            TimeoutError: ``timeout`` seconds passed first.
        """
        if not self.usable:
            coro.close()
            raise StagerError("stager's event loop thread belongs to another process (or stopped); "
                              "create the iterator again in this process")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"stager: an operation did not finish within {timeout} s") from None
        except BaseException:
            future.cancel()
            raise

    def submit(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Start ``coro`` on the loop without waiting (errors are logged by asyncio, not raised)."""
        if not self.usable:
            coro.close()
            return
        asyncio.run_coroutine_threadsafe(coro, self._loop)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop (cancelling what still runs on it) and join the thread. Idempotent."""
        if self.pid != os.getpid() or self._loop.is_closed():
            return
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)

    def __enter__(self) -> "LoopThread":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
