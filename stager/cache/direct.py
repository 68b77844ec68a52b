"""Writes that bypass the page cache (``O_DIRECT``), for the bytes a fetch stages.

Staged bytes are written once and read later (often much later, or by another
process), so copying them into the page cache on the way to the disk is pure
cost: on the machines we measured, that copy was most of the CPU time of
staging, more than receiving and hashing the bytes.

``O_DIRECT`` needs aligned memory, offsets and lengths. A :class:`DirectWriter`
writes the whole pages of a view whose address is congruent to its file
offset modulo the page straight from the view (the HTTP client receives
bodies so placed, see :mod:`stager.store.wire`), and copies the rest into a
page-aligned buffer of its thread to write them from there.

Only whole aligned pages go this way: the unaligned head and tail of a write
(a blob's last bytes, blocks whose size is not a multiple of the page) go
through the ordinary file descriptor. A page is therefore never written one way
by one write and the other way by a concurrent one: writes never cross a block
boundary, and a page that straddles one is always written through the page
cache. Readers see the bytes either way; the kernel keeps direct writes and
the page cache coherent.

Where the filesystem refuses ``O_DIRECT`` (tmpfs on older kernels, some
network filesystems), :func:`open_direct` returns None, or the first write
fails with EINVAL; the caller then writes through the page cache.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
from typing import Sequence

import numpy as np

from ..diskio import IOV_MAX, cut_views, pwritev_all

#: Alignment of memory, file offsets and lengths for direct writes (the largest logical block in use).
ALIGN = 4096
#: Size of each thread's aligned buffer; a larger write goes in several system calls.
BUFFER_BYTES = 1 << 20
#: A view placed congruent to the file but holding fewer whole pages than this is copied anyway.
DIRECT_FROM_VIEW = 64 * 1024

_REFUSED = {errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP}


class DirectRefused(OSError):
    """The filesystem refused a direct write (alignment or no ``O_DIRECT`` support): write buffered."""


def open_direct(path: str | os.PathLike[str]) -> int | None:
    """A write-only ``O_DIRECT`` descriptor on ``path``, or None where that cannot be had (no
    ``O_DIRECT`` support, or any other error: the caller's ordinary descriptor then does the writing)."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        return os.open(path, os.O_WRONLY | os.O_CLOEXEC | flag)
    except OSError:
        return None


class DirectWriter:
    """Writes the aligned middle of each write with ``O_DIRECT``; one aligned buffer per thread."""

    def __init__(self) -> None:
        self._local = threading.local()

    def _buffer(self) -> np.ndarray:
        buffer = getattr(self._local, "buffer", None)
        if buffer is None:
            private = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS  # not shmem, as a plain anonymous map is
            buffer = np.frombuffer(mmap.mmap(-1, BUFFER_BYTES, flags=private), dtype=np.uint8)  # page-aligned
            self._local.buffer = buffer
        return buffer

    def write(self, direct_fd: int, buffered_fd: int, buffers: Sequence[memoryview], offset: int) -> None:
        """Write ``buffers`` one after the other from ``offset``: whole aligned pages through
        ``direct_fd``, the unaligned head and tail (if any) through ``buffered_fd``.

        Raises:
            DirectRefused: the filesystem refused the direct write (nothing was written by it).
            OSError: any other error (disk full, I/O error).
        """
        length = sum(view.nbytes for view in buffers)
        first = -(-offset // ALIGN) * ALIGN  # the first aligned byte
        last = (offset + length) // ALIGN * ALIGN  # the end of the last whole page
        if last <= first:  # not one whole page: all through the page cache
            pwritev_all(buffered_fd, buffers, offset)
            return
        head, rest = cut_views(buffers, first - offset)
        middle, tail = cut_views(rest, last - first)
        if head:
            pwritev_all(buffered_fd, head, offset)
        self._write_aligned(direct_fd, buffered_fd, middle, first)
        if tail:
            pwritev_all(buffered_fd, tail, last)

    def _write_aligned(self, fd: int, buffered_fd: int, views: list[memoryview], offset: int) -> None:
        """Write ``views`` (whole pages from the aligned ``offset``) in one ``pwritev``: the pages of
        a view placed congruent to the file straight from it, the rest copied into this thread's
        aligned buffer (the pages that straddle two views, and views placed otherwise)."""
        buffer = self._buffer()
        iov: list[memoryview] = []  # every entry page-aligned in memory and length
        filled = 0  # bytes of the buffer in use
        run = 0  # where the buffer's current run (not yet in ``iov``) begins
        at = offset  # file offset of the next view
        for view in views:
            source = np.frombuffer(view, dtype=np.uint8)
            if (source.ctypes.data - at) % ALIGN == 0:
                first = -at % ALIGN  # the view's first and last page boundaries, relative to it
                last = source.size - (at + source.size) % ALIGN
                if last - first >= DIRECT_FROM_VIEW:
                    buffer[filled:filled + first] = source[:first]  # completes the run's last page
                    filled += first
                    if filled > run:
                        iov.append(memoryview(buffer)[run:filled])
                    iov.append(view[first:last])
                    run = filled
                    source = source[last:]
                    at += last
            at += source.size
            while source.size:
                take = min(source.size, BUFFER_BYTES - filled)
                buffer[filled:filled + take] = source[:take]  # numpy copies without holding the GIL
                filled += take
                source = source[take:]
                if filled == BUFFER_BYTES:  # full: write what is gathered, then use the buffer again
                    iov.append(memoryview(buffer)[run:filled])
                    offset = self._pwritev(fd, buffered_fd, iov, offset)
                    iov, filled, run = [], 0, 0
        if filled > run:
            iov.append(memoryview(buffer)[run:filled])
        if iov:
            self._pwritev(fd, buffered_fd, iov, offset)

    @staticmethod
    def _pwritev(fd: int, buffered_fd: int, iov: list[memoryview], offset: int) -> int:
        """Write ``iov`` (whole pages) at ``offset`` (aligned) with ``O_DIRECT``; the offset after it."""
        end = offset + sum(len(view) for view in iov)
        while iov:
            try:
                written = os.pwritev(fd, iov[:IOV_MAX], offset)
            except OSError as exc:
                if exc.errno in _REFUSED:
                    raise DirectRefused(exc.errno, f"direct write refused: {exc.strerror}") from exc
                raise
            if written <= 0:  # pragma: no cover - pwritev reports errors by raising
                raise OSError(errno.EIO, "direct write wrote nothing")
            offset += written
            while iov and written >= len(iov[0]):
                written -= len(iov[0])
                iov = iov[1:]
            if written:
                iov[0] = iov[0][written:]
            if iov and offset % ALIGN:  # a short write (the disk filling up): the rest, unaligned, goes buffered
                pwritev_all(buffered_fd, iov, offset)  # and says why it cannot (ENOSPC) if it cannot
                return end
        return end
