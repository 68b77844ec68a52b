"""The blob index: one sqlite database (WAL) that every process sharing the cache writes.

It records, per blob, its geometry and expected block digests, its state, the
partial file's generation, which blocks of a partial blob are verified on
disk, and what the blob costs against the capacity; plus a running total of
that cost, pins, holds (with their owning process), consumption marks and
dataset membership.

Every change of more than one statement runs in a ``BEGIN IMMEDIATE``
transaction (single statements, like recording a verified block, commit on
their own). That transaction is the cross-process write lock: the tier
unlinks a blob's file inside the transaction that drops its row, and makes
its other file-system transitions (a begin's create, a commit's rename) just
before the transaction that records them, leaving between the two only
states every process reads right (see the package docstring). ``synchronous=NORMAL``
is enough: a process crash loses nothing committed, and a power loss can only
lose the latest transactions, which at worst forgets verified blocks (they
are fetched again) or leaves a state the start-up reconciliation repairs
(see the package docstring). One writing connection per tier, shared by
threads under a re-entrant lock, plus a reading connection per thread;
statements take microseconds, slow I/O happens outside transactions.

On a full disk sqlite cannot open, write or even delete (each needs room in
the ``-shm`` and ``-wal`` files first): an open, a statement or a commit that
fails for want of room is tried once more after the cache's reserve file is
given up for it (``reserve.py``). :meth:`BlobIndex.snapshot` reads the main
file alone, for the read-only commands, when even that room is gone.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import sys
import threading
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..errors import CacheError, DiskFull
from .fileio import sqlite_error
from .records import BlobState, DatasetSummary
from .reserve import IndexReserve

T = TypeVar("T")

SCHEMA_VERSION = 1
#: Digests looked up per query by :meth:`BlobIndex.states` (sqlite allows 999 parameters at the least).
STATES_PER_QUERY = 500

_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID",
    """CREATE TABLE blobs (
        digest TEXT PRIMARY KEY,
        state INTEGER NOT NULL,          -- 1 partial, 2 complete
        size INTEGER NOT NULL,
        block_size INTEGER NOT NULL,
        block_digests BLOB NOT NULL,     -- xxh3-64 per block, little-endian uint64
        gen TEXT NOT NULL,               -- suffix of the partial file's name
        charged INTEGER NOT NULL,        -- bytes counted against the capacity
        last_access REAL NOT NULL,
        consumed TEXT,                   -- token of the last mark_consumed()
        volatile_boot TEXT               -- boot id, if blocks were recorded without fdatasync
    )""",
    "CREATE INDEX blobs_state ON blobs(state)",
    "CREATE TABLE verified_blocks (digest TEXT NOT NULL, idx INTEGER NOT NULL, "
    "PRIMARY KEY (digest, idx)) WITHOUT ROWID",
    "CREATE TABLE pins (digest TEXT PRIMARY KEY) WITHOUT ROWID",
    "CREATE TABLE owners (owner TEXT PRIMARY KEY, pid INTEGER NOT NULL, start INTEGER NOT NULL, "
    "boot TEXT NOT NULL) WITHOUT ROWID",
    "CREATE TABLE holds (owner TEXT NOT NULL, digest TEXT NOT NULL, PRIMARY KEY (owner, digest)) WITHOUT ROWID",
    "CREATE INDEX holds_digest ON holds(digest)",
    # One registration appends its members as one run of rowids [first_row, last_row] to a table
    # without any index: a million rows go in at sqlite's best speed, and a dataset's members are
    # read or dropped as a rowid range. The caller deduplicates digests.
    "CREATE TABLE datasets (id INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL, registered REAL NOT NULL, "
    "fingerprint TEXT NOT NULL, first_row INTEGER NOT NULL, last_row INTEGER NOT NULL)",
    "CREATE TABLE dataset_blobs (dataset INTEGER NOT NULL, digest TEXT NOT NULL, size INTEGER NOT NULL)",
    "INSERT INTO meta (key, value) VALUES ('used', 0)",
)

_ROW_COLUMNS = "digest, state, size, block_size, block_digests, gen, charged, last_access, consumed, volatile_boot"


def _wants_room(exc: sqlite3.Error) -> bool:
    """Whether sqlite may have failed for want of disk space: SQLITE_FULL, or the I/O error it gives
    when the ``-shm`` file cannot grow."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in (sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR)


def _disk_nearly_full(directory: Path) -> bool:
    try:
        st = os.statvfs(directory)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < 1024 * 1024


def pack_block_digests(digests: Sequence[int]) -> bytes:
    """The block digests as little-endian uint64s.

    Raises:
        ValueError: a digest is not an unsigned 64-bit integer.
    """
    try:
        arr = array("Q", digests)
    except (OverflowError, TypeError) as exc:
        raise ValueError(f"block digests must be unsigned 64-bit integers: {exc}") from exc
    if sys.byteorder == "big":  # pragma: no cover - no big-endian machines in CI
        arr.byteswap()
    return arr.tobytes()


def unpack_block_digests(data: bytes) -> array:
    arr = array("Q")
    arr.frombytes(data)
    if sys.byteorder == "big":  # pragma: no cover
        arr.byteswap()
    return arr


@dataclass(frozen=True, slots=True)
class BlobRow:
    """One row of the ``blobs`` table."""

    digest: str
    state: BlobState
    size: int
    block_size: int
    block_digests: bytes
    gen: str
    charged: int
    last_access: float
    consumed: str | None
    volatile_boot: str | None

    @property
    def block_count(self) -> int:
        return len(self.block_digests) // 8

    @classmethod
    def from_sql(cls, r: tuple) -> "BlobRow":
        return cls(r[0], BlobState(r[1]), r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9])


@dataclass(frozen=True, slots=True)
class Candidate:
    """What eviction needs to know about a blob."""

    digest: str
    gen: str
    charged: int
    last_access: float
    consumed: str | None


class _Reader:
    """One thread's read connection, and the lock its reads hold: :meth:`BlobIndex.close` (from any
    thread) takes it before closing, since closing a connection that another thread is reading
    through crashes the interpreter (sqlite3 frees what that read still uses)."""

    __slots__ = ("conn", "lock")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.lock = threading.Lock()


class BlobIndex:
    """The sqlite index of one cache directory, safe to share between threads.

    One connection writes, shared by the threads under a re-entrant lock
    (sqlite has one writer at a time anyway). Reads outside a transaction go
    through a connection per thread, so a lookup (``state()`` on the event
    loop) never waits behind another thread's transaction: WAL readers do not
    block on writers.
    """

    def __init__(self, path: Path, *, busy_timeout: float = 60.0, reserve: IndexReserve | None = None) -> None:
        self.path = path
        self._busy_timeout = busy_timeout
        self._reserve = reserve
        self._lock = threading.RLock()
        self._tx_thread: int | None = None  # the thread inside write(), if any
        self._local = threading.local()
        self._readers: list[_Reader] | None = []  # None once closed
        self._readers_lock = threading.Lock()
        self._snapshot = False
        try:
            self._conn = self._open()
        except sqlite3.Error as exc:
            if not self._give_room(exc):
                raise self._open_error(exc) from exc
            try:  # opening on a full disk needs room for the -shm and -wal files: the reserve's
                self._conn = self._open()
            except sqlite3.Error as again:
                raise self._open_error(again) from again

    @classmethod
    def snapshot(cls, path: Path) -> "BlobIndex":
        """A read-only view of the index as its main file holds it, for a disk too full to open it
        the usual way (WAL mode must size its ``-shm`` file first). It misses changes still in a
        ``-wal`` file that no process checkpointed (one killed, or one running now); writes fail.

        Raises:
            CacheError: the index cannot be read, or has an unknown schema version.
        """
        index = cls.__new__(cls)
        index.path, index._busy_timeout, index._reserve = path, 0.0, None
        index._lock, index._tx_thread, index._local = threading.RLock(), None, threading.local()
        index._readers, index._readers_lock, index._snapshot = [], threading.Lock(), True
        try:
            index._conn = sqlite3.connect(f"{Path(path).absolute().as_uri()}?immutable=1", uri=True,
                                          isolation_level=None, check_same_thread=False)
            version = index._conn.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.Error as exc:
            raise sqlite_error(exc, f"{path}: cannot read the cache index") from exc
        if version != SCHEMA_VERSION:
            index._conn.close()
            raise CacheError(f"{path}: cache index schema version {version} is not supported by this stager "
                             f"(it knows version {SCHEMA_VERSION})")
        return index

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=self._busy_timeout, isolation_level=None,
                               check_same_thread=False)
        self._conn = conn
        try:
            mode = self._enable_wal(self._busy_timeout)
            if str(mode).lower() != "wal":
                raise CacheError(f"{self.path}: the cache index cannot use WAL journaling (got {mode!r}); "
                                 "put the cache on a local file system")
            conn.execute("PRAGMA synchronous=NORMAL")
            # A WAL that grew (a big transaction, a checkpoint held back by a reader) gives its room
            # back to the disk at the next reset instead of keeping it for good.
            limit = self._reserve.nbytes if self._reserve is not None else 4 * 1024 * 1024
            conn.execute(f"PRAGMA journal_size_limit = {int(limit)}")
            self._init_schema()
        except BaseException:
            conn.close()
            raise
        return conn

    def _open_error(self, exc: sqlite3.Error) -> CacheError:
        if _wants_room(exc) and _disk_nearly_full(self.path.parent):
            err = DiskFull(f"{self.path}: cannot open the cache index: the disk holding it is full "
                           f"({exc}); free some space on it")
            err.errno = errno.ENOSPC
            return err
        return sqlite_error(exc, f"{self.path}: cannot open the cache index")

    def _error(self, exc: sqlite3.Error, what: str) -> CacheError:
        """``exc`` as a CacheError naming the cache directory (an error may reach a user as it is)."""
        return sqlite_error(exc, f"cache {self.path.parent}: {what}")

    def _give_room(self, exc: sqlite3.Error) -> bool:
        """sqlite failed, maybe for want of disk space: release the reserve for it; True if the
        reserve was there to release (then trying once more may succeed)."""
        return _wants_room(exc) and self._reserve is not None and self._reserve.release()

    def _enable_wal(self, busy_timeout: float) -> str:
        """Switch a new database to WAL (a no-op once done: the mode is stored in the file).

        Switching needs an exclusive lock, and sqlite answers SQLITE_BUSY at once,
        without its busy handler, when another connection holds a shared lock
        meanwhile (several processes creating the cache together): retry.
        """
        deadline = time.monotonic() + busy_timeout
        delay = 0.001
        while True:
            try:
                mode = self._conn.execute("PRAGMA journal_mode").fetchone()[0]
                if str(mode).lower() == "wal":
                    return mode
                return self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            except sqlite3.OperationalError as exc:
                code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
                if code not in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) or time.monotonic() > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def _init_schema(self) -> None:
        with self.write():
            version = self._conn.execute("PRAGMA user_version").fetchone()[0]
            if version == 0:
                for statement in _SCHEMA:
                    self._conn.execute(statement)
                self._conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            elif version != SCHEMA_VERSION:
                raise CacheError(f"{self.path}: cache index schema version {version} is not supported by this "
                                 f"stager (it knows version {SCHEMA_VERSION}); use a matching stager or "
                                 "another cache directory")

    # -- transactions -------------------------------------------------------------------------

    @contextmanager
    def write(self) -> Iterator[None]:
        """A write transaction (``BEGIN IMMEDIATE``: waits for other processes' writers).

        Nested uses join the outer transaction. Everything the block does with
        this index commits or rolls back as one.

        Raises:
            CacheFull: the disk holding the index is full.
            CacheError: the index stayed locked too long, or another sqlite error.
        """
        with self._lock:
            if self._tx_thread is not None:  # only this thread can be in it: it holds the lock
                yield
                return
            try:
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                if not self._give_room(exc):
                    raise self._error(exc, "starting a cache index transaction") from exc
                try:
                    self._conn.execute("BEGIN IMMEDIATE")
                except sqlite3.Error as again:
                    raise self._error(again, "starting a cache index transaction") from again
            self._tx_thread = threading.get_ident()
            try:
                yield
            except BaseException:
                self._tx_thread = None
                self._rollback()
                raise
            self._tx_thread = None
            try:
                self._commit()
            except sqlite3.Error as exc:
                self._rollback()
                raise self._error(exc, "committing a cache index transaction") from exc

    def _commit(self) -> None:
        try:
            self._conn.execute("COMMIT")
        except sqlite3.Error as exc:
            # On SQLITE_FULL the transaction usually stays open: with the reserve's room it commits.
            if not (self._conn.in_transaction and self._give_room(exc)):
                raise
            self._conn.execute("COMMIT")

    def _rollback(self) -> None:
        try:
            self._conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # no transaction left to roll back (sqlite already did, e.g. on SQLITE_FULL)

    def _exec(self, sql: str, params: Sequence | dict = ()) -> sqlite3.Cursor:
        with self._lock:
            return self._with_room(lambda: self._conn.execute(sql, params), "using the cache index")

    def _with_room(self, statement: Callable[[], T], what: str) -> T:
        """Run one statement; if it fails for want of disk space, once more with the reserve's room
        (only while the transaction it belongs to, if any, is still open: sqlite undid just it)."""
        inside = self._conn.in_transaction
        try:
            return statement()
        except sqlite3.Error as exc:
            if self._conn.in_transaction != inside or not self._give_room(exc):
                raise self._error(exc, what) from exc
        try:
            return statement()
        except sqlite3.Error as exc:
            raise self._error(exc, what) from exc

    def _reader(self) -> "_Reader | None":
        """This thread's read connection, or None inside this thread's write transaction
        (which must read through the writer to see its own changes)."""
        if self._tx_thread == threading.get_ident() or self._snapshot:
            return None
        reader = getattr(self._local, "reader", None)
        if reader is None:
            conn = sqlite3.connect(self.path, timeout=self._busy_timeout, isolation_level=None,
                                   check_same_thread=False)
            conn.execute("PRAGMA query_only = ON")
            reader = _Reader(conn)
            with self._readers_lock:
                if self._readers is None:  # closed: no new connection for a thread that comes late
                    conn.close()
                    raise sqlite3.ProgrammingError("the cache index is closed")
                self._readers.append(reader)
            self._local.reader = reader
        return reader

    def _all(self, sql: str, params: Sequence = ()) -> list[tuple]:
        return self._read(sql, params, sqlite3.Cursor.fetchall)

    def _one(self, sql: str, params: Sequence = ()) -> tuple | None:
        return self._read(sql, params, sqlite3.Cursor.fetchone)

    def _read(self, sql: str, params: Sequence, fetch: Callable[[sqlite3.Cursor], Any]) -> Any:
        """``fetch`` of a query on this thread's reader (or on the writer's connection, under its lock)."""
        try:
            reader = self._reader()
            if reader is not None:
                with reader.lock:  # against close() from another thread: a closed one raises, never crashes
                    return fetch(reader.conn.execute(sql, params))
            with self._lock:
                return fetch(self._conn.execute(sql, params))
        except sqlite3.Error as exc:
            raise self._error(exc, "reading the cache index") from exc

    def _many(self, sql: str, rows: Iterable[Sequence]) -> int:
        with self._lock:
            if isinstance(rows, (list, tuple)):  # can be run again with the reserve's room
                return self._with_room(lambda: self._conn.executemany(sql, rows).rowcount, "writing the cache index")
            try:  # a generator (a million dataset members) is not copied just to be replayable
                return self._conn.executemany(sql, rows).rowcount
            except sqlite3.Error as exc:
                raise self._error(exc, "writing the cache index") from exc

    def close(self) -> None:
        with self._readers_lock:
            readers, self._readers = self._readers or [], None
        for reader in readers:
            with reader.lock:  # a read in progress on another thread ends first
                reader.conn.close()
        with self._lock:
            try:
                self._conn.execute("PRAGMA optimize")
            except sqlite3.Error:
                pass
            self._conn.close()

    # -- blobs --------------------------------------------------------------------------------

    def get(self, digest: str) -> BlobRow | None:
        r = self._one(f"SELECT {_ROW_COLUMNS} FROM blobs WHERE digest = ?", (digest,))
        return BlobRow.from_sql(r) if r else None

    def state(self, digest: str) -> BlobState:
        r = self._one("SELECT state FROM blobs WHERE digest = ?", (digest,))
        return BlobState(r[0]) if r else BlobState.ABSENT

    def states(self, digests: Sequence[str]) -> dict[str, BlobState]:
        """``digest -> state`` of those of ``digests`` the index has (absent ones are left out), in one
        query per :data:`STATES_PER_QUERY` digests rather than one each."""
        found: dict[str, BlobState] = {}
        for start in range(0, len(digests), STATES_PER_QUERY):
            chunk = digests[start:start + STATES_PER_QUERY]
            marks = ",".join("?" * len(chunk))
            found.update((r[0], BlobState(r[1])) for r in self._all(
                f"SELECT digest, state FROM blobs WHERE digest IN ({marks})", tuple(chunk)))
        return found

    def sizes_with_prefix(self, prefix: str) -> dict[str, tuple[int, int, int, str, float, str | None]]:
        """``digest -> (state, size, charged, gen, last_access, volatile_boot)`` for digests starting
        with ``prefix``.

        Plain tuples, not :class:`BlobRow`: start-up scans go over every row.
        'g' sorts after every hex digit, so ``[prefix, prefix + 'g')`` holds
        exactly the digests that start with ``prefix``.
        """
        return {r[0]: r[1:] for r in self._all(
            "SELECT digest, state, size, charged, gen, last_access, volatile_boot FROM blobs "
            "WHERE digest >= ? AND digest < ?",
            (prefix, prefix + "g"))}

    def rows_in_state(self, state: BlobState) -> list[BlobRow]:
        return [BlobRow.from_sql(r) for r in self._all(
            f"SELECT {_ROW_COLUMNS} FROM blobs WHERE state = ?", (int(state),))]

    def page(self, after: str, limit: int) -> list[BlobRow]:
        """Rows in digest order after ``after`` (keyset pagination for long scans)."""
        return [BlobRow.from_sql(r) for r in self._all(
            f"SELECT {_ROW_COLUMNS} FROM blobs WHERE digest > ? ORDER BY digest LIMIT ?", (after, limit))]

    def insert_partial(self, digest: str, size: int, block_size: int, block_digests: bytes, gen: str,
                       charged: int, now: float, volatile_boot: str | None = None) -> None:
        """A new partial blob; ``volatile_boot``: its blocks will be recorded without fdatasync
        during that boot (see :meth:`record_block`)."""
        with self.write():
            self._exec("INSERT INTO blobs (digest, state, size, block_size, block_digests, gen, charged, "
                       "last_access, volatile_boot) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (digest, int(BlobState.PARTIAL), size, block_size, block_digests, gen, charged, now,
                        volatile_boot))
            self._add_used(charged)

    def restart_partial(self, digest: str, gen: str) -> None:
        """A partial blob starts over in a new file: new generation, no verified block."""
        with self.write():
            self._exec("UPDATE blobs SET gen = ?, volatile_boot = NULL WHERE digest = ?", (gen, digest))
            self._exec("DELETE FROM verified_blocks WHERE digest = ?", (digest,))

    def delete_blob(self, digest: str) -> int:
        """Drop a blob's row and block records; returns the bytes it was charged."""
        with self.write():
            r = self._one("SELECT charged FROM blobs WHERE digest = ?", (digest,))
            if r is None:
                return 0
            self._exec("DELETE FROM blobs WHERE digest = ?", (digest,))
            self._exec("DELETE FROM verified_blocks WHERE digest = ?", (digest,))
            self._add_used(-r[0])
            return int(r[0])

    def mark_complete(self, digest: str, charged: int, now: float, volatile_boot: str | None = None) -> None:
        """The blob is complete under ``blobs/``; ``volatile_boot``: its file was not fsynced, during
        that boot (a reboot since may have lost bytes of it the kernel had not written back)."""
        with self.write():
            r = self._one("SELECT charged FROM blobs WHERE digest = ?", (digest,))
            if r is None:
                return
            self._exec("UPDATE blobs SET state = ?, charged = ?, last_access = ?, volatile_boot = ? "
                       "WHERE digest = ?", (int(BlobState.COMPLETE), charged, now, volatile_boot, digest))
            self._exec("DELETE FROM verified_blocks WHERE digest = ?", (digest,))
            self._add_used(charged - r[0])

    def set_charged(self, digest: str, charged: int) -> None:
        with self.write():
            r = self._one("SELECT charged FROM blobs WHERE digest = ?", (digest,))
            if r is not None and r[0] != charged:
                self._exec("UPDATE blobs SET charged = ? WHERE digest = ?", (charged, digest))
                self._add_used(charged - r[0])

    # -- verified blocks ----------------------------------------------------------------------

    def verified(self, digest: str) -> set[int]:
        return {r[0] for r in self._all("SELECT idx FROM verified_blocks WHERE digest = ?", (digest,))}

    def verified_count(self, digest: str) -> int:
        return int(self._one("SELECT COUNT(*) FROM verified_blocks WHERE digest = ?", (digest,))[0])

    def is_verified(self, digest: str, gen: str, index: int) -> bool:
        return self._one("SELECT 1 FROM verified_blocks v JOIN blobs b ON b.digest = v.digest "
                         "WHERE v.digest = ? AND v.idx = ? AND b.gen = ? AND b.state = ?",
                         (digest, index, gen, int(BlobState.PARTIAL))) is not None

    def record_block(self, digest: str, gen: str, index: int, volatile_boot: str | None) -> bool:
        """Record block ``index`` of the partial blob ``digest`` (file generation ``gen``) as verified.

        Returns False if that partial blob is gone (evicted, removed, restarted
        or committed by someone else); nothing is recorded then.
        """
        # The common case is one autocommitted statement: one write lock, no round trips. A block
        # written without fdatasync takes it only if the blob already carries this boot's flag.
        cur = self._exec("INSERT OR IGNORE INTO verified_blocks (digest, idx) SELECT digest, ? FROM blobs "
                         "WHERE digest = ? AND gen = ? AND state = ? AND (? IS NULL OR volatile_boot IS ?)",
                         (index, digest, gen, int(BlobState.PARTIAL), volatile_boot, volatile_boot))
        if cur.rowcount == 1:
            return True
        if volatile_boot is None:
            r = self._one("SELECT gen, state FROM blobs WHERE digest = ?", (digest,))
            return r is not None and r[0] == gen and r[1] == BlobState.PARTIAL  # already recorded
        with self.write():
            r = self._one("SELECT gen, state FROM blobs WHERE digest = ?", (digest,))
            if r is None or r[0] != gen or r[1] != BlobState.PARTIAL:
                return False
            self._exec("INSERT OR IGNORE INTO verified_blocks (digest, idx) VALUES (?, ?)", (digest, index))
            self._exec("UPDATE blobs SET volatile_boot = ? WHERE digest = ? AND volatile_boot IS NOT ?",
                       (volatile_boot, digest, volatile_boot))
            return True

    def forget_blocks(self, digest: str, indexes: Iterable[int] | None = None) -> None:
        """Forget that blocks were verified (all of them when ``indexes`` is None)."""
        with self.write():
            if indexes is None:
                self._exec("DELETE FROM verified_blocks WHERE digest = ?", (digest,))
                self._exec("UPDATE blobs SET volatile_boot = NULL WHERE digest = ?", (digest,))
            else:
                self._many("DELETE FROM verified_blocks WHERE digest = ? AND idx = ?",
                           [(digest, i) for i in indexes])

    def settle(self, digest: str) -> None:
        """The complete blob's file is known to be on the disk (or was checked since): no boot flag."""
        self._exec("UPDATE blobs SET volatile_boot = NULL WHERE digest = ? AND state = ?",
                   (digest, int(BlobState.COMPLETE)))

    def drop_orphan_block_records(self) -> None:
        """Block records of blobs that are no longer partial (cannot happen; cheap to make sure)."""
        self._exec("DELETE FROM verified_blocks WHERE digest NOT IN "
                   "(SELECT digest FROM blobs WHERE state = ?)", (int(BlobState.PARTIAL),))

    # -- capacity -----------------------------------------------------------------------------

    def _add_used(self, delta: int) -> None:
        if delta:
            self._exec("UPDATE meta SET value = value + ? WHERE key = 'used'", (delta,))

    def used(self) -> int:
        return int(self._one("SELECT value FROM meta WHERE key = 'used'")[0])

    def recompute_used(self) -> int:
        """Reset the running total from the rows (heals any drift); returns it."""
        with self.write():
            self._exec("UPDATE meta SET value = (SELECT COALESCE(SUM(charged), 0) FROM blobs) WHERE key = 'used'")
            return self.used()

    def counts(self) -> tuple[int, int]:
        """``(complete, partial)`` blob counts."""
        got = dict(self._all("SELECT state, COUNT(*) FROM blobs GROUP BY state"))
        return int(got.get(BlobState.COMPLETE, 0)), int(got.get(BlobState.PARTIAL, 0))

    # -- access, consumption, pins ------------------------------------------------------------

    def touch_many(self, items: Iterable[tuple[float, str]]) -> None:
        with self.write():
            self._many("UPDATE blobs SET last_access = MAX(last_access, ?) WHERE digest = ?", items)

    def set_consumed(self, digest: str, token: str | None) -> None:
        self._exec("UPDATE blobs SET consumed = ? WHERE digest = ?", (token, digest))

    def pin(self, digest: str) -> None:
        self._exec("INSERT OR IGNORE INTO pins (digest) VALUES (?)", (digest,))

    def unpin(self, digest: str) -> None:
        self._exec("DELETE FROM pins WHERE digest = ?", (digest,))

    def is_pinned(self, digest: str) -> bool:
        return self._one("SELECT 1 FROM pins WHERE digest = ?", (digest,)) is not None

    # -- holds --------------------------------------------------------------------------------

    def add_holds(self, owner: str, pid: int, start: int, boot: str, digests: Iterable[str]) -> None:
        with self.write():
            self._exec("INSERT OR REPLACE INTO owners (owner, pid, start, boot) VALUES (?, ?, ?, ?)",
                       (owner, pid, start, boot))
            self._many("INSERT OR IGNORE INTO holds (owner, digest) VALUES (?, ?)", ((owner, d) for d in digests))

    def release_holds(self, owner: str, digests: Iterable[str] | None = None) -> None:
        with self.write():
            if digests is None:
                self._exec("DELETE FROM holds WHERE owner = ?", (owner,))
            else:
                self._many("DELETE FROM holds WHERE owner = ? AND digest = ?", ((owner, d) for d in digests))
            if self._one("SELECT 1 FROM holds WHERE owner = ? LIMIT 1", (owner,)) is None:
                self._exec("DELETE FROM owners WHERE owner = ?", (owner,))

    def owners(self) -> list[tuple[str, int, int, str]]:
        return [tuple(r) for r in self._all("SELECT owner, pid, start, boot FROM owners")]

    def owners_holding(self, digest: str) -> list[tuple[str, int, int, str]]:
        return [tuple(r) for r in self._all(
            "SELECT o.owner, o.pid, o.start, o.boot FROM holds h JOIN owners o ON o.owner = h.owner "
            "WHERE h.digest = ?", (digest,))]

    def held_by(self, owners: Sequence[str]) -> set[str]:
        held: set[str] = set()
        for owner in owners:
            held.update(r[0] for r in self._all("SELECT digest FROM holds WHERE owner = ?", (owner,)))
        return held

    def drop_owners(self, owners: Iterable[str]) -> None:
        with self.write():
            for owner in owners:
                self._exec("DELETE FROM holds WHERE owner = ?", (owner,))
                self._exec("DELETE FROM owners WHERE owner = ?", (owner,))

    # -- eviction -----------------------------------------------------------------------------

    def eviction_candidates(self) -> list[Candidate]:
        """Every blob that is not pinned (holds, locks and protection are filtered by the caller)."""
        return [Candidate(*r) for r in self._all(
            "SELECT digest, gen, charged, last_access, consumed FROM blobs "
            "WHERE digest NOT IN (SELECT digest FROM pins)")]

    # -- datasets -----------------------------------------------------------------------------

    def register_dataset(self, name: str, members: Iterable[tuple[str, int]], fingerprint: str,
                         now: float) -> bool:
        """Replace the members of dataset ``name`` (digests already deduplicated) in one transaction.

        Returns False, having written nothing, if the dataset already has members of this ``fingerprint``.
        """
        if self._one("SELECT 1 FROM datasets WHERE name = ? AND fingerprint = ?", (name, fingerprint)):
            return False
        with self.write():
            if self._one("SELECT 1 FROM datasets WHERE name = ? AND fingerprint = ?", (name, fingerprint)):
                return False  # another process registered it meanwhile
            self._drop_dataset(name)
            first = int(self._one("SELECT COALESCE(MAX(rowid), 0) FROM dataset_blobs")[0]) + 1
            dataset = self._exec("INSERT INTO datasets (name, registered, fingerprint, first_row, last_row) "
                                 "VALUES (?, ?, ?, 0, -1)", (name, now, fingerprint)).lastrowid
            self._many("INSERT INTO dataset_blobs (dataset, digest, size) VALUES (?, ?, ?)",
                       ((dataset, d, s) for d, s in members))
            last = int(self._one("SELECT COALESCE(MAX(rowid), 0) FROM dataset_blobs")[0])
            # Inside one write transaction nobody else appends: the members are exactly [first, last].
            self._exec("UPDATE datasets SET first_row = ?, last_row = ? WHERE id = ?", (first, last, dataset))
            return True

    def unregister_dataset(self, name: str) -> None:
        with self.write():
            self._drop_dataset(name)

    def _drop_dataset(self, name: str) -> None:
        r = self._one("SELECT id, first_row, last_row FROM datasets WHERE name = ?", (name,))
        if r is not None:
            self._exec("DELETE FROM dataset_blobs WHERE rowid BETWEEN ? AND ? AND dataset = ?", (r[1], r[2], r[0]))
            self._exec("DELETE FROM datasets WHERE id = ?", (r[0],))

    def dataset_summaries(self) -> list[DatasetSummary]:
        summaries = []
        for dataset, name, first, last in self._all(
                "SELECT id, name, first_row, last_row FROM datasets ORDER BY name"):
            counts = self._one(
                "SELECT COUNT(*), COALESCE(SUM(db.size), 0), COALESCE(SUM(b.state = 2), 0), "
                "COALESCE(SUM(b.state = 1), 0), COALESCE(SUM(CASE WHEN b.state = 2 THEN db.size ELSE 0 END), 0) "
                "FROM dataset_blobs db LEFT JOIN blobs b ON b.digest = db.digest "
                "WHERE db.rowid BETWEEN ? AND ? AND db.dataset = ?", (first, last, dataset))
            summaries.append(DatasetSummary(name, *counts))
        return summaries
