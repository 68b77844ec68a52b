"""The POSIX file calls the store and the cache both make: preads that survive short reads, and
directory fsyncs that make a name durable."""

from __future__ import annotations

import os


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
