"""Positional file I/O that finishes its job, and the one place OSError becomes CacheError."""

from __future__ import annotations

import ctypes
import errno
import os
import sqlite3

from ..diskio import pread_upto
from ..errors import CacheError, DiskFull

_DISK_FULL = {errno.ENOSPC, errno.EDQUOT}


def _libc_fallocate():
    """Linux's ``fallocate(2)``, or None. Not ``os.posix_fallocate``: where the file system cannot
    allocate, glibc emulates it by writing a byte into every block, slow on network file systems."""
    try:  # the process's own symbols, libc's among them (find_library would run ldconfig at every start-up)
        libc = ctypes.CDLL(None, use_errno=True)
        fallocate = libc.fallocate
    except (OSError, AttributeError):
        return None
    fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fallocate.restype = ctypes.c_int
    return fallocate


_FALLOCATE = _libc_fallocate()


def allocate(fd: int, length: int) -> bool:
    """Allocate the disk blocks of ``[0, length)`` of ``fd`` (the data stays as it is); False where
    the file system (or the platform) cannot allocate ahead of the writes.

    Raises:
        OSError: the disk has no room for them (ENOSPC, EDQUOT), or another error.
    """
    if _FALLOCATE is None or length <= 0:
        return False
    if _FALLOCATE(fd, 0, 0, length) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
        return False
    raise OSError(code, os.strerror(code))


def pread_exact(fd: int, length: int, offset: int) -> bytes:
    """Read exactly ``length`` bytes at ``offset``.

    Raises:
        CacheError: the file ends first (it was truncated behind our back).
    """
    data = pread_upto(fd, length, offset)
    if len(data) != length:
        raise CacheError(f"short read: wanted {length} bytes at offset {offset}, the file ends after {len(data)}")
    return data


def readinto_exact(fd: int, view: memoryview, offset: int) -> None:
    """Fill ``view`` from ``offset`` (large sequential reads, no copy).

    Raises:
        CacheError: the file ends first.
    """
    got = 0
    total = len(view)
    while got < total:
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:
            raise CacheError(f"short read: wanted {total} bytes at offset {offset}, the file ends after {got}")
        got += n


def os_error(exc: OSError, what: str) -> CacheError:
    """Translate an OSError met while doing ``what``; ENOSPC/EDQUOT become :class:`DiskFull`."""
    if exc.errno in _DISK_FULL:
        err: CacheError = DiskFull(f"{what}: the disk is full ({os.strerror(exc.errno)})")
    else:
        err = CacheError(f"{what}: {exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename else ""))
    err.errno = exc.errno  # kept for callers; filename and strerror stay unset so str() is the message alone
    return err


def is_disk_full(exc: sqlite3.Error) -> bool:
    """Whether sqlite failed for want of disk space (SQLITE_FULL)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF == sqlite3.SQLITE_FULL


def sqlite_error(exc: sqlite3.Error, what: str) -> CacheError:
    """Translate a sqlite3 error met while doing ``what``; SQLITE_FULL becomes :class:`DiskFull`."""
    if is_disk_full(exc):
        err: CacheError = DiskFull(f"{what}: the disk holding the cache index is full")
        err.errno = errno.ENOSPC
        return err
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF == sqlite3.SQLITE_BUSY:
        return CacheError(f"{what}: the cache index stayed locked by another process for too long")
    return CacheError(f"{what}: cache index error: {exc}")
