"""Progress of a long command (stage, index, replicate, the demo): a bar on a terminal, lines in a log.

On a terminal, progress is a rich bar (bytes, rate, ETA). Anywhere else (a
batch job's log, a pipe) a bar is noise: a plain line is written every
:data:`LINE_INTERVAL` seconds and once at the end, and rich is never imported
(a twentieth of a second of start-up).
"""

from __future__ import annotations

import functools
import sys
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    from rich.console import Console

#: Seconds between two progress lines when stderr is not a terminal.
LINE_INTERVAL = 10.0


@functools.cache
def stderr_console() -> Console:
    """The rich console on stderr (tables, coloured lines), made on first use."""
    from rich.console import Console

    return Console(stderr=True)


class ByteProgress:
    """Progress in bytes of a command; ``describe`` puts counts (files, retries) beside the label."""

    def __init__(self, label: str) -> None:
        self._label = label

    def set_total(self, files: int, total_bytes: int) -> None:
        raise NotImplementedError

    def advance(self, nbytes: int) -> None:
        raise NotImplementedError

    def describe(self, text: str) -> None:
        raise NotImplementedError


class _BarProgress(ByteProgress):
    def __init__(self, label: str, progress: Any) -> None:
        super().__init__(label)
        self._progress = progress
        self._task = progress.add_task(label, total=None)

    def set_total(self, files: int, total_bytes: int) -> None:
        self._progress.update(self._task, total=total_bytes, description=f"{self._label} {files} files")

    def advance(self, nbytes: int) -> None:
        self._progress.advance(self._task, nbytes)

    def describe(self, text: str) -> None:
        self._progress.update(self._task, description=f"{self._label} {text}")


class _LineProgress(ByteProgress):
    """``staging 32 files, 0 retries: 512.0/1,073.7 MB (48%), 350.2 MB/s, 0:00:01 left`` now and then."""

    def __init__(self, label: str) -> None:
        super().__init__(label)
        self._description = label
        self._total: int | None = None
        self._done = 0
        self._began = self._last_line = time.monotonic()

    def set_total(self, files: int, total_bytes: int) -> None:
        self._total = total_bytes
        self._description = f"{self._label} {files} files"

    def advance(self, nbytes: int) -> None:
        self._done += nbytes
        self._maybe_write()

    def describe(self, text: str) -> None:
        self._description = f"{self._label} {text}"
        self._maybe_write()

    def _maybe_write(self) -> None:
        if time.monotonic() - self._last_line >= LINE_INTERVAL:
            self.write()

    def write(self) -> None:
        now = time.monotonic()
        self._last_line = now
        rate = self._done / max(now - self._began, 1e-9)
        parts = [f"{self._done / 1e6:,.1f}" + (f"/{self._total / 1e6:,.1f} MB" if self._total else " MB")]
        if self._total:
            parts[0] += f" ({self._done / self._total:.0%})"
        parts.append(f"{rate / 1e6:,.1f} MB/s")
        if self._total and rate > 0 and self._done < self._total:
            left = int((self._total - self._done) / rate)
            parts.append(f"{left // 3600}:{left // 60 % 60:02d}:{left % 60:02d} left")
        print(f"{self._description}: {', '.join(parts)}", file=sys.stderr, flush=True)


@contextmanager
def byte_progress(label: str) -> Iterator[ByteProgress]:
    """A rich bar when stderr is a terminal, else a line every :data:`LINE_INTERVAL` s and one at the end."""
    if not sys.stderr.isatty():
        lines = _LineProgress(label)
        try:
            yield lines
        finally:
            lines.write()
        return
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                               TransferSpeedColumn)

    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        TimeRemainingColumn(), console=stderr_console(), transient=False,
    )
    with progress:
        yield _BarProgress(label, progress)

