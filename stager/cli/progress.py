"""Progress bars (rich) and running a coroutine on uvloop for the commands."""

from __future__ import annotations

import asyncio
import sys
from contextlib import contextmanager
from typing import Any, Coroutine, Iterator, TypeVar

from rich.console import Console
from rich.progress import (BarColumn, DownloadColumn, Progress, TaskID, TextColumn, TimeRemainingColumn,
                           TransferSpeedColumn)

T = TypeVar("T")

console = Console(stderr=True)


class ByteProgress:
    """A bytes bar with rate and ETA; ``extra`` fields show in the description (files, retries)."""

    def __init__(self, progress: Progress, task: TaskID, label: str) -> None:
        self._progress = progress
        self._task = task
        self._label = label

    def set_total(self, files: int, total_bytes: int) -> None:
        self._progress.update(self._task, total=total_bytes, description=f"{self._label} {files} files")

    def advance(self, nbytes: int) -> None:
        self._progress.advance(self._task, nbytes)

    def describe(self, text: str) -> None:
        self._progress.update(self._task, description=f"{self._label} {text}")


@contextmanager
def byte_progress(label: str) -> Iterator[ByteProgress]:
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        TimeRemainingColumn(), console=console, transient=False,
    )
    with progress:
        task = progress.add_task(label, total=None)
        yield ByteProgress(progress, task, label)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on uvloop (asyncio's loop where uvloop is missing)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency, but stay usable without it
        return asyncio.run(coro)
    if sys.version_info >= (3, 12):
        return asyncio.run(coro, loop_factory=uvloop.new_event_loop)
    return uvloop.run(coro)
