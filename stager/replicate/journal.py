"""The replication journal: what this machine has already copied and verified, surviving kill -9.

One stdlib sqlite3 database in WAL mode in the run's state directory (never on
the destination). Three tables:

- ``done(path, digest, size)``: an object copied to the destination, every
  block of it verified against the source manifest on the way;
- ``uploads(path, digest, part_size, token)``: a multipart upload in progress,
  with the store's resume token;
- ``parts(path, number, size)``: the parts of an upload already written.

Each record is one transaction committed before the copy counts as finished,
so a process killed at any instant has committed everything it reported done
and loses at most what was in flight. WAL with ``synchronous=NORMAL`` keeps
committed transactions across a process crash (a power cut may lose the last
few, which only means copying them again). Shards of one replication running
on the same machine share the journal (``busy_timeout`` serialises their
writers); each writes disjoint paths.

Every call runs in the journal's own single thread, so the event loop never
waits on sqlite and the connection is only ever used from one thread.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from ..errors import JournalError, StagerError

T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS done (
    path TEXT PRIMARY KEY,
    digest BLOB NOT NULL,
    size INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS uploads (
    path TEXT PRIMARY KEY,
    digest BLOB NOT NULL,
    part_size INTEGER NOT NULL,
    token TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS parts (
    path TEXT NOT NULL,
    number INTEGER NOT NULL,
    size INTEGER NOT NULL,
    PRIMARY KEY (path, number)
);
"""


@dataclass(frozen=True, slots=True)
class UploadRecord:
    """A multipart upload in progress: its resume token and the parts already written."""

    path: str
    digest: bytes
    part_size: int
    token: str
    parts: dict[int, int]


class Journal:
    """The journal at ``path``, created if missing, opened on first use. Use ``async with`` or :meth:`close`.

    Every method raises :class:`JournalError` if the file cannot be opened or written.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="stager-journal")
        self._db: sqlite3.Connection | None = None
        self._closed = False

    def _open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=60.0, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(SCHEMA)
        except sqlite3.Error as exc:
            raise JournalError(f"{self.path}: cannot open the replication journal: {exc}") from exc
        self._db = db

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, partial(self._guarded, fn, *args))

    def _guarded(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise JournalError(f"{self.path}: journal is closed")
        if self._db is None:  # opened on first use, in the journal's thread
            self._open()
        assert self._db is not None
        try:
            return fn(self._db, *args)
        except sqlite3.Error as exc:
            raise JournalError(f"{self.path}: replication journal write failed: {exc}") from exc

    async def open(self) -> Journal:
        """Create or open the database now (else the first call does); returns the journal."""
        await self._call(lambda db: None)
        return self

    # -- records --------------------------------------------------------------------

    async def record_done(self, path: str, digest: bytes, size: int) -> None:
        """Commit ``path`` as copied and verified (and forget its upload, if any)."""
        await self._call(_record_done, path, digest, size)

    async def forget(self, path: str) -> None:
        """Drop every record of ``path`` (it must be copied again)."""
        await self._call(_forget, path)

    async def begin_upload(self, path: str, digest: bytes, part_size: int, token: str) -> None:
        """Commit a new multipart upload of ``path`` (replacing any older one)."""
        await self._call(_begin_upload, path, digest, part_size, token)

    async def record_part(self, path: str, number: int, size: int) -> None:
        """Commit part ``number`` of the upload of ``path`` as written."""
        await self._call(_record_part, path, number, size)

    async def upload_of(self, path: str) -> UploadRecord | None:
        """The upload of ``path`` in progress, if any."""
        return await self._call(_upload_of, path)

    async def uploads(self) -> list[UploadRecord]:
        """Every upload in progress, without their parts (few: at most what was in flight)."""
        return await self._call(lambda db: [UploadRecord(r[0], bytes(r[1]), int(r[2]), str(r[3]), {}) for r in
                                            db.execute("SELECT path, digest, part_size, token FROM uploads")])

    async def done_count(self) -> int:
        return await self._call(lambda db: db.execute("SELECT COUNT(*) FROM done").fetchone()[0])

    async def close(self) -> None:
        """Close the database (idempotent)."""
        if self._db is not None and not self._closed:
            await self._call(_close)
        self._db = None
        self._closed = True
        self._executor.shutdown(wait=False)

    async def __aenter__(self) -> Journal:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


# --- run in the journal's thread ---------------------------------------------------


def _record_done(db: sqlite3.Connection, path: str, digest: bytes, size: int) -> None:
    with _transaction(db):
        db.execute("INSERT OR REPLACE INTO done (path, digest, size) VALUES (?, ?, ?)", (path, digest, size))
        db.execute("DELETE FROM uploads WHERE path = ?", (path,))
        db.execute("DELETE FROM parts WHERE path = ?", (path,))


def _forget(db: sqlite3.Connection, path: str) -> None:
    with _transaction(db):
        for table in ("done", "uploads", "parts"):
            db.execute(f"DELETE FROM {table} WHERE path = ?", (path,))


def _begin_upload(db: sqlite3.Connection, path: str, digest: bytes, part_size: int, token: str) -> None:
    with _transaction(db):
        db.execute("DELETE FROM parts WHERE path = ?", (path,))
        db.execute("INSERT OR REPLACE INTO uploads (path, digest, part_size, token) VALUES (?, ?, ?, ?)",
                   (path, digest, part_size, token))


def _record_part(db: sqlite3.Connection, path: str, number: int, size: int) -> None:
    db.execute("INSERT OR REPLACE INTO parts (path, number, size) VALUES (?, ?, ?)", (path, number, size))


def _upload_of(db: sqlite3.Connection, path: str) -> UploadRecord | None:
    row = db.execute("SELECT digest, part_size, token FROM uploads WHERE path = ?", (path,)).fetchone()
    if row is None:
        return None
    parts = dict(db.execute("SELECT number, size FROM parts WHERE path = ?", (path,)).fetchall())
    return UploadRecord(path, bytes(row[0]), int(row[1]), str(row[2]), parts)


def _close(db: sqlite3.Connection) -> None:
    db.close()


class _transaction:
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error) on an autocommit connection."""

    __slots__ = ("_db",)

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._db.execute("COMMIT" if exc_type is None else "ROLLBACK")
