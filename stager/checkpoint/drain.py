"""The drain: staged checkpoints sent, verified, to their destination and every replica, oldest first.

For one checkpoint (a staging :class:`~.staging.Entry`), at each store at once:
every data file is sent and verified (:mod:`.transfer`), then DCP's
``.metadata``, then the checkpoint's manifest (which lists every store), each
only after what came before verified at that store. So at any store, a
checkpoint whose manifest is there is complete; one without it is not yet a
checkpoint to anybody (DCP's own loader needs ``.metadata`` too). Progress is
journaled (:mod:`.journal`), so a drain killed at any point and run again
sends only what no store has, verified. Once every store holds the
checkpoint, the entry is marked drained; its files stay in staging (the
nearest copy for a load) until a later save needs the room.

:class:`Drain` runs the queue of one staging directory to its end; one drain
per directory at a time (a file lock, :func:`drain_lock`), whoever runs it: the
drainer process (:mod:`.drainer`) or the node daemon.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import time
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CheckpointError, StagerError
from ..store import LocalStore, Store, open_store
from .journal import DrainJournal
from .manifest import MANIFEST_PATH, CheckpointManifest, hash_file, read_records, write_record
from .staging import Entry, StagingDir
from .transfer import DEFAULT_PART_SIZE, Sender, local_md5

log = logging.getLogger(__name__)
LOCK = ".drain.lock"


@dataclass
class DrainStats:
    """What the drain did, for logs, ``stager checkpoints`` and the daemon's metrics."""

    bytes_drained: int = 0
    bytes_skipped: int = 0  # found verified at a store already (a resumed drain)
    checkpoints_drained: int = 0
    failures: int = 0
    current: str | None = None
    oldest_pending_since: float | None = None  # sealed time of the oldest checkpoint not drained
    pending_bytes: int = 0
    last_error: str | None = None
    started: float = field(default_factory=time.time)

    def lag_seconds(self) -> float:
        return 0.0 if self.oldest_pending_since is None else max(0.0, time.time() - self.oldest_pending_since)


@contextmanager
def drain_lock(root: Path, *, wait: bool = False) -> Iterator[bool]:
    """Hold the staging directory's drain lock; yields False (holding nothing) if another drain has it."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def manifest_for(entry: Entry) -> CheckpointManifest:
    """The manifest of a sealed entry, from the records its save kept."""
    spec = entry.spec()
    records = read_records(entry.path)
    return CheckpointManifest(tuple(records), tuple(t.url for t in spec.targets),
                              created=entry.sealed_at or time.time())


class Drain:
    """Drains one staging directory (see the module docstring)."""

    def __init__(self, staging: StagingDir, *, part_size: int = DEFAULT_PART_SIZE, concurrency: int = 8,
                 stats: DrainStats | None = None) -> None:
        self.staging = staging
        self.part_size = part_size
        self.concurrency = concurrency
        self.stats = stats or DrainStats()
        self.failed: set[str] = set()  # entries that failed this run: tried again by the next drain

    def _note_queue(self) -> list[Entry]:
        pending = self.staging.pending()
        self.stats.oldest_pending_since = pending[0].sealed_at if pending else None
        self.stats.pending_bytes = sum(e.size() for e in pending)
        return pending

    async def run(self) -> int:
        """Drain until the queue is empty (new checkpoints sealed meanwhile included); return how many.

        A checkpoint that fails (a store down past its retry budget) is logged and left
        in the queue for the next drain, and the younger ones go on.
        """
        done = 0
        failed = self.failed
        while True:
            queue = [e for e in self._note_queue() if e.name not in failed]
            if not queue:
                return done
            entry = queue[0]
            try:
                await self.drain_entry(entry)
                done += 1
            except StagerError as exc:
                failed.add(entry.name)
                self.stats.failures += 1
                self.stats.last_error = f"{entry.name}: {exc}"
                log.error("checkpoint %s not drained: %s", entry.name, exc)

    async def drain_entry(self, entry: Entry) -> None:
        """Send one sealed checkpoint to every store, verified, publishing its manifest last at each."""
        self.stats.current = entry.name
        spec = entry.spec()
        manifest = manifest_for(entry)
        journal = DrainJournal(entry.path)
        sender = Sender(manifest.block_size, part_size=self.part_size, concurrency=self.concurrency)
        data_dir = entry.data_dir
        md5s = {r.path: local_md5(data_dir / r.path) for r in manifest.files}
        body = manifest.encode()
        try:
            async with AsyncExitStack() as stack:
                src = await stack.enter_async_context(LocalStore(str(data_dir)))
                stores: list[Store] = [await stack.enter_async_context(open_store(t, concurrency=self.concurrency))
                                       for t in spec.targets]

                async def one_store(index: int, dst: Store) -> None:
                    async with asyncio.TaskGroup() as tg:
                        for record in manifest.data_files():
                            tg.create_task(sender.send(src, dst, record, md5_of=md5s[record.path],
                                                       journal=journal, store_index=index))
                    for record in manifest.last_files():
                        await sender.send(src, dst, record, md5_of=md5s[record.path], journal=journal,
                                          store_index=index)
                    await publish(dst, body, manifest)

                async with asyncio.TaskGroup() as tg:
                    for index, dst in enumerate(stores):
                        tg.create_task(one_store(index, dst))
        except BaseExceptionGroup as group:
            from ..errors import first_error

            raise first_error(group) from group
        finally:
            self.stats.bytes_drained += sender.sent_bytes
            self.stats.bytes_skipped += sender.skipped_bytes
            self.stats.current = None
        entry.mark_drained()
        self.stats.checkpoints_drained += 1
        log.info("checkpoint %s drained to %s", entry.name, ", ".join(t.url for t in spec.targets))


async def publish(dst: Store, body: bytes, manifest: CheckpointManifest) -> None:
    """Write the manifest at ``dst`` (after every file verified there) and check it reads back."""
    try:
        if await dst.read(MANIFEST_PATH) == body:
            return
    except StagerError:
        pass
    await dst.write(MANIFEST_PATH, body)
    if await dst.read(MANIFEST_PATH) != body:
        raise CheckpointError(f"{dst.url}/{MANIFEST_PATH}: the manifest just written reads back different")


def queue_folder(staging: StagingDir, local_dir: Path, url: str, targets: list) -> Entry:
    """Queue a folder some framework wrote (``save_pretrained``...) to drain in place: hash it and seal it.

    Its files are not copied: the entry points at ``local_dir``, which must stay as it is until
    drained. Raises :class:`CheckpointError` for an empty or unreadable folder.
    """
    from .staging import DrainSpec

    local_dir = local_dir.absolute()
    files = sorted(p for p in local_dir.rglob("*") if p.is_file() and ".stager" not in p.relative_to(local_dir).parts)
    if not files:
        raise CheckpointError(f"{local_dir}: no files to drain")
    entry = staging.entry(url)
    if entry.path.exists() and not entry.drained and entry.sealed_at is not None:
        return entry  # queued before (a drain killed midway): resume it
    entry.remove()
    entry.path.mkdir(parents=True)
    entry.write_spec(DrainSpec(tuple(targets), source_dir=str(local_dir)))
    for path in files:
        write_record(entry.path, hash_file(path, path.relative_to(local_dir).as_posix()))
    entry.seal()
    return entry
