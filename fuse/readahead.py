"""Read-ahead for the mount: infer sequential access, and stage what comes next as a plan.

A reader of a mounted dataset does not tell us its future; its reads do. Two
signals count as sequential:

- inside one open file, reads that follow each other (each starting within
  ``SLACK`` bytes of where the previous ones ended; the kernel's own
  read-ahead sends them slightly out of order) ``STREAK`` times in a row,
  having read at least half of the bytes they span;
- across files, a file read from its start right after the file before it
  in walk order was read from its start to its end (``cp -r``, ``tar``,
  ``rsync``, ``sha256sum *`` walk the tree in that order) -- so small files
  that fit in one read count too, but not a random reader that happens to
  read the first bytes of two files in a row.

On either signal, the file's position in the walk order gets a *stream*: a
plan (``Session.plan``) over the next ``files`` files from there, whose
prefetcher stages the rest of the current file (every missing block, nearest
first) and the next files. Like the kernel's own read-ahead, the window ramps
up: ``first_window`` bytes (the current file is always staged whole), so that
the blocks the reader needs next do not share the origin's bandwidth with the
distant future, then ``ramp`` times more each time the reader moves on to the
next file, up to ``window_bytes`` (each step makes a new plan from the
reader's position; fetches in flight are shared and go on).
While reads stay inside a stream's files it only advances (which also tells
the cache those files were consumed), and only a read at the start of a later
file, or one that follows the previous read of its handle, moves it on and
widens its window: a random reader whose reads happen to look like a walk for
a moment (three adjacent reads) must not ramp a stream up to the whole
dataset by touching the files after it. ``STRAYS`` reads in a row inside a
stream's files that follow nothing (not adjacent to their handle's previous
read, nor at a file's start, or more than ``NEXT`` files past the reader)
close it. Reads elsewhere start another stream; the least recently
used of more than ``streams`` streams is closed. Random reads start nothing:
they fetch only the blocks they touch.

All bookkeeping is synchronous and cheap (called on every read); plans are
made, advanced and closed by one background task, in order.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import numpy as np

from stager.session import DatasetHandle, PlanHandle, Session

log = logging.getLogger(__name__)

SLACK = 1 << 20  # bytes a "next" read may start before or after the end of the previous ones
STREAK = 3  # adjacent reads in a row (the first from offset 0 counts) that make a file's access sequential
STRAYS = 3  # reads in a row inside a stream's files that follow nothing: the stream was a false start
NEXT = 16  # a read this many files past a stream's reader still follows it (several readers walking together)


@dataclass(frozen=True, slots=True)
class ReadAheadConfig:
    """How far the mount reads ahead of a sequential reader."""

    window_bytes: int = 512 << 20  # the most bytes staged ahead of a reader (0: no read-ahead)
    first_window: int = 8 << 20  # bytes ahead when a stream starts (the current file is always staged)...
    ramp: int = 4  # ... times this each time the reader moves on to the next file
    files: int = 64  # files per stream (the plan's length)
    streams: int = 8  # plans alive at once

    def __post_init__(self) -> None:
        if self.window_bytes < 0 or self.first_window < 0 or self.ramp < 1 or self.files < 1 or self.streams < 1:
            raise ValueError(f"bad read-ahead settings: {self}")


class Access:
    """One open file's recent reads: are they sequential?"""

    __slots__ = ("end", "streak", "origin", "covered")

    def __init__(self) -> None:
        self.end = -1
        self.streak = 0
        self.origin = -1  # where the current run of adjacent reads began (0: the file's start)
        self.covered = 0  # bytes read in that run (at most end - origin)

    def observe(self, offset: int, size: int) -> bool:
        """Record a read; True once the reads look sequential: ``STREAK`` adjacent reads in a row that read
        at least half of the bytes they span (small random reads a few blocks apart are adjacent too, but
        leave most of their span unread)."""
        if self.end >= 0 and self.end - SLACK <= offset <= self.end + SLACK:
            self.streak += 1
            self.end = max(self.end, offset + size)
            self.covered = min(self.covered + size, self.end - self.origin)
        else:
            self.streak = 1 if offset == 0 else 0
            self.origin = offset
            self.end = offset + size
            self.covered = size
        return self.streak >= STREAK and 2 * self.covered >= self.end - self.origin


class _Stream:
    __slots__ = ("start", "stop", "plan", "base", "window", "planned", "target", "advanced", "used", "strays")

    def __init__(self, start: int, stop: int) -> None:
        self.start = start  # walk positions [start, stop)
        self.stop = stop
        self.plan: PlanHandle | None = None
        self.base = start  # the walk position of the plan's position 0
        self.window = 0  # bytes ahead wanted (0: the current file only), grows as the reader goes on
        self.planned = -1  # the window the plan was made with
        self.target = start  # the reader is at this position
        self.advanced = start  # the plan was told about this one
        self.used = time.monotonic()
        self.strays = 0  # reads in a row in its files that followed nothing


class ReadAhead:
    """Streams of read-ahead over one dataset's walk order (see the module docstring)."""

    def __init__(self, session: Session, dataset: DatasetHandle, order: np.ndarray, position: np.ndarray,
                 config: ReadAheadConfig = ReadAheadConfig()) -> None:
        self.session = session
        self.dataset = dataset
        self.order = order  # manifest indexes in walk order
        self.position = position  # walk position of each manifest index
        self.config = config
        self._streams: list[_Stream] = []
        self.sizes = dataset.manifest.sizes
        self._last_read = -2  # walk position of the last file read from its start to its end
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing: list[_Stream] = []
        self.plans_made = 0

    def start(self) -> None:
        if self._task is None and self.config.window_bytes > 0:
            self._task = asyncio.create_task(self._run(), name="mount read-ahead")

    def on_read(self, index: int, access: Access, offset: int, size: int) -> None:
        """Note a read of ``size`` bytes at ``offset`` of file ``index`` through one open handle."""
        if self._task is None:
            return
        sequential = access.observe(offset, size)
        pos = int(self.position[index])
        if offset == 0 and pos == self._last_read + 1:
            sequential = True  # the next file in walk order, from its start
        if access.origin == 0 and access.end >= int(self.sizes[index]):
            self._last_read = pos  # read from its start to its end
        stream = self._stream_at(pos)
        if stream is not None:
            stream.used = time.monotonic()
            if access.streak == 0 or pos > stream.target + NEXT:  # follows nothing: random access
                stream.strays += 1
                if stream.strays >= STRAYS:
                    self._streams.remove(stream)
                    self._closing.append(stream)
                    self._wake.set()
                return
            stream.strays = 0
            if pos > stream.target:
                stream.target = pos
                stream.window = min(self.config.window_bytes, max(1, stream.window * self.config.ramp))
                self._wake.set()
        elif sequential:
            stream = _Stream(pos, min(pos + self.config.files, len(self.order)))
            stream.window = min(self.config.first_window, self.config.window_bytes)
            self._streams.append(stream)
            self._wake.set()

    def _stream_at(self, pos: int) -> _Stream | None:
        for stream in self._streams:
            if stream.start <= pos < stream.stop:
                return stream
        return None

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while len(self._streams) > self.config.streams:  # the least recently used go
                oldest = min(self._streams, key=lambda s: s.used)
                self._streams.remove(oldest)
                self._closing.append(oldest)
            for stream in self._closing:
                if stream.plan is not None:
                    await self._quietly(stream.plan.close(), "closing a read-ahead plan")
            self._closing.clear()
            for stream in list(self._streams):
                if stream.window > stream.planned:
                    await self._replan(stream)
                elif stream.target > stream.advanced and stream.plan is not None:
                    stream.advanced = stream.target
                    await self._quietly(stream.plan.advance(stream.target - stream.base), "advancing read-ahead")

    async def _replan(self, stream: _Stream) -> None:
        """A plan from the reader's position with the stream's (grown) window; the old one goes.

        Blobs the old plan was fetching keep coming: fetches are shared and outlive their plans.
        """
        old = stream.plan
        plan = await self._quietly(self.session.plan(
            self.dataset, self.order[stream.target:stream.stop], window_bytes=max(1, stream.window),
            name=f"mount-readahead-{self.plans_made}"), "starting read-ahead")
        if plan is None:
            if stream in self._streams:
                self._streams.remove(stream)
        elif stream not in self._streams:  # closed while its plan was being made (strays, or too many streams)
            self.plans_made += 1
            await self._quietly(plan.close(), "closing a read-ahead plan")
        else:
            stream.plan, stream.base, stream.planned, stream.advanced = plan, stream.target, stream.window, stream.target
            self.plans_made += 1
        if old is not None:
            await self._quietly(old.close(), "closing a read-ahead plan")

    @staticmethod
    async def _quietly(awaitable, what: str):
        """Read-ahead is a hint: its failures are logged, never raised into a read."""
        try:
            return await awaitable
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - see the docstring
            log.warning("%s failed: %s", what, exc)
            return None

    async def close(self) -> None:
        """Stop every stream's prefetching."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        for stream in self._streams + self._closing:
            if stream.plan is not None:
                await self._quietly(stream.plan.close(), "closing a read-ahead plan")
        self._streams.clear()
        self._closing.clear()
