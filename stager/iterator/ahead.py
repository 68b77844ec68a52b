"""Items of an iterator made ahead on a thread, while the caller does something else.

A training step spends most of its time off the GIL (the accelerator runs,
the loop waits on it, or sleeps); a batch assembled during that time is
ready when ``next()`` comes, instead of being copied out of the shards then.
:func:`made_ahead` runs the source iterator on a daemon thread, at most
``depth`` items ahead, and hands items, the source's end and its error (at
the position it happened) to the caller in order. Closing the consumer (or
dropping it, or setting its ``stop`` event) stops the thread at its next hand-over
(a consumer still iterating then sees the end); it is joined briefly and
otherwise left to end by itself (a daemon thread that only holds a stale
stream).
"""

from __future__ import annotations

import queue
import threading
from typing import Iterator, TypeVar

T = TypeVar("T")

#: Seconds a blocked hand-over waits before looking whether the consumer is gone.
POLL = 0.1
#: Seconds the consumer waits for the thread when it stops early.
JOIN = 1.0

_END = object()


def made_ahead(source: Iterator[T], depth: int, name: str = "stager-ahead",
               stop: threading.Event | None = None) -> Iterator[T]:
    """``source``'s items, the same and in the same order, made up to ``depth`` ahead on a thread.

    Setting ``stop`` (or closing the returned iterator) ends the thread at its next hand-over.
    """
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    handed: queue.Queue[tuple[object, BaseException | None]] = queue.Queue(maxsize=depth)
    stop = stop if stop is not None else threading.Event()

    def hand(item: object, error: BaseException | None = None) -> bool:
        while not stop.is_set():
            try:
                handed.put((item, error), timeout=POLL)
                return True
            except queue.Full:
                continue
        return False

    def make() -> None:
        try:
            for item in source:
                if not hand(item):
                    return
        except BaseException as exc:  # handed over at its position; the consumer raises it
            hand(_END, exc)
            return
        finally:
            close = getattr(source, "close", None)
            if close is not None and stop.is_set():
                close()
        hand(_END)

    thread = threading.Thread(target=make, name=name, daemon=True)
    thread.start()
    try:
        while True:
            try:
                item, error = handed.get(timeout=POLL)
            except queue.Empty:
                if stop.is_set() and not thread.is_alive() and handed.empty():
                    return  # stopped from outside: nothing more will come
                continue
            if error is not None:
                raise error
            if item is _END:
                return
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        thread.join(JOIN)
