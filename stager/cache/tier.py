"""The cache tier: one facade over the layout, the index, the locks, eviction and scrubbing.

Its own job is the room: reserving a blob's size against the capacity and
the disk (evicting what must go), and removing blobs. The files of blobs being
filled and their commit are :mod:`.blob_files`'s, access times and the holds of
live processes :mod:`.access`'s, the eviction order :mod:`.eviction`'s and the
scrub :mod:`.verify`'s; the tier hands each the index and layout it needs.

Synchronous by design (sqlite and file I/O); the async engine calls the slow
methods (``begin``, ``write_block``, ``commit``, ``evict``, ``verify``) in a
bounded thread pool. Every method is thread-safe, and several processes may
open the same directory at once.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from array import array
from collections.abc import Callable, Container, Iterable, Sequence
from pathlib import Path

import xxhash

from ..config import CacheConfig
from ..errors import BlobTooLarge, CacheError, CacheFull, DiskFull
from ..hashing import block_count
from .access import AccessTimes, Holds
from .blob_files import BlobFiles
from .blob_index import BlobIndex, BlobRow, Candidate, pack_block_digests
from .eviction import Rank, VictimQueue
from .fileio import allocate, os_error
from .layout import check_digest, check_digests, new_generation, open_layout
from .liveness import boot_id
from .locks import RANGES_FILE, BlobLock, LockRanges, LockTable, sweep_lock_files
from .partial import PartialBlob
from .reconcile import ReconcileReport, reconcile, repair_partial
from .reserve import IndexReserve
from .records import BlobRecord, BlobState, CacheUsage, DatasetSummary, VerifyReport
from .verify import scrub

log = logging.getLogger(__name__)

_BEGIN_ATTEMPTS = 4  # reserve, evict, retry: another process may take the room we freed
#: A new blob's file is made ahead of its transaction only where the cache has room for this many such blobs.
EARLY_ROOM = 64


class CacheTier:
    """The node-local cache of verified blobs in one directory.

    Args:
        config: the directory and the capacity.
        reconcile: bring index and disk in line at start-up (stat only, no
            rehash). Leave on; processes that only read (data loader workers
            of a job whose main process reconciled) may turn it off.
        touch_interval: seconds between writes of access times (``touch``
            buffers them in memory meanwhile).
        busy_timeout: seconds to wait for another process's index transaction.

    Raises:
        CacheError: the directory cannot be used (not a cache, unknown format
            or schema version, unreadable index).
    """

    def __init__(self, config: CacheConfig, *, reconcile: bool = True, touch_interval: float = 1.0,
                 busy_timeout: float = 60.0) -> None:
        self.config = config
        self._layout = open_layout(config.directory)
        self.directory: Path = self._layout.root
        try:
            self._reserve = IndexReserve(self.directory)
        except OSError as exc:
            raise os_error(exc, f"{self.directory}: cannot use the cache directory") from exc
        self._index = BlobIndex(self._layout.index_path, busy_timeout=busy_timeout, reserve=self._reserve)
        self._closed = False
        self._locks = LockTable()
        self._lock_ranges = LockRanges(self._layout.locks_dir / RANGES_FILE)
        self._access = AccessTimes(self._index, touch_interval)
        self._victims = VictimQueue()
        self._evictions_lock = threading.Lock()
        self._early_lock = threading.Lock()
        self._early_bytes = 0  # partial files made ahead of their transaction, not in the index yet
        self.evicted_blobs = 0  # blobs (and their bytes) this instance evicted, for metrics
        self.evicted_bytes = 0
        try:
            self._capacity = config.capacity_bytes()
            st = os.statvfs(self.directory)
            self._unit = max(4096, st.f_frsize)
            self._boot = boot_id()
            self._holds = Holds(self._index, self._boot)
            self._files = BlobFiles(self._index, self._layout, self._boot, direct_writes=config.direct_writes)
            self._reserve.ensure()
            self.last_reconcile: ReconcileReport | None = None
            if reconcile:
                self.last_reconcile = self.reconcile()
        except BaseException:
            self._index.close()
            raise

    # -- basics -------------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """The capacity in bytes: the configured one, or less where the disk cannot hold that much
        (what the cache uses plus the room left on its disk, see :meth:`disk_room`)."""
        used = self._index.used()
        return min(self._capacity, used + max(0, self.disk_room()))

    @property
    def configured_capacity(self) -> int:
        """The capacity the configuration gives, whatever the disk holds."""
        return self._capacity

    def disk_room(self) -> int:
        """Bytes the disk holding the cache can still take for blobs: its free space less the room
        kept for the index (``reserve.py``); negative when another program filled it past that."""
        try:
            return self._reserve.disk_room()
        except OSError as exc:
            raise os_error(exc, f"{self.directory}: cannot stat the cache's disk") from exc

    def reconcile(self) -> ReconcileReport:
        """Bring index and disk in line (done at start-up); safe while other processes use the cache."""
        report = reconcile(self._index, self._layout, self._boot)
        report.lock_files_removed = sweep_lock_files(self._layout.locks_dir, self._locks)
        try:
            self._reserve.sweep()
        except OSError as exc:
            raise os_error(exc, f"{self.directory}: sweeping half-made index reserves") from exc
        report.dead_owners = self._holds.drop_dead_owners()[1]
        return report

    def usage(self) -> CacheUsage:
        """Bytes used (complete blobs' disk blocks + partial blobs' reservations), capacity (as
        :attr:`capacity`: no more than the disk can hold), counts."""
        complete, partial = self._index.counts()
        return CacheUsage(self._index.used(), self.capacity, complete, partial)

    def state(self, digest: str) -> BlobState:
        """ABSENT, PARTIAL or COMPLETE."""
        return self._index.state(check_digest(digest))

    def states(self, digests: Sequence[str]) -> dict[str, BlobState]:
        """``digest -> state`` of those of ``digests`` the cache knows (PARTIAL or COMPLETE; absent ones
        left out): for a dataset's thousands of shards, a few queries instead of one each.

        Raises:
            ValueError: one of them is not a digest.
        """
        check_digests(digests)
        return self._index.states(digests)

    def complete_path(self, digest: str) -> Path:
        """Where the complete blob lives (``blobs/ab/abcd...``): a file there is complete and verified."""
        return self._layout.complete_path(check_digest(digest))

    def record(self, digest: str) -> BlobRecord | None:
        """What the index knows about a blob, or None if it is absent."""
        row = self._index.get(check_digest(digest))
        if row is None:
            return None
        if row.state is BlobState.COMPLETE:
            verified = frozenset(range(row.block_count))
        else:
            verified = frozenset(self._index.verified(digest))
        last_access = self._access.last(digest, row.last_access)
        return BlobRecord(digest, row.state, row.size, row.block_size, row.block_count, verified, row.charged,
                          last_access, row.consumed, self._index.is_pinned(digest))

    def lock(self, digest: str) -> BlobLock:
        """The cross-process lock of one blob (one fetch at a time). Not taken yet: use
        ``with``, ``try_lock()`` or ``acquire(timeout)``, then re-check the blob's state."""
        return BlobLock(self._locks, self._layout.lock_path(check_digest(digest)), digest, self._lock_ranges)

    # -- filling ------------------------------------------------------------------------------

    @property
    def allocation_unit(self) -> int:
        """Each blob is charged against the capacity in whole units of this (the disk's fragment, 4 KiB at least)."""
        return self._unit

    def charge(self, size: int) -> int:
        """What a blob of ``size`` bytes takes of the capacity: its size in whole allocation units."""
        return -(-size // self._unit) * self._unit

    def begin(self, digest: str, size: int, block_size: int, block_digests: Sequence[int], *,
              rank: Rank | None = None, protect: Iterable[str] = frozenset(),
              unsynced: bool = False) -> PartialBlob:
        """Start (or resume) filling a blob; reserves its size against the capacity.

        Resuming keeps the blocks already verified (``PartialBlob.verified``).
        For a blob that is already complete, the handle is complete too. Call
        it holding the blob's lock, so one process fills it.

        Args:
            digest: the blob's xxh3-128, 32 lowercase hex characters.
            size: its size in bytes.
            block_size: the size of every block but the last.
            block_digests: the expected xxh3-64 of each block.
            rank, protect: passed to :meth:`evict` if room must be made (``protect`` is not looked
                at otherwise).
            unsynced: its blocks will be recorded without fdatasync (``durable=False``): a new
                blob's row says so from the start, so recording each block is one statement.

        Raises:
            ValueError: bad digest, size, block size or block digest count.
            BlobTooLarge: the blob is larger than the whole capacity.
            CacheFull: no room even after eviction, or the disk is full.
            CacheError: an I/O or index error.
        """
        check_digest(digest)
        if size < 0 or block_size <= 0:
            raise ValueError(f"blob {digest}: bad size {size} or block size {block_size}")
        if len(block_digests) != block_count(size, block_size):
            raise ValueError(f"blob {digest}: {len(block_digests)} block digests for "
                             f"{block_count(size, block_size)} blocks")
        packed = pack_block_digests(block_digests)
        need = self.charge(size)
        if need > self._capacity:
            raise BlobTooLarge(f"blob {digest} ({size} bytes) is larger than the whole cache "
                               f"({self._capacity} bytes) at {self.directory}")
        protected: frozenset[str] | None = None  # looked at only if room must be made
        self._reserve.ensure()
        short_on_disk = False
        for _ in range(_BEGIN_ATTEMPTS):
            handle, deficit, short_on_disk = self._begin_once(digest, size, block_size, packed, need, unsynced)
            if handle is not None:
                return handle
            # Evicting unlinks files; a file another process still has open or mapped keeps its
            # blocks until it is closed, so the next try looks at the disk again, not at our books.
            if protected is None:
                protected = frozenset(protect) | {digest}
            if self.evict(deficit, rank=rank, protect=protected) == 0:
                break
        used = self._index.used()
        if short_on_disk:
            raise DiskFull(f"cache {self.directory}: its disk is full: no room for blob {digest} ({size:,} bytes); "
                           f"the disk has {max(0, self.disk_room()):,} bytes left for blobs, the cache uses "
                           f"{used:,} of the {self._capacity:,} bytes of capacity it was given "
                           "and nothing more could be evicted: free space on that disk")
        raise CacheFull(f"no room for blob {digest} ({size} bytes) in the cache at {self.directory}: "
                        f"{used} of {self._capacity} bytes are taken by pinned, held or busy blobs")

    def _begin_once(self, digest: str, size: int, block_size: int, packed: bytes,
                    need: int, unsynced: bool) -> tuple[PartialBlob | None, int, bool]:
        """One try under the index's write lock: a handle, or (None, bytes that must be freed,
        whether the disk rather than the capacity is short of them).

        A new blob's file is created and allocated before the transaction where it looks as if it
        fits (that file system work would hold every other begin and commit of the cache), and the
        transaction checks it is still there: a reconcile of another process removes partial
        files that no row accounts for. Where it does not look as if it fits, or the blob is
        known already, everything happens inside the transaction.
        """
        early = self._create_early(digest, size, need)
        counted = need if early is not None else 0  # in self._early_bytes until the transaction ends
        opened: tuple[int, Path] | None = early[:2] if early is not None else None
        resumed: PartialBlob | None = None  # a handle opened here, closed if the transaction fails
        try:
            with self._index.write():
                row = self._index.get(digest)
                if row is not None and row.state is BlobState.PARTIAL and \
                        (row.size, row.block_size, row.block_digests) != (size, block_size, packed):
                    # The same bytes under another block size: start over under the caller's.
                    self._unlink_blob_file(row)
                    self._index.delete_blob(digest)
                    row = None
                if row is not None:
                    if opened is not None:  # another process began it meanwhile
                        self._undo_create(*opened)
                        opened = early = None
                    resumed = self._open_existing(row)
                    if resumed is not None:
                        return resumed, 0, False
                with self._early_lock:  # files other threads made ahead, not in the index yet
                    ahead = self._early_bytes - counted
                over = self._index.used() + ahead + need - self._capacity
                if opened is not None and os.fstat(opened[0]).st_nlink == 0:
                    os.close(opened[0])  # removed by a reconcile meanwhile: made again below
                    opened = early = None
                if opened is not None:
                    short = -self.disk_room() if need else 0  # its room is taken already
                else:
                    short = need - self.disk_room() if need else 0  # an empty blob needs no room
                if over > 0 or short > 0:
                    if opened is not None:
                        self._undo_create(*opened)
                        opened = None
                    return None, max(over, short), short > 0
                if early is not None:
                    gen = early[2]
                else:
                    gen = new_generation()
                    path = self._layout.partial_path(digest, gen)
                    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
                    opened = (fd, path)
                    if not self._claim_disk(fd, size):
                        self._undo_create(fd, path)
                        opened = None
                        return None, need, True  # another program took the room meanwhile
                self._index.insert_partial(digest, size, block_size, packed, gen, need, time.time(),
                                           self._boot if unsynced else None)
        except BaseException as exc:
            if opened is not None:
                self._undo_create(*opened)
            if resumed is not None:
                resumed.close()
            if isinstance(exc, OSError) and not isinstance(exc, CacheError):
                raise os_error(exc, f"creating partial blob {digest} in {self.directory}") from exc
            raise
        finally:
            if counted:
                self._early_done(counted)
        return self._files.handle(digest, size, block_size, gen, opened[1], opened[0], set()), 0, False

    def _create_early(self, digest: str, size: int, need: int) -> tuple[int, Path, str] | None:
        """A new blob's partial file, created and allocated outside the index's transaction, if the
        index (read without the lock) has no row for it and the cache and its disk have room for
        :data:`EARLY_ROOM` such blobs (besides those this process is making so); else None, and the
        transaction does it all (or finds why not).

        A file made so takes disk space before the index counts it: this process counts its own
        (so it never puts the cache over its capacity), and the room asked keeps other processes'
        from doing so: it would take more than ``EARLY_ROOM`` blobs begun in the same milliseconds.
        """
        with self._early_lock:
            room = need * EARLY_ROOM + self._early_bytes
            if self._index.get(digest) is not None or self._index.used() + room > self._capacity \
                    or room > self.disk_room():
                return None
            self._early_bytes += need
        made = self._make_early(digest, size)
        if made is None:
            self._early_done(need)
        return made

    def _early_done(self, need: int) -> None:
        """A file :meth:`_create_early` made is recorded, or gone: the index counts what is left."""
        with self._early_lock:
            self._early_bytes -= need

    def _make_early(self, digest: str, size: int) -> tuple[int, Path, str] | None:
        try:
            gen = new_generation()
            path = self._layout.partial_path(digest, gen)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except OSError:
            return None  # the transaction tries again, and reports what fails there
        try:
            if self._claim_disk(fd, size):
                return fd, path, gen
        except OSError:
            pass
        self._undo_create(fd, path)
        return None

    @staticmethod
    def _claim_disk(fd: int, size: int) -> bool:
        """Give a new partial file its full size, its blocks allocated on the disk where the file
        system can (so its writes cannot meet a full disk); False if the disk has no room for them.

        Where allocating is not supported the file stays sparse, and a write that meets a full
        disk fails with :class:`DiskFull` instead.
        """
        os.ftruncate(fd, size)
        try:
            allocate(fd, size)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                return False
            raise
        return True

    @staticmethod
    def _undo_create(fd: int, path: Path) -> None:
        os.close(fd)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def _open_existing(self, row: BlobRow) -> PartialBlob | None:
        """A handle on a blob the index has (inside a write transaction); None if it had to be dropped."""
        digest = row.digest
        if row.state is BlobState.PARTIAL:
            repaired = repair_partial(self._index, self._layout, row, self._boot)
            if repaired is None:
                return None
            row = repaired
        if row.state is BlobState.COMPLETE:
            path = self._layout.complete_path(digest)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                self._index.delete_blob(digest)
                return None
            self.touch(digest)
            return self._files.handle(digest, row.size, row.block_size, None, path, fd, set(range(row.block_count)))
        path = self._layout.partial_path(digest, row.gen)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except PermissionError:  # a commit failed after making it read-only
            os.chmod(path, 0o644)
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        self.touch(digest)
        return self._files.handle(digest, row.size, row.block_size, row.gen, path, fd, self._index.verified(digest))

    def open_partial(self, digest: str) -> PartialBlob | None:
        """A read-only handle on a partial (or complete) blob, for readers that serve verified
        blocks before the blob is complete (the FUSE mount); None if the blob is absent."""
        check_digest(digest)
        for _ in range(3):  # the blob may be committed or evicted between the lookup and the open
            row = self._index.get(digest)
            if row is None:
                return None
            complete_path = self._layout.complete_path(digest)
            if row.state is BlobState.COMPLETE:
                path, gen, verified = complete_path, None, set(range(row.block_count))
            else:
                path, gen, verified = self._layout.partial_path(digest, row.gen), row.gen, None
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                if gen is None:
                    continue
                # Renamed into blobs/ by its commit, which records it next: complete already.
                path, gen, verified = complete_path, None, set(range(row.block_count))
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    raise os_error(exc, f"opening blob {digest}") from exc
                if os.fstat(fd).st_size != row.size:
                    os.close(fd)
                    continue
            except OSError as exc:
                raise os_error(exc, f"opening blob {digest}") from exc
            if verified is None:
                verified = self._index.verified(digest)
            return self._files.handle(digest, row.size, row.block_size, gen, path, fd, verified, writable=False)
        return None

    def drop_corrupt(self, digest: str, identity: tuple[int, int], blocks: Sequence[int] | None = None) -> bool:
        """A reader found bytes of the file ``identity`` (device, inode) that do not match their digest:
        drop the blob (complete) or forget those ``blocks`` (partial), so the engine fetches them again.

        Nothing is dropped if the blob's file is no longer that file (already dropped and fetched
        again by someone). Returns True if something was dropped.

        Raises:
            CacheError: an I/O or index error.
        """
        check_digest(digest)
        with self._index.write():
            row = self._index.get(digest)
            if row is None:
                return False
            if row.state is BlobState.COMPLETE:
                path = self._layout.complete_path(digest)
            else:
                path = self._layout.partial_path(digest, row.gen)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                return False
            except OSError as exc:
                raise os_error(exc, f"dropping corrupt blob {digest}") from exc
            if (st.st_dev, st.st_ino) != tuple(identity):
                return False
            if row.state is BlobState.COMPLETE or blocks is None:
                self._unlink_blob_file(row)
                self._index.delete_blob(digest)
            else:
                self._index.forget_blocks(digest, list(blocks))
        log.warning("cache %s: blob %s changed on disk after it was verified; dropped, to be fetched again",
                    self.directory, digest)
        return True

    # -- access, consumption, protection ------------------------------------------------------

    def touch(self, digest: str) -> None:
        """Note that a blob was just read (buffered; written at most every ``touch_interval``)."""
        self._access.touch(digest)

    def mark_consumed(self, digest: str, token: str | int) -> None:
        """Record that every local consumer has read the blob in epoch (or plan round) ``token``."""
        self._index.set_consumed(check_digest(digest), str(token))

    def pin(self, digest: str) -> None:
        """Never evict this blob (may be pinned before it arrives)."""
        self._index.pin(check_digest(digest))

    def unpin(self, digest: str) -> None:
        self._index.unpin(check_digest(digest))

    def hold(self, owner_id: str, digests: Iterable[str]) -> None:
        """Protect blobs (an active prefetch window) for as long as this process lives.

        ``owner_id`` must be unique to this process (e.g. include the pid);
        holds add up until :meth:`release`. A hold whose process died is ignored.
        """
        self._holds.hold(owner_id, digests)

    def release(self, owner_id: str, digests: Iterable[str] | None = None) -> None:
        """Drop some (or all) of ``owner_id``'s holds."""
        self._holds.release(owner_id, digests)

    # -- eviction and removal -----------------------------------------------------------------

    def evict(self, nbytes_needed: int, *, rank: Rank | None = None, protect: Iterable[str] = frozenset(),
              consumed: Container[str] | None = None) -> int:
        """Free at least ``nbytes_needed`` bytes if possible; returns the bytes freed.

        Order: ``rank`` (higher first), then consumed blobs, then least
        recently used (see eviction.py). Never evicts pinned blobs, blobs held
        by a live process, ``protect``ed blobs, or blobs whose lock is held.
        ``consumed``: the tokens that count as consumed now (default: any).
        The order is kept for up to a second and reused by the next calls with
        the same ``rank`` (ordering many blobs is the costly part); exclusions
        are always current. Readers that already have a file open or mapped
        keep reading it.

        Raises:
            CacheError: an I/O or index error.
        """
        if nbytes_needed <= 0:
            return 0
        self._access.flush()
        live, _ = self._holds.drop_dead_owners()
        exclude = frozenset(protect) | self._index.held_by(live)
        freed = 0
        victims = self._victims
        with victims.lock:
            for fresh in (False, True):
                order, built = victims.get(self._index.eviction_candidates, rank, consumed, fresh=fresh)
                for candidate in order:
                    if freed >= nbytes_needed:
                        return freed
                    if candidate.digest in exclude or victims.is_gone(candidate):
                        continue
                    got = self._evict_one(candidate)
                    if got is not None:
                        victims.mark_gone(candidate)
                        freed += got
                if built:
                    break
        return freed

    def _evict_one(self, candidate: Candidate) -> int | None:
        """Evict one candidate: the bytes freed (0 if it was already gone), None if it must stay for now."""
        lock = self.lock(candidate.digest)
        if not lock.try_lock():
            return None  # being fetched (or evicted) by someone
        try:
            with self._index.write():
                row = self._index.get(candidate.digest)
                if row is None or row.gen != candidate.gen:
                    return 0
                if self._index.is_pinned(row.digest) or self._holds.is_held(row.digest):
                    return None
                self._unlink_blob_file(row)
                freed = self._index.delete_blob(row.digest)
        finally:
            lock.release()
        with self._evictions_lock:
            self.evicted_blobs += 1
            self.evicted_bytes += freed
        return freed

    def _unlink_blob_file(self, row: BlobRow) -> None:
        """Unlink a blob's file (inside the transaction that drops its row)."""
        if row.state is BlobState.COMPLETE:
            path = self._layout.complete_path(row.digest)
        else:
            path = self._layout.partial_path(row.digest, row.gen)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise os_error(exc, f"removing blob {row.digest}") from exc

    def remove(self, digest: str) -> bool:
        """Remove a blob whatever its state, pins and holds; True if it was there."""
        check_digest(digest)
        with self._index.write():
            row = self._index.get(digest)
            if row is None:
                return False
            self._unlink_blob_file(row)
            self._index.delete_blob(digest)
            return True

    # -- scrubbing ----------------------------------------------------------------------------

    def verify(self, sample: float | None = None, repair: bool = True, *, seed: int | None = None,
               progress: Callable[[int], None] | None = None) -> VerifyReport:
        """Re-hash complete blobs and partial blobs' verified blocks against their recorded digests.

        Args:
            sample: the share of blobs to check (None: all).
            repair: drop what is bad: a bad complete blob is removed, bad
                blocks of a partial blob are forgotten; the engine fetches again.
            seed: makes the sample reproducible.
            progress: called with the bytes read after each blob.

        Raises:
            CacheError: an I/O or index error other than a blob vanishing meanwhile.
        """
        report = VerifyReport(repaired=repair)
        for row, check in scrub(self._index, self._layout, sample, seed):
            report.add(row.digest, row.state, check)
            if check.bad and repair:
                self._drop_bad(row, check.bad)
            if progress is not None:
                progress(report.bytes_checked)
        return report

    def _drop_bad(self, row: BlobRow, bad: list[int]) -> None:
        with self._index.write():
            now = self._index.get(row.digest)
            if now is None or now.gen != row.gen or now.state is not row.state:
                return  # changed meanwhile (evicted, restarted, committed)
            if row.state is BlobState.COMPLETE:
                self._unlink_blob_file(row)
                self._index.delete_blob(row.digest)
            else:
                self._index.forget_blocks(row.digest, bad)

    # -- datasets -----------------------------------------------------------------------------

    def register_dataset(self, name: str, digests_with_sizes: Iterable[tuple[str, int]]) -> None:
        """Record (or replace) which blobs make up a dataset, for ``stager status``; one transaction.

        A digest listed twice (two shards with the same bytes) counts once.
        Registering the same members again (every process that opens the
        dataset does) only compares a fingerprint and writes nothing.

        Raises:
            ValueError: a digest is malformed (nothing is recorded).
        """
        members = dict(digests_with_sizes)
        check_digests(members)
        if not all(type(size) is int for size in members.values()):
            members = {digest: int(size) for digest, size in members.items()}
        fingerprint = xxhash.xxh3_128()
        fingerprint.update("".join(members).encode())
        fingerprint.update(array("q", members.values()).tobytes())
        self._index.register_dataset(name, members.items(), fingerprint.hexdigest(), time.time())

    def unregister_dataset(self, name: str) -> None:
        self._index.unregister_dataset(name)

    def datasets(self) -> list[DatasetSummary]:
        """Every registered dataset: blobs, bytes, how many complete and partial."""
        return self._index.dataset_summaries()

    # -- life cycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Write pending access times, close open handles and the index. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._access.flush()
        except CacheError:
            pass  # access times are hints
        self._files.close_all()
        self._index.close()
        self._lock_ranges.close()

    def __enter__(self) -> "CacheTier":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CacheTier({str(self.directory)!r}, capacity={self._capacity})"
