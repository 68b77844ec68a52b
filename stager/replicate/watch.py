"""``--watch``: keep replicating a checkpoint directory as its files become complete.

A training job writes checkpoints while we copy them, so a file is taken only
once it is complete. Every ``interval`` seconds the source is listed and each
file's (size, mtime) compared with the previous listings. A file is *ready*
when both hold:

1. it is stable: the same size and mtime in two consecutive listings; and
2. it is vouched for: a marker file (``_SUCCESS``, ``COMPLETE``,
   ``commit_success.txt``, ``.metadata`` by default: what Spark-style jobs,
   Orbax and PyTorch distributed checkpoints write last) sits in its folder or
   an enclosing one and is not older than the file; or, without a marker,
   the file has not changed for ``quiet_period`` seconds.

A ready file is hashed (the manifest entry), then copied by the same verified
copier as a whole-dataset replication, reading it again and checking every
block against the digests just taken: a file that changed in between fails
the check, is not committed, and is looked at again in a later round. Marker
files are copied after the other ready files of their folder, so a consumer at
the destination that waits for the marker never sees half a checkpoint. After
each round that copied something, the destination manifest is rewritten to
list every file replicated so far, and only those, all verified. Files the
source deletes later (checkpoint rotation) stay at the destination: keeping a
second copy is the point.

State lives in ``watch.sqlite`` beside the journal, so a restarted watcher
does not copy again what it already replicated.
"""

from __future__ import annotations

import asyncio
import posixpath
import signal
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..config import DEFAULT_BLOCK_SIZE
from ..errors import ConfigError, CorruptData, ManifestError, ShardNotFound
from ..manifest import MANIFEST_DIR, Manifest, ShardEntry, save_manifest
from ..manifest import object_hash
from ..store import InvalidRange, ObjectInfo, OriginStats, Store
from ..store.local_store import TMP_MARKER
from .budget import ByteBudget
from .context import open_replication
from .copier import Copier, part_size_for
from .plan import Action, PlanItem
from .replicator import ReplicateConfig
from .stats import ReplicateStats

DEFAULT_MARKERS = ("_SUCCESS", "COMPLETE", "commit_success.txt", ".metadata")
#: A file written up to this many seconds after its marker is still covered by it (mtime granularity).
MARKER_SLACK = 2.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS seen (path TEXT PRIMARY KEY, size INTEGER NOT NULL, mtime REAL, since REAL NOT NULL,
                                 round INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS copied (path TEXT PRIMARY KEY, size INTEGER NOT NULL, mtime REAL,
                                   digest BLOB NOT NULL, blocks BLOB NOT NULL);
"""


@dataclass(frozen=True, slots=True)
class WatchConfig:
    """How ``--watch`` decides that a file is complete, and when it stops."""

    interval: float = 10.0
    quiet_period: float = 60.0
    markers: tuple[str, ...] = DEFAULT_MARKERS
    idle_exit: float | None = None  # stop after this long without a new ready file; None: never
    block_size: int = DEFAULT_BLOCK_SIZE

    def __post_init__(self) -> None:
        if self.interval <= 0:
            raise ConfigError(f"--interval must be > 0, got {self.interval}")
        if self.quiet_period < 0:
            raise ConfigError(f"--quiet-period must be >= 0, got {self.quiet_period}")
        for name in self.markers:
            if not name or "/" in name:
                raise ConfigError(f"--ready-marker {name!r}: a file name, without '/'")


class WatchState:
    """The watcher's sqlite tables: files seen (and since when unchanged), files replicated."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="stager-watch")
        self._db: sqlite3.Connection | None = None

    @staticmethod
    def _open(path: Path) -> sqlite3.Connection:
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=60.0)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(SCHEMA)
        return db

    def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._db is None:  # opened on first use, in the watcher's thread
            self._db = self._open(self._path)
        return fn(self._db, *args)

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, partial(self._run, fn, *args))

    async def close(self) -> None:
        if self._db is not None:
            await self.call(lambda db: db.close())
            self._db = None
        self._executor.shutdown(wait=False)


def _observe(db: sqlite3.Connection, listing: list[ObjectInfo], now: float, round_no: int) -> list[tuple]:
    """Record this listing; return ``(path, size, mtime, since, stable)`` of files not yet copied."""
    out = []
    db.execute("BEGIN")
    for obj in listing:
        copied = db.execute("SELECT size, mtime FROM copied WHERE path = ?", (obj.path,)).fetchone()
        if copied is not None and copied[0] == obj.size and copied[1] == obj.mtime:
            continue
        row = db.execute("SELECT size, mtime, since, round FROM seen WHERE path = ?", (obj.path,)).fetchone()
        if row is None or row[0] != obj.size or row[1] != obj.mtime:
            db.execute("INSERT OR REPLACE INTO seen (path, size, mtime, since, round) VALUES (?, ?, ?, ?, ?)",
                       (obj.path, obj.size, obj.mtime, now, round_no))
            out.append((obj.path, obj.size, obj.mtime, now, False))
        else:
            out.append((obj.path, obj.size, obj.mtime, float(row[2]), int(row[3]) < round_no))
    db.execute("COMMIT")
    return out


def _record_copied(db: sqlite3.Connection, entry: ShardEntry, blocks: bytes) -> None:
    db.execute("BEGIN")
    db.execute("INSERT OR REPLACE INTO copied (path, size, mtime, digest, blocks) VALUES (?, ?, ?, ?, ?)",
               (entry.path, entry.size, entry.mtime, bytes.fromhex(entry.digest), blocks))
    db.execute("DELETE FROM seen WHERE path = ?", (entry.path,))
    db.execute("COMMIT")


def _forget_seen(db: sqlite3.Connection, path: str, now: float, round_no: int) -> None:
    db.execute("UPDATE seen SET since = ?, round = ? WHERE path = ?", (now, round_no, path))


def _copied_entries(db: sqlite3.Connection) -> list[ShardEntry]:
    return [ShardEntry(path, size, bytes(digest).hex(), tuple(np.frombuffer(blocks, dtype="<u8").tolist()),
                       None, None, mtime)
            for path, size, mtime, digest, blocks in db.execute(
                "SELECT path, size, mtime, digest, blocks FROM copied ORDER BY path")]


def ready_files(candidates: list[tuple], markers: dict[str, float], config: WatchConfig, now: float) -> list[tuple]:
    """The candidates that are complete by the rules of the module docstring."""
    ready = []
    for path, size, mtime, since, stable in candidates:
        if not stable:
            continue
        folder = posixpath.dirname(path)
        marked = False
        while True:
            marker_time = markers.get(folder)
            if marker_time is not None and (mtime is None or mtime <= marker_time + MARKER_SLACK):
                marked = True
                break
            if not folder:
                break
            folder = posixpath.dirname(folder)
        if marked or now - since >= config.quiet_period:
            ready.append((path, size, mtime))
    return ready


#: Blocks read ahead while hashing a file (the hash itself needs them in order).
READ_AHEAD = 4


async def hash_object(store: Store, path: str, size: int, block_size: int) -> tuple[str, list[int]]:
    """The xxh3-128 and per-block xxh3-64 digests of an object's true bytes, as ``stager index`` takes them.

    The object's MD5, where the origin vouches for one, comes from a HEAD now (the listing that
    found the file may be older); otherwise each block is read until two reads agree (see
    :mod:`stager.manifest.object_hash`).

    Raises:
        CorruptData: the object changed since it was listed (another size) or its bytes do not hold still.
        ShardNotFound: it is gone.
    """
    info = await store.info(path)  # an empty file must still exist, too
    if info.size != size:
        raise CorruptData(f"{path}: {info.size} bytes now, {size} when listed: still being written")
    try:
        hashed = await object_hash.hash_object(store, info, block_size, gate=asyncio.Semaphore(READ_AHEAD),
                                               read_ahead=READ_AHEAD)
    except ManifestError as exc:  # changed size while read
        raise CorruptData(str(exc)) from exc
    return hashed.digest, list(hashed.blocks)


async def watch_replicate(
    config: ReplicateConfig,
    watch: WatchConfig,
    *,
    on_round: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Replicate ``config.src`` to ``config.dst`` as files become complete, until idle or stopped.

    SIGTERM and cancellation stop it cleanly between copies (in-flight uploads resume next time).

    Raises:
        OriginError: a side failed as a whole.
        ReplicationBusy: a watcher with this state directory is already running.
    """
    began = time.monotonic()
    stats = ReplicateStats()
    rounds = 0
    pending = 0
    last_new = time.monotonic()
    marker_names = frozenset(watch.markers)
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    stopped = False
    async with AsyncExitStack() as stack:
        run = await open_replication(config, stack, src_stats=OriginStats(), dst_stats=OriginStats())
        src, dst, state_dir, journal = run.src, run.dst, run.state_dir, run.journal
        state = WatchState(state_dir / "watch.sqlite")
        stack.push_async_callback(state.close)
        budget = ByteBudget(max(config.buffer, part_size_for(0, watch.block_size, config.part_size)))
        copier = Copier(src, dst, journal, block_size=watch.block_size, part_size=config.part_size, budget=budget,
                        stats=stats, verify_after=config.verify, concurrency=config.concurrency)
        if task is not None:
            try:
                loop.add_signal_handler(signal.SIGTERM, task.cancel)
                stack.callback(loop.remove_signal_handler, signal.SIGTERM)
            except (NotImplementedError, RuntimeError):
                pass
        gate = asyncio.Semaphore(max(2, config.concurrency // 4))

        async def replicate_one(path: str, size: int, mtime: float | None, now: float, round_no: int) -> bool:
            async with gate:
                try:
                    digest, blocks = await hash_object(src, path, size, watch.block_size)
                    blob = np.asarray(blocks, dtype="<u8")
                    item = PlanItem(path, size, bytes.fromhex(digest), blob, Action.COPY_MISSING)
                    await copier.replicate(item)
                except (CorruptData, InvalidRange, ShardNotFound):
                    # Changed or removed under us: not complete after all; look again later.
                    await state.call(_forget_seen, path, now, round_no)
                    return False
                await state.call(_record_copied, ShardEntry(path, size, digest, tuple(blocks), None, None, mtime),
                                 blob.tobytes())
                return True

        try:
            while True:
                rounds += 1
                now = time.time()
                listing: list[ObjectInfo] = []
                markers: dict[str, float] = {}
                async for page in src.scan():
                    for obj in page:
                        if obj.path.startswith(MANIFEST_DIR + "/") or TMP_MARKER in obj.path:
                            continue
                        listing.append(obj)
                        if posixpath.basename(obj.path) in marker_names:
                            folder = posixpath.dirname(obj.path)
                            markers[folder] = max(markers.get(folder, 0.0), obj.mtime or now)
                candidates = await state.call(_observe, listing, now, rounds)
                ready = ready_files(candidates, markers, watch, now)
                pending = len(candidates) - len(ready)
                # Markers last: whoever waits for them at the destination finds their folder complete.
                first = [r for r in ready if posixpath.basename(r[0]) not in marker_names]
                last = [r for r in ready if posixpath.basename(r[0]) in marker_names]
                copied = 0
                for group in (first, last):
                    if not group:
                        continue
                    async with asyncio.TaskGroup() as tg:
                        tasks = [tg.create_task(replicate_one(p, s, m, now, rounds)) for p, s, m in group]
                    copied += sum(t.result() for t in tasks)
                pending += len(ready) - copied
                if copied:
                    last_new = time.monotonic()
                    entries = await state.call(_copied_entries)
                    await save_manifest(dst, Manifest.from_entries(entries, watch.block_size))
                    if on_round is not None:
                        on_round(f"round {rounds}: {copied} file(s) replicated, {len(entries)} in the destination "
                                 f"manifest, {pending} not yet complete")
                if watch.idle_exit is not None and time.monotonic() - last_new >= watch.idle_exit:
                    break
                await asyncio.sleep(watch.interval)
        except asyncio.CancelledError:
            if task is None or not task.cancelling():
                raise
            stopped = True
            task.uncancel()
    seconds = time.monotonic() - began
    return {
        "source": config.src.url,
        "destination": config.dst.url,
        "rounds": rounds,
        "copied_objects": stats.copied_objects,
        "copied_bytes": stats.copied_bytes,
        "pending": pending,
        "stopped_by_signal": stopped,
        "failed": stats.failed,
        "errors": stats.errors,
        "corrupt_blocks_rejected": stats.corrupt_blocks,
        "seconds": round(seconds, 3),
    }
