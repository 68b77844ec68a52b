"""Per-blob locks: one fetch (or one eviction) of a blob at a time, across threads and processes.

Two layers. In one process, a :class:`LockTable` (a set under a condition
variable) makes threads wait for each other without polling. Across
processes, an exclusive ``flock`` on ``locks/<digest>.lock``: the kernel drops
it when its holder dies, even by SIGKILL, so a dead fetcher never blocks the
blob. Lock files do not pile up: the holder unlinks the file before unlocking,
and a taker checks, once it holds the flock, that the file it locked is still
the one at the path (else it lost that race and retries on the new file).

flock has no timed wait, so a blocking acquire polls the cross-process layer
with a short exponential backoff (1 ms up to 50 ms).
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path

from ..errors import CacheError
from .fileio import os_error

_POLL_MIN = 0.001
_POLL_MAX = 0.05
_RACE_RETRIES = 16  # lost unlink races in a row before giving up a try (never seen in practice)


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

    def __init__(self, table: LockTable, path: Path, digest: str) -> None:
        self._table = table
        self._path = path
        self.digest = digest
        self._fd: int | None = None
        self._guard = threading.Lock()

    @property
    def locked(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

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
            if self._fd is not None:
                raise CacheError(f"blob lock {self.digest} is already held by this BlobLock")
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        if timeout is not None and timeout <= 0:
            if not self._table.try_take(self.digest):
                return False
        elif not self._table.take(self.digest, deadline):
            return False
        try:
            fd = self._flock_until(deadline)
        except BaseException:
            self._table.give(self.digest)
            raise
        if fd is None:
            self._table.give(self.digest)
            return False
        with self._guard:
            self._fd = fd
        return True

    def _flock_until(self, deadline: float | None) -> int | None:
        delay = _POLL_MIN
        while True:
            try:
                fd = try_flock(self._path)
            except OSError as exc:
                raise os_error(exc, f"cannot lock blob {self.digest} ({self._path})") from exc
            if fd is not None:
                return fd
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
            fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            unflock(self._path, fd)
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
