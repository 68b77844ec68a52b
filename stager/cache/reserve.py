"""Room kept on the cache's disk for its index: a reserve file, given up when sqlite needs the room.

sqlite in WAL mode writes before it can do anything: opening the index sizes
its ``-shm`` file, each commit appends to the ``-wal`` file, and even a
transaction that only deletes rows (an eviction) writes pages first. On a
full disk those fail ("database or disk is full", or "disk I/O error" when the
``-shm`` file cannot grow), and a cache in that state could neither record a
block nor evict one to make room, nor even show its status.

So the cache keeps ``index.reserve``, a small file of allocated blocks, and
the tier's disk check counts its room as taken: the cache's own blobs never
eat it. When sqlite fails for want of room (the disk was filled by another
program, or the index grew), the index deletes the reserve and tries once
more; the reserve is made again once the disk has room for it twice over.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from pathlib import Path

from .fileio import allocate

log = logging.getLogger(__name__)

RESERVE_FILE = "index.reserve"
MIN_RESERVE = 128 * 1024
MAX_RESERVE = 4 * 1024 * 1024
#: Seconds between attempts to make a missing reserve again (each one is a statvfs, maybe a write).
RETRY_EVERY = 1.0


def reserve_size(disk_bytes: int) -> int:
    """The reserve for a disk of ``disk_bytes``: 1/128 of it, within [128 KiB, 4 MiB].

    A commit of the index needs a few pages, an open a 32 KiB ``-shm`` file; a
    few MiB also cover a WAL that grew to its checkpoint size.
    """
    return max(MIN_RESERVE, min(MAX_RESERVE, disk_bytes // 128 // 4096 * 4096))


class IndexReserve:
    """The reserve file of one cache directory (thread-safe; several processes may share it)."""

    def __init__(self, root: Path) -> None:
        self.path = Path(root) / RESERVE_FILE
        st = os.statvfs(root)
        self.nbytes = reserve_size(st.f_blocks * st.f_frsize)
        self._lock = threading.Lock()
        self._next_try = 0.0

    @property
    def present(self) -> bool:
        return self.path.exists()

    def disk_room(self) -> int:
        """Bytes blobs may still take on the disk: its free space less a reserve's worth of headroom
        for the index to grow, and less the reserve itself while it is missing (to make it again)."""
        st = os.statvfs(self.path.parent)
        room = st.f_bavail * st.f_frsize - self.nbytes
        if not self.present:
            room -= self.nbytes
        return room

    def ensure(self) -> bool:
        """Make the reserve if it is missing and the disk has room for it twice over; True if it exists.

        Best effort and cheap when the reserve exists (one stat). A missing one is
        tried again at most every ``RETRY_EVERY`` seconds.
        """
        if self.present:
            return True
        with self._lock:
            now = time.monotonic()
            if now < self._next_try:
                return False
            self._next_try = now + RETRY_EVERY
            try:
                st = os.statvfs(self.path.parent)
                if st.f_bavail * st.f_frsize < 2 * self.nbytes:
                    return False
                self._make()
            except OSError as exc:
                log.debug("cache %s: cannot make the index reserve yet: %s", self.path.parent, exc)
                return False
        return True

    def _make(self) -> None:
        temp = self.path.with_name(f".{RESERVE_FILE}.{os.getpid()}.{os.urandom(4).hex()}")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            try:
                if not allocate(fd, self.nbytes):  # allocated blocks, not a sparse file
                    os.write(fd, bytes(self.nbytes))
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(temp, self.path)  # whole or not at all; another process's reserve is as good
        except BaseException:
            try:
                os.unlink(temp)
            except FileNotFoundError:
                pass
            raise

    def sweep(self) -> int:
        """Remove half-made reserves left by processes that died making one; returns how many."""
        if not os.path.exists("/proc/self"):
            return 0  # no way to tell a dead maker from a live one
        removed = 0
        prefix = f".{RESERVE_FILE}."
        for name in os.listdir(self.path.parent):
            if not name.startswith(prefix):
                continue
            pid = name[len(prefix):].split(".", 1)[0]
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                try:
                    os.unlink(self.path.parent / name)
                    removed += 1
                except FileNotFoundError:
                    pass
        return removed

    def release(self) -> bool:
        """Give the reserve's room back to the disk (sqlite needs it); True if there was one."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return False
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise
            return False
        log.info("cache %s: its disk is full; the index took the room kept for it", self.path.parent)
        return True
