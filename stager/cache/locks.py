"""Per-blob locks: one fetch (or one eviction) of a blob at a time, across threads and processes.

Two layers. In one process, a :class:`LockTable` (a set under a condition
variable) makes threads wait for each other without polling. Across
processes, a :class:`LockRanges`: an open-file-description lock
(``F_OFD_SETLK``) on one byte of ``locks/blobs.ranges``, at an offset made of
the blob's digest (its first 60 bits). The kernel drops it when its holder
dies, even by SIGKILL, so a dead fetcher never blocks the blob, and nothing is
created or removed per blob: a lock file per blob (created, flocked and
unlinked at every fetch) cost about a tenth of a second of kernel time per
thousand blobs on ext4, whose inode allocator scans for recently deleted inodes
at every create. Two blobs whose digests share 60 bits would share a lock
(taking turns, never both at once); that takes about 2**30 blobs locked at
once to happen by chance.

Where a file system refuses open-file-description locks, each blob has an
exclusive ``flock`` on ``locks/<digest>.lock`` instead, as stager did before:
the holder unlinks the file before unlocking, and a taker checks, once it
holds the flock, that the file it locked is still the one at the path (else
it lost that race and retries on the new file). A stager that locks so and
one that locks by ranges do not see each other's locks: do not let both
fetch into one cache at once (with a node daemon, only the daemon fetches).

Neither kind has a timed wait, so a blocking acquire polls the cross-process
layer with a short exponential backoff (1 ms up to 50 ms).
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import threading
import time
import weakref
from pathlib import Path

from ..errors import CacheError
from .fileio import os_error

_POLL_MIN = 0.001
_POLL_MAX = 0.05
_RACE_RETRIES = 16  # lost unlink races in a row before giving up a try (never seen in practice)
#: The file whose bytes are the blobs' locks, in the cache's ``locks/``.
RANGES_FILE = "blobs.ranges"
_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", None)
#: ``struct flock``: l_type, l_whence, l_start, l_len, l_pid (0 for open-file-description locks).
_FLOCK = struct.Struct("@hhqqi")
_FLOCK_SIZE = -(-_FLOCK.size // 8) * 8  # its trailing padding
#: errno values that mean the file system has no open-file-description locks.
_UNSUPPORTED = {errno.EINVAL, errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS}


class LockTable:
    """The in-process layer: which digests some thread of this process holds."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._held: set[str] = set()

    def try_take(self, key: str) -> bool:
        with self._cond:
            if key in self._held:
                return False
            self._held.add(key)
            return True

    def take(self, key: str, deadline: float | None) -> bool:
        """Wait until ``key`` is free and take it; False if ``deadline`` (monotonic) passes first."""
        with self._cond:
            while key in self._held:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
            self._held.add(key)
            return True

    def give(self, key: str) -> None:
        with self._cond:
            self._held.discard(key)
            self._cond.notify_all()

    def held(self, key: str) -> bool:
        with self._cond:
            return key in self._held


def range_offset(digest: str) -> int:
    """The byte of :data:`RANGES_FILE` that is ``digest``'s lock."""
    return int(digest[:15], 16)


def _flock_struct(kind: int, offset: int) -> bytes:
    return _FLOCK.pack(kind, os.SEEK_SET, offset, 1, 0).ljust(_FLOCK_SIZE, b"\0")


_OPEN_RANGES: "weakref.WeakSet[LockRanges]" = weakref.WeakSet()


class LockRanges:
    """The cross-process locks of one cache's blobs: a byte each of one file, locked through one
    open file description per :class:`LockRanges` (the in-process :class:`LockTable` keeps two
    threads from locking one byte through it).

    A forked child closes its copy of the descriptor (the parent's locks stay the parent's: they
    go only when the last descriptor of that open file is closed, and a child that outlives a
    dead parent would otherwise keep them) and opens its own if it locks anything.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd: int | None = None
        self._guard = threading.Lock()
        self.usable = _OFD_SETLK is not None
        _OPEN_RANGES.add(self)

    def try_lock(self, digest: str) -> bool | None:
        """Lock ``digest``'s byte if no other open file holds it; False if one does, None if the file
        system refuses these locks (:attr:`usable` turns False: lock by files instead).

        Raises:
            OSError: the file cannot be opened.
        """
        try:
            fcntl.fcntl(self._descriptor(), _OFD_SETLK, _flock_struct(fcntl.F_WRLCK, range_offset(digest)))
        except (BlockingIOError, PermissionError):  # EAGAIN, EACCES: held through another open file
            return False
        except OSError as exc:
            if exc.errno in _UNSUPPORTED:
                self.usable = False
                return None
            raise
        return True

    def unlock(self, digest: str) -> None:
        with self._guard:
            fd = self._fd
        if fd is not None:
            fcntl.fcntl(fd, _OFD_SETLK, _flock_struct(fcntl.F_UNLCK, range_offset(digest)))

    def _descriptor(self) -> int:
        with self._guard:
            if self._fd is None:
                self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            return self._fd

    def close(self) -> None:
        """Close the descriptor: every lock taken through it goes."""
        with self._guard:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def _forget_in_child(self) -> None:
        fd, self._fd = self._fd, None
        self._guard = threading.Lock()  # another thread may have held it at the fork
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass


def _after_fork_in_child() -> None:
    for ranges in list(_OPEN_RANGES):
        ranges._forget_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def try_flock(path: Path) -> int | None:
    """Take an exclusive flock on ``path`` without waiting; the open fd, or None if someone holds it."""
    for _ in range(_RACE_RETRIES):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        try:
            st = os.stat(path)
        except FileNotFoundError:
            os.close(fd)  # the holder we waited for unlinked it: lock the new file
            continue
        fst = os.fstat(fd)
        if (st.st_ino, st.st_dev) == (fst.st_ino, fst.st_dev):
            return fd
        os.close(fd)
    return None


def unflock(path: Path, fd: int) -> None:
    """Release a lock taken by :func:`try_flock`: unlink the file first, then unlock by closing."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


class BlobLock:
    """Exclusive right to fetch, commit or evict one blob; held by one thread of one process.

    Not re-entrant. May be released from another thread than the one that
    acquired it (the async engine waits in a worker thread). After acquiring,
    re-check the blob's state: another process may have completed it.
    """

    def __init__(self, table: LockTable, path: Path, digest: str, ranges: LockRanges | None = None) -> None:
        self._table = table
        self._path = path  # the blob's own lock file, where ranges are refused
        self._ranges = ranges
        self.digest = digest
        self._held: int | bool | None = None  # True: by range; an fd: by the blob's flocked file
        self._guard = threading.Lock()

    @property
    def locked(self) -> bool:
        """Whether this object holds the lock."""
        return self._held is not None

    @property
    def releases_at_once(self) -> bool:
        """Whether :meth:`release` is one system call that never waits (a byte lock, not a file to
        unlink): an event loop may call it itself."""
        return self._held is True

    def try_lock(self) -> bool:
        """Take the lock if it is free right now; True if taken."""
        return self.acquire(timeout=0)

    try_acquire = try_lock

    def acquire(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (None: for ever) for the lock; True if taken.

        Raises:
            CacheError: this object already holds it, or the lock file cannot be opened.
        """
        with self._guard:
            if self._held is not None:
                raise CacheError(f"blob lock {self.digest} is already held by this BlobLock")
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        if timeout is not None and timeout <= 0:
            if not self._table.try_take(self.digest):
                return False
        elif not self._table.take(self.digest, deadline):
            return False
        try:
            held = self._lock_until(deadline)
        except BaseException:
            self._table.give(self.digest)
            raise
        if held is None:
            self._table.give(self.digest)
            return False
        with self._guard:
            self._held = held
        return True

    def _try_once(self) -> int | bool | None:
        ranges = self._ranges
        if ranges is not None and ranges.usable:
            taken = ranges.try_lock(self.digest)
            if taken is not None:
                return True if taken else None
        return try_flock(self._path)

    def _lock_until(self, deadline: float | None) -> int | bool | None:
        delay = _POLL_MIN
        while True:
            try:
                held = self._try_once()
            except OSError as exc:
                raise os_error(exc, f"cannot lock blob {self.digest} ({self._path.parent})") from exc
            if held is not None:
                return held
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                time.sleep(min(delay, remaining))
            else:
                time.sleep(delay)
            delay = min(delay * 2, _POLL_MAX)

    def release(self) -> None:
        """Release the lock (a no-op if not held)."""
        with self._guard:
            held, self._held = self._held, None
        if held is None:
            return
        try:
            if held is True:
                self._ranges.unlock(self.digest)
            else:
                unflock(self._path, held)
        finally:
            self._table.give(self.digest)

    def __enter__(self) -> "BlobLock":
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"BlobLock({self.digest}, locked={self.locked})"


def sweep_lock_files(locks_dir: Path, table: LockTable) -> int:
    """Remove lock files nobody holds (left by processes that died holding them); returns how many."""
    removed = 0
    try:
        names = os.listdir(locks_dir)
    except FileNotFoundError:
        return 0
    for name in names:
        digest = name.removesuffix(".lock")
        if name == RANGES_FILE or digest == name:
            continue  # the ranges file is in use for as long as the cache is
        path = locks_dir / name
        if not table.try_take(digest):
            continue
        try:
            fd = try_flock(path)
            if fd is not None:
                unflock(path, fd)
                removed += 1
        except OSError:
            pass  # best effort: a lock file left behind costs an inode, nothing else
        finally:
            table.give(digest)
    return removed
