"""Threads for the engine's blocking cache work (pwrite, fsync, sqlite), cheap to hand work to.

Staging a gigabyte hands about a thousand block writes to these threads. With
``loop.run_in_executor`` each hand-over cost about 50 microseconds of the event
loop's time (a concurrent future, its asyncio twin chained to it by callbacks,
and a wake-up of the loop per completion), more than the loop spends receiving
and hashing the block. Here a job is a plain tuple in a queue, its result goes
straight to an asyncio future, and completions that pile up while the loop is
busy are delivered together, with one wake-up.

A job runs even if its future was cancelled meanwhile: the work (a write of
verified bytes, a record, a commit) is correct on its own, and the callers
that may be cancelled await it through :func:`asyncio.shield` anyway, to know
when it has ended.

Writes into one file go through :meth:`DiskThreads.start_in_turn` with the
file as key: they run one at a time, in the order given, while the other
threads take other files' work. A buffered write holds the file's inode lock
for its copy into the page cache, so two threads writing one file at once do
not go faster: the second spins on the lock. With two disk threads that
spinning was a tenth of a staging run's CPU, and writes taken in turn also
reach the page cache in file order.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections import deque
from typing import Any, Callable, Hashable

log = logging.getLogger(__name__)

#: (call, args, kwargs, future or None, key or None): a job with a key runs after the key's earlier jobs.
_Job = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], "asyncio.Future[Any] | None", Hashable]
_STOP = None


class DiskThreads:
    """``count`` worker threads; :meth:`start` runs a call on one and returns an asyncio future of it."""

    def __init__(self, count: int, name: str) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._finished: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any, BaseException | None]]] = {}
        #: Keys with a job on a thread now, each with the jobs waiting behind it, in order.
        self._in_turn: dict[Hashable, deque[_Job]] = {}
        self._stopped = False
        self._threads = [threading.Thread(target=self._work, name=f"{name}_{i}", daemon=True) for i in range(count)]
        for thread in self._threads:
            thread.start()

    def start(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
        """Run ``fn(*args, **kwargs)`` on a worker; the future (of the running loop) gets its outcome."""
        if self._stopped:
            raise RuntimeError("the disk threads were shut down")
        future = asyncio.get_running_loop().create_future()
        self._jobs.put((fn, args, kwargs, future, None))
        return future

    def start_in_turn(self, key: Hashable, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
        """:meth:`start`, but after every job started earlier with the same ``key`` has ended (one at a time,
        in order, whichever thread runs them)."""
        if self._stopped:
            raise RuntimeError("the disk threads were shut down")
        future = asyncio.get_running_loop().create_future()
        job: _Job = (fn, args, kwargs, future, key)
        with self._lock:
            waiting = self._in_turn.get(key)
            if waiting is not None:
                waiting.append(job)
                return future
            self._in_turn[key] = deque()
        self._jobs.put(job)
        return future

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Run ``fn(*args, **kwargs)`` on a worker and forget it (an error is logged)."""
        if not self._stopped:
            self._jobs.put((fn, args, kwargs, None, None))

    def shutdown(self) -> None:
        """Let the queued jobs finish, then stop the threads (idempotent)."""
        if not self._stopped:
            self._stopped = True
            for _ in self._threads:
                self._jobs.put(_STOP)
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()

    def _work(self) -> None:
        while (job := self._jobs.get()) is not _STOP:
            while job is not None:
                job = self._run(job)
                # A key's next job takes its turn in the queue behind others' (once shut down, it runs here:
                # the queue then ends in the threads' stops)
                if job is not None and not self._stopped and not self._jobs.empty():
                    self._jobs.put(job)
                    job = None

    def _run(self, job: _Job) -> _Job | None:
        """Run one job; the next job of its key, if one waits (else the key is free again)."""
        fn, args, kwargs, future, key = job
        result: Any = None
        error: BaseException | None = None
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to whoever awaits the future
            error = exc
        if future is not None:
            self._finish(future, result, error)
        elif error is not None:
            log.error("background cache work %s failed: %s", getattr(fn, "__qualname__", fn), error)
        del job, args, kwargs, future, result, error  # hold no buffers while waiting for the next job
        if key is None:
            return None
        with self._lock:
            waiting = self._in_turn[key]
            if waiting:
                return waiting.popleft()
            del self._in_turn[key]
        return None

    def _finish(self, future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
        loop = future.get_loop()
        with self._lock:
            pending = self._finished.setdefault(loop, [])
            pending.append((future, result, error))
            if len(pending) > 1:
                return  # a delivery is already on its way to that loop
        try:
            loop.call_soon_threadsafe(self._deliver, loop)
        except RuntimeError:  # the loop is closed: nobody is left to tell
            with self._lock:
                self._finished.pop(loop, None)

    def _deliver(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            pending = self._finished.pop(loop, [])
        for future, result, error in pending:
            if future.cancelled():
                continue
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)
