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

A save whose ranks are on several nodes (:mod:`.parts`): each node's drain
sends its own data files, then its part record, at each store; a node other
than rank 0's is drained then. Rank 0's drain writes ``.metadata`` and the
manifest (the union of every part's files) at a store only once the part
records there cover every file ``.metadata`` names; until then it journals
what it waits for, drains younger checkpoints meanwhile and looks again, up
to the save's ``part_wait``.

:class:`Drain` runs the queue of one staging directory to its end; one drain
per directory at a time (a file lock, :func:`drain_lock`), whoever runs it: the
drainer process (:mod:`.drainer`) or the node daemon.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import logging
import os
import time
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CheckpointError, ManifestError, ShardNotFound, StagerError
from ..store import LocalStore, Store, open_store
from .journal import DrainJournal
from .manifest import MANIFEST_PATH, CheckpointManifest, hash_file, read_records, write_record
from .parts import Coverage, PartRecord, SavePart, coverage, part_path
from .staging import Entry, StagingDir
from .transfer import DEFAULT_PART_SIZE, Sender, local_md5

log = logging.getLogger(__name__)
LOCK = ".drain.lock"
_FIRST_POLL_S = 0.25  # a multi-node save waiting for other nodes' parts: first look again after this
_MAX_POLL_S = 2.0


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
    last_wait: str | None = None  # what the newest multi-node save waits for, at which store
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
        in the queue for the next drain, and the younger ones go on. A multi-node save whose
        other nodes' parts have not all landed is set aside while younger ones drain, and looked
        at again every few seconds, up to its ``part_wait``; then it is left for the next drain.
        """
        done = 0
        failed = self.failed
        waiting: dict[str, float] = {}  # entry -> when this run began waiting for its other nodes
        delay = _FIRST_POLL_S
        while True:
            queue = [e for e in self._note_queue() if e.name not in failed]
            if not queue:
                return done
            fresh = [e for e in queue if e.name not in waiting]
            if fresh:
                round_ = fresh[:1]
            else:
                await asyncio.sleep(delay)
                delay = min(delay * 2, _MAX_POLL_S)
                round_ = queue
            for entry in round_:
                try:
                    if await self.drain_entry(entry):
                        done += 1
                        waiting.pop(entry.name, None)
                        continue
                    began = waiting.setdefault(entry.name, time.monotonic())
                    if time.monotonic() - began > entry.spec().part_wait:
                        raise CheckpointError(f"the other nodes' parts did not all land within "
                                              f"{entry.spec().part_wait:g}s: {self.stats.last_wait}")
                except StagerError as exc:
                    failed.add(entry.name)
                    self.stats.failures += 1
                    self.stats.last_error = f"{entry.name}: {exc}"
                    log.error("checkpoint %s not drained: %s", entry.name, exc)

    async def drain_entry(self, entry: Entry) -> bool:
        """Send one sealed checkpoint to every store, verified, publishing its manifest last at each.

        Returns whether it is drained: False for rank 0's part of a multi-node save whose other
        parts are not all verified at every store yet (nothing is published where they are not).
        """
        self.stats.current = entry.name
        spec = entry.spec()
        manifest = manifest_for(entry)
        journal = DrainJournal(entry.path)
        sender = Sender(manifest.block_size, part_size=self.part_size, concurrency=self.concurrency)
        data_dir = entry.data_dir
        md5s = {r.path: local_md5(data_dir / r.path) for r in manifest.files}
        part = spec.part
        try:
            async with AsyncExitStack() as stack:
                src = await stack.enter_async_context(LocalStore(str(data_dir)))
                stores: list[Store] = [await stack.enter_async_context(open_store(t, concurrency=self.concurrency))
                                       for t in spec.targets]

                async def one_store(index: int, dst: Store) -> bool:
                    async with asyncio.TaskGroup() as tg:
                        for record in manifest.data_files():
                            tg.create_task(sender.send(src, dst, record, md5_of=md5s[record.path],
                                                       journal=journal, store_index=index))
                    published = manifest
                    if part is not None:
                        own = PartRecord(part.save_id, part.part, part.layout, tuple(manifest.data_files()),
                                         manifest.block_size, manifest.created)
                        await publish(dst, own.encode(), path=part_path(part.part))
                        if not part.publishes:
                            return True
                        found = await covered(dst, part)
                        if not found.complete:
                            self.stats.last_wait = f"{dst.url}: {found.describe()}"
                            await journal.mark_awaiting(index, [p.part for p in found.missing_parts],
                                                        list(found.missing_files))
                            return False
                        files = {**found.files, **{f.path: f for f in manifest.files}}
                        published = dataclasses.replace(manifest, files=tuple(files[n] for n in sorted(files)))
                    for record in published.last_files():
                        await sender.send(src, dst, record, md5_of=md5s[record.path], journal=journal,
                                          store_index=index)
                    await publish(dst, published.encode())
                    return True

                async with asyncio.TaskGroup() as tg:
                    tasks = [tg.create_task(one_store(index, dst)) for index, dst in enumerate(stores)]
        except BaseExceptionGroup as group:
            from ..errors import first_error

            raise first_error(group) from group
        finally:
            self.stats.bytes_drained += sender.sent_bytes
            self.stats.bytes_skipped += sender.skipped_bytes
            self.stats.current = None
        if not all(t.result() for t in tasks):
            return False
        entry.mark_drained()
        self.stats.checkpoints_drained += 1
        log.info("checkpoint %s drained to %s", entry.name, ", ".join(t.url for t in spec.targets))
        return True


async def covered(dst: Store, part: SavePart) -> Coverage:
    """How far the part records at ``dst`` cover the save whose rank 0 part is ``part``."""
    listing = {o.path: o.size for o in await dst.list()}
    records = []
    for place in part.layout:
        path = part_path(place.part)
        if path not in listing:
            continue
        try:
            records.append(PartRecord.decode(await dst.read(path), f"{dst.url}/{path}"))
        except (ManifestError, ShardNotFound) as exc:
            log.warning("part record unusable: %s", exc)  # damaged, or replaced meanwhile: not covered
    return coverage(part, records, listing)


async def publish(dst: Store, body: bytes, *, path: str = MANIFEST_PATH) -> None:
    """Write the manifest (or a part record) at ``dst``, after every file verified there; check it reads back."""
    try:
        if await dst.read(path) == body:
            return
    except StagerError:
        pass
    await dst.write(path, body)
    if await dst.read(path) != body:
        raise CheckpointError(f"{dst.url}/{path}: the record just written reads back different")


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
