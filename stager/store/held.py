"""Memory held for requests in flight, over every store of this process: what the engine's memory bound reads.

A body's bytes are held from when they start arriving until nothing refers
to them any more (their disk write is done). The HTTP client counts its
receive buffers (:class:`~.wire.BufferPool` registers here, and counts the
connections holding one); a store that hands a body over in one piece
counts it, and its request, while the body is with its sink (:func:`holding`).
The client also counts its connections paused because their answer queued
faster than its consumer took it: a sign that this host, not the origin, is
what limits the requests in flight.
Counts move from any thread: a buffer is freed where its last view is dropped.

A request a consumer is blocked on is not held to the client's budget of
receive buffers (its connection never waits for one): :func:`urgent_while`
marks the requests a task makes from then on, by a test read live, since a
prefetch becomes urgent when a consumer catches up with it.
"""

from __future__ import annotations

import threading
import weakref
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator, Protocol


class _Pool(Protocol):
    def bytes_in_use(self) -> int: ...


class _Counter:
    def __init__(self) -> None:
        self.value = 0
        self._lock = threading.Lock()

    def grow(self, amount: int) -> None:
        with self._lock:
            self.value += amount


_POOLS: "weakref.WeakSet[_Pool]" = weakref.WeakSet()
#: Bytes held outside the pools' kept buffers: buffers no pool keeps, bodies handed over whole.
BYTES = _Counter()
#: Requests holding memory now: connections with a receive buffer, bodies with their sink.
RECEIVING = _Counter()
#: Connections paused because their answer queued faster than its consumer took it.
PAUSED = _Counter()


def register_pool(pool: _Pool) -> None:
    """Count ``pool.bytes_in_use()`` in :func:`held_bytes` for as long as the pool lives."""
    _POOLS.add(pool)


def held_bytes() -> int:
    """Bytes that requests of this process, or views of their bodies, hold now."""
    return BYTES.value + sum(pool.bytes_in_use() for pool in list(_POOLS))


def receiving_requests() -> int:
    """Requests of this process holding memory now (not those still waiting for their first byte)."""
    return RECEIVING.value


def paused_connections() -> int:
    """Connections of this process paused now for their consumer: bytes arrive faster than this host takes them."""
    return PAUSED.value


@contextmanager
def holding(nbytes: int) -> Iterator[None]:
    """Count one request holding ``nbytes`` for the body of the ``with``."""
    BYTES.grow(nbytes)
    RECEIVING.grow(1)
    try:
        yield
    finally:
        BYTES.grow(-nbytes)
        RECEIVING.grow(-1)


def _never() -> bool:
    return False


#: Whether the request the current task makes is one a consumer waits on, asked live.
_URGENT: ContextVar[Callable[[], bool]] = ContextVar("stager_urgent_request", default=_never)


@contextmanager
def urgent_while(test: Callable[[], bool]) -> Iterator[None]:
    """Requests made in the ``with`` (by this task and the tasks it starts) go past the receive
    budget whenever ``test()`` says a consumer waits on them."""
    token = _URGENT.set(test)
    try:
        yield
    finally:
        _URGENT.reset(token)


def urgency() -> Callable[[], bool]:
    """The test :func:`urgent_while` set for the current task's requests (always False if none)."""
    return _URGENT.get()
