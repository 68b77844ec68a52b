"""Running a front end's coroutine to its end on uvloop (asyncio's own loop where uvloop is missing).

The commands, the mount's own process and the demo all start their work here,
so each front end runs on the same kind of loop without importing another.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, Coroutine, TypeVar

T = TypeVar("T")


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on uvloop (asyncio's loop where uvloop is missing)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency, but stay usable without it
        return asyncio.run(coro)
    if sys.version_info >= (3, 12):
        return asyncio.run(coro, loop_factory=uvloop.new_event_loop)
    return uvloop.run(coro)
