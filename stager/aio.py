"""The asyncio habits of the core, in one place: awaiting work to its end through a cancellation,
retrieving a future's error that nobody else awaits, waiting for an event with a timeout, and
``async with`` for what has an async ``close()``.

Work that runs in a thread (a block write, a sink's abort on its way to the
disk) cannot be stopped by cancelling the task that waits for it; closing a
file under it would be a bug. :func:`to_the_end` waits for such work even
when its caller is cancelled, then lets the cancellation go on. The store
layer (a sink's abort) and the engine (its block writes and records) use it.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, TypeVar

T = TypeVar("T")


async def to_the_end(awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` to its end even if the caller is cancelled meanwhile (then re-raise the cancellation).

    Raises:
        Whatever ``awaitable`` raises; CancelledError once it has ended, if the caller was cancelled.
    """
    task = asyncio.ensure_future(awaitable)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])
        raise


def retrieve(future: asyncio.Future) -> None:
    """A done-callback: take a failure nobody may await, so it is not logged as lost."""
    if not future.cancelled():
        future.exception()


async def wait_until_set(event: asyncio.Event, timeout: float) -> bool:
    """Wait for ``event`` at most ``timeout`` seconds; whether it was set by then."""
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True


class AsyncClosing:
    """``async with thing:`` for an object with an async ``close()``: the end of the block closes it."""

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self: T) -> T:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
