"""The POSIX file calls the store and the cache both make: preads that survive short reads, writes
that finish (into the page cache in pieces the kernel allocates well), and directory fsyncs that
make a name durable."""

from __future__ import annotations

import errno
import os
from typing import Sequence

IOV_MAX = 1024  # buffers per pwritev (the Linux limit)
#: The most bytes one write into the page cache asks for (see :func:`write_in_pieces`).
PAGE_CACHE_WRITE = 64 * 1024


def pread_upto(fd: int, n: int, offset: int) -> bytes:
    """Up to ``n`` bytes at ``offset``: fewer only where the file ends first.

    One ``pread`` returns less than asked past 2 GiB or when the file shrinks
    under us; the rest is read until ``n`` bytes or the end of the file.
    """
    if n == 0:
        return b""
    data = os.pread(fd, n, offset)
    if len(data) == n or not data:
        return data
    chunks = [data]
    got = len(data)
    while got < n:
        chunk = os.pread(fd, n - got, offset + got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so the names created, renamed or removed in it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def cut_views(views: Sequence[memoryview], at: int) -> tuple[list[memoryview], list[memoryview]]:
    """``views`` (one run of bytes) as the views of its first ``at`` bytes and the views of the rest."""
    for i, view in enumerate(views):
        if at < view.nbytes:
            return [*views[:i], view[:at]] if at else list(views[:i]), [view[at:], *views[i + 1:]]
        at -= view.nbytes
    return list(views), []


def pwritev_all(fd: int, buffers: Sequence[bytes | bytearray | memoryview], offset: int) -> None:
    """Write ``buffers`` one after the other from ``offset``, in one system call when the disk allows."""
    views = [memoryview(b).cast("B") for b in buffers]
    views = [v for v in views if v.nbytes]
    while views:
        written = os.pwritev(fd, views[:IOV_MAX], offset)
        if written <= 0:  # pragma: no cover - pwritev reports errors by raising
            raise OSError(errno.EIO, "pwritev wrote nothing")
        offset += written
        while views and written >= views[0].nbytes:  # drop what went out, keep the rest of a cut buffer
            written -= views[0].nbytes
            views.pop(0)
        if written:
            views[0] = views[0][written:]


def write_in_pieces(fd: int, buffers: Sequence[bytes | bytearray | memoryview], offset: int,
                    piece: int = PAGE_CACHE_WRITE) -> None:
    """:func:`pwritev_all` in system calls of at most ``piece`` bytes: for writes into the page cache.

    The kernel sizes the page-cache folios of a write by its length, so a 1 MiB write takes 1 MiB
    folios: high-order pages, which on a virtual machine that hands its free memory back to the
    host are the ones the host must fault in again. Measured on such a machine: 1 MiB writes
    cost 1.6 to 1.7 CPU s per GiB, 64 KiB writes 0.4 to 0.7, the extra system calls included.
    """
    views = [memoryview(b).cast("B") for b in buffers]
    while views:
        head, views = cut_views(views, piece)
        pwritev_all(fd, head, offset)
        offset += sum(view.nbytes for view in head)
