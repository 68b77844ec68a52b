"""The replication plan: the source manifest diffed against the destination, on disk.

A plan is a sqlite database in the state directory, rebuilt at the start of
every run, so its size, not the process's memory, grows with the object count:

- ``src``: one row per source object (from the manifest's Arrow batches), with
  its shard, and its block digests when it belongs to this shard;
- ``dst``: the destination listing, page by page (:meth:`Store.scan`);
- ``dstm``: the destination's own manifest, if it has one;
- the journal (:mod:`.journal`) is attached read-only for the diff.

Each object of this shard gets one :class:`Action` by these rules, in order:
absent or another size at the destination -> copy; ``--verify`` -> hash the
destination copy; copied and verified before from this machine (journal) ->
skip; the destination manifest lists the same digest -> skip; it lists
another digest -> copy; ``--trust-size`` -> skip; otherwise the destination
object is read and hashed to decide (so an object of the right size but other
bytes is never taken for a copy). Destination files the source does not have
are counted, and listed for deletion only with ``--delete``.

Copies are handed out in batches in manifest order; memory holds one batch.
"""

from __future__ import annotations

import asyncio
import enum
import os
import sqlite3
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ..manifest import MANIFEST_DIR, Manifest
from ..store import ObjectInfo
from .shards import Shard, assign_shards, shard_of_path

T = TypeVar("T")

#: Rows per insert batch and per batch handed to the copier.
BATCH = 4096
#: Paths shown per action in a dry run.
SAMPLE = 5


class Action(enum.IntEnum):
    """What a run does with one source object (values >= 10 are work)."""

    SKIP_JOURNAL = 0  # copied and verified earlier by this machine
    SKIP_MANIFEST = 1  # the destination manifest lists the same digest
    SKIP_SIZE = 2  # same size and --trust-size
    SKIP_MARKER = 3  # --finalize: the shard owning it reported it verified
    COPY_MISSING = 10
    COPY_SIZE = 11  # another size at the destination
    COPY_DIGEST = 12  # the destination manifest lists another digest
    CHECK = 20  # same size, nothing vouches for it: read and hash the destination copy
    CHECK_VERIFY = 21  # --verify: read and hash the destination copy

    @property
    def is_copy(self) -> bool:
        return 10 <= self < 20

    @property
    def is_check(self) -> bool:
        return self >= 20

    @property
    def reason(self) -> str:
        return _REASONS[self]


_REASONS = {
    Action.SKIP_JOURNAL: "already copied and verified (journal)",
    Action.SKIP_MANIFEST: "destination manifest has the same digest",
    Action.SKIP_SIZE: "same size (--trust-size)",
    Action.SKIP_MARKER: "verified by its shard",
    Action.COPY_MISSING: "missing at the destination",
    Action.COPY_SIZE: "different size at the destination",
    Action.COPY_DIGEST: "destination manifest has another digest",
    Action.CHECK: "same size, unverified: the destination copy will be read and hashed",
    Action.CHECK_VERIFY: "--verify: the destination copy will be read and hashed",
}


@dataclass(frozen=True, slots=True)
class PlanRules:
    """How a destination object counts as already there (see the module docstring)."""

    verify: bool = False
    trust_size: bool = False
    delete: bool = False
    trusted_shards: frozenset[int] = frozenset()  # --finalize: shards whose done-marker exists...
    trusted_count: int = 1  # ...of this many shards


@dataclass(frozen=True, slots=True)
class PlanItem:
    """One object to copy or to check."""

    path: str
    size: int
    digest: bytes  # xxh3-128, 16 bytes
    blocks: np.ndarray  # uint64 xxh3-64 of each block
    action: Action


@dataclass(slots=True)
class PlanSummary:
    """What the plan of this shard holds: counts and bytes per action, extras, samples."""

    objects: int = 0
    bytes: int = 0
    by_action: dict[Action, tuple[int, int]] = field(default_factory=dict)  # action -> (count, bytes)
    samples: dict[Action, list[str]] = field(default_factory=dict)
    extra_objects: int = 0  # destination-only files (this shard's share)
    extra_bytes: int = 0
    extra_samples: list[str] = field(default_factory=list)
    dst_manifest: bool = False

    def count(self, pred: Callable[[Action], bool]) -> tuple[int, int]:
        n = b = 0
        for action, (c, s) in self.by_action.items():
            if pred(action):
                n += c
                b += s
        return n, b

    @property
    def to_copy(self) -> tuple[int, int]:
        return self.count(lambda a: a.is_copy)

    @property
    def to_check(self) -> tuple[int, int]:
        return self.count(lambda a: a.is_check)

    @property
    def to_skip(self) -> tuple[int, int]:
        return self.count(lambda a: a < 10)

    def as_dict(self) -> dict[str, Any]:
        return {
            "objects": self.objects,
            "bytes": self.bytes,
            "actions": {a.name.lower(): {"objects": c, "bytes": b, "reason": a.reason, "sample": self.samples.get(a, [])}
                        for a, (c, b) in sorted(self.by_action.items())},
            "extra_objects": self.extra_objects,
            "extra_bytes": self.extra_bytes,
            "extra_sample": self.extra_samples,
            "destination_manifest": self.dst_manifest,
        }


SCHEMA = """
CREATE TABLE src (
    idx INTEGER PRIMARY KEY,
    path TEXT NOT NULL,
    size INTEGER NOT NULL,
    digest BLOB NOT NULL,
    shard INTEGER NOT NULL,
    mine INTEGER NOT NULL,
    blocks BLOB,
    action INTEGER
);
CREATE TABLE dst (path TEXT PRIMARY KEY, size INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE dstm (path TEXT PRIMARY KEY, size INTEGER NOT NULL, digest BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE extra (path TEXT PRIMARY KEY, size INTEGER NOT NULL) WITHOUT ROWID;
"""

_ACTION_SQL = """
UPDATE src SET action = CASE
    WHEN (SELECT size FROM dst WHERE dst.path = src.path) IS NULL THEN 10
    WHEN (SELECT size FROM dst WHERE dst.path = src.path) != src.size THEN 11
    WHEN :verify THEN 21
    WHEN :trusted AND src.shard IN (SELECT value FROM trusted) THEN 3
    WHEN EXISTS (SELECT 1 FROM j.done jd WHERE jd.path = src.path AND jd.digest = src.digest
                 AND jd.size = src.size) THEN 0
    WHEN EXISTS (SELECT 1 FROM dstm m WHERE m.path = src.path AND m.digest = src.digest AND m.size = src.size) THEN 1
    WHEN EXISTS (SELECT 1 FROM dstm m WHERE m.path = src.path) THEN 12
    WHEN :trust_size THEN 2
    ELSE 20
END
WHERE src.mine = 1
"""


class Plan:
    """A plan database at ``path``; build one with :meth:`build`."""

    def __init__(self, path: Path, shard: Shard, block_size: int) -> None:
        self.path = path
        self.shard = shard
        self.block_size = block_size
        self.summary = PlanSummary()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="stager-plan")
        self._db: sqlite3.Connection | None = None

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, partial(fn, *args))

    @classmethod
    async def build(
        cls,
        path: str | Path,
        manifest: Manifest,
        shard: Shard,
        rules: PlanRules,
        *,
        dst_pages: AsyncIterator[list[ObjectInfo]],
        dst_manifest: Manifest | None,
        journal_path: str | Path,
    ) -> Plan:
        """Diff ``manifest`` (the source) against the destination; the database replaces any at ``path``.

        Raises:
            OriginError: listing the destination failed.
        """
        plan = cls(Path(path), shard, manifest.block_size)
        try:
            await plan._call(plan._create)
            await plan._call(plan._insert_source, manifest, rules)
            async for page in dst_pages:
                await plan._call(plan._insert_dst, page)
            if dst_manifest is not None:
                await plan._call(plan._insert_dst_manifest, dst_manifest)
            await plan._call(plan._diff, rules, str(journal_path))
            plan.summary.dst_manifest = dst_manifest is not None
        except BaseException:
            await plan.close()
            raise
        return plan

    # -- building (in the plan's thread) -------------------------------------------------

    def _create(self) -> None:
        for suffix in ("", "-journal", "-wal", "-shm"):
            try:
                os.unlink(f"{self.path}{suffix}")
            except FileNotFoundError:
                pass
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        # Rebuilt every run: durability would only cost time.
        db.execute("PRAGMA journal_mode=OFF")
        db.execute("PRAGMA synchronous=OFF")
        db.execute("PRAGMA cache_size=-8192")  # 8 MiB of page cache, whatever the plan's size
        db.executescript(SCHEMA)
        count = self.shard.count
        db.create_function("shard_of", 1, lambda p: shard_of_path(p, count), deterministic=True)
        self._db = db

    def _insert_source(self, manifest: Manifest, rules: PlanRules) -> None:
        db = self._db
        assert db is not None
        shards = assign_shards(manifest.sizes, self.shard.count)
        # The shard column is what --finalize trusts by; normally this run's own split.
        basis = assign_shards(manifest.sizes, rules.trusted_count) if rules.trusted_shards else shards
        offset = 0
        db.execute("BEGIN")
        for batch in manifest.table.select(["path", "size", "digest", "blocks"]).to_batches(max_chunksize=BATCH):
            n = batch.num_rows
            paths = batch.column(0).to_pylist()
            sizes = batch.column(1).to_numpy(zero_copy_only=False)
            digests = batch.column(2).to_pylist()
            blocks_col = batch.column(3)
            offsets = blocks_col.offsets.to_numpy()
            values = blocks_col.values.to_numpy(zero_copy_only=False).astype("<u8", copy=False)
            mine = shards[offset:offset + n] == self.shard.index
            rows = []
            for k in range(n):
                blob = values[offsets[k]:offsets[k + 1]].tobytes() if mine[k] else None
                rows.append((offset + k, paths[k], int(sizes[k]), digests[k], int(basis[offset + k]), int(mine[k]), blob))
            db.executemany("INSERT INTO src (idx, path, size, digest, shard, mine, blocks) VALUES (?, ?, ?, ?, ?, ?, ?)",
                           rows)
            offset += n
        db.execute("COMMIT")
        db.execute("CREATE UNIQUE INDEX src_path ON src (path)")

    def _insert_dst(self, page: list[ObjectInfo]) -> None:
        assert self._db is not None
        self._db.executemany("INSERT OR REPLACE INTO dst (path, size) VALUES (?, ?)", ((o.path, o.size) for o in page))

    def _insert_dst_manifest(self, manifest: Manifest) -> None:
        db = self._db
        assert db is not None
        db.execute("BEGIN")
        for batch in manifest.table.select(["path", "size", "digest"]).to_batches(max_chunksize=BATCH):
            db.executemany("INSERT OR REPLACE INTO dstm (path, size, digest) VALUES (?, ?, ?)",
                           zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), batch.column(2).to_pylist()))
        db.execute("COMMIT")

    def _diff(self, rules: PlanRules, journal_path: str) -> None:
        db = self._db
        assert db is not None
        db.execute("ATTACH DATABASE ? AS j", (journal_path,))
        db.execute("CREATE TEMP TABLE trusted (value INTEGER PRIMARY KEY)")
        db.executemany("INSERT INTO trusted VALUES (?)", ((s,) for s in sorted(rules.trusted_shards)))
        db.execute("BEGIN")
        db.execute(_ACTION_SQL, {"verify": int(rules.verify), "trusted": int(bool(rules.trusted_shards)),
                                 "trust_size": int(rules.trust_size)})
        # Destination-only files, this shard's share; the manifest's own folder is never an extra.
        db.execute(
            "INSERT INTO extra (path, size) SELECT path, size FROM dst WHERE substr(path, 1, ?) != ? "
            "AND NOT EXISTS (SELECT 1 FROM src WHERE src.path = dst.path) AND shard_of(path) = ?",
            (len(MANIFEST_DIR) + 1, MANIFEST_DIR + "/", self.shard.index),
        )
        db.execute("COMMIT")
        db.execute("DETACH DATABASE j")
        summary = self.summary
        for action, count, size in db.execute("SELECT action, COUNT(*), SUM(size) FROM src WHERE mine = 1 GROUP BY action"):
            summary.by_action[Action(action)] = (int(count), int(size or 0))
            summary.objects += int(count)
            summary.bytes += int(size or 0)
        for action in summary.by_action:
            summary.samples[action] = [r[0] for r in db.execute(
                "SELECT path FROM src WHERE mine = 1 AND action = ? ORDER BY idx LIMIT ?", (int(action), SAMPLE))]
        count, size = db.execute("SELECT COUNT(*), SUM(size) FROM extra").fetchone()
        summary.extra_objects, summary.extra_bytes = int(count), int(size or 0)
        summary.extra_samples = [r[0] for r in db.execute("SELECT path FROM extra ORDER BY path LIMIT ?", (SAMPLE,))]

    # -- reading -------------------------------------------------------------------------

    async def items(self, *, batch: int = 256) -> AsyncIterator[list[PlanItem]]:
        """The objects to copy or check, in manifest order, ``batch`` at a time."""
        last = -1
        while True:
            rows = await self._call(self._page, last, batch)
            if not rows:
                return
            last = rows[-1][0]
            yield [PlanItem(path, size, bytes(digest), np.frombuffer(blocks or b"", dtype="<u8"), Action(action))
                   for _idx, path, size, digest, blocks, action in rows]

    def _page(self, last: int, limit: int) -> list[tuple]:
        assert self._db is not None
        return self._db.execute(
            "SELECT idx, path, size, digest, blocks, action FROM src WHERE mine = 1 AND action >= 10 AND idx > ? "
            "ORDER BY idx LIMIT ?", (last, limit)).fetchall()

    async def extras(self, *, batch: int = 1000) -> AsyncIterator[list[str]]:
        """This shard's destination-only paths, ``batch`` at a time."""
        last = ""
        while True:
            rows = await self._call(self._extra_page, last, batch)
            if not rows:
                return
            last = rows[-1]
            yield rows

    def _extra_page(self, last: str, limit: int) -> list[str]:
        assert self._db is not None
        return [r[0] for r in self._db.execute("SELECT path FROM extra WHERE path > ? ORDER BY path LIMIT ?",
                                               (last, limit))]

    async def wants(self, path: str, digest: bytes) -> bool:
        """Whether this shard's plan copies or checks ``path`` with ``digest`` (for stale uploads)."""
        def query() -> bool:
            assert self._db is not None
            return self._db.execute("SELECT 1 FROM src WHERE path = ? AND digest = ? AND mine = 1",
                                    (path, digest)).fetchone() is not None
        return await self._call(query)

    async def close(self, *, remove: bool = True) -> None:
        """Close the database and (by default) delete it."""
        def finish() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None
            if remove:
                for suffix in ("", "-journal", "-wal", "-shm"):
                    try:
                        os.unlink(f"{self.path}{suffix}")
                    except FileNotFoundError:
                        pass
        await self._call(finish)
        self._executor.shutdown(wait=False)

