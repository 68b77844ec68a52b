"""Copying one object from the source store to the destination store, verified, resumable.

Bytes stream through memory, never through a local file: an object no larger
than a part is one ranged read and one ``write``; a larger one is cut into
parts of a whole number of manifest blocks (at least S3's 5 MiB minimum, at
most 10,000 parts), each read as a few ranged GETs of whole blocks at once
(a store caps each connection) and sent with ``Upload.write_part``, many
parts at once. Every read is checked inside the
store's retry loop (``read_range(..., check=...)``): each block's xxh3-64 must
match the manifest, so a short, corrupted or substituted body is retried and
never reaches the destination. A small object is also checked whole
(xxh3-128). The destination store's own retry policy retries failed writes.

Resuming: a multipart upload is recorded in the journal with the store's
resume token as soon as it starts, and each part once written, so a rerun
after kill -9 resumes the upload and sends only the parts that were in
flight. An upload that is gone (it completed just before the kill) is
checked at the destination instead of being sent again.

A part holds its bytes from the start of its read until the journal records
it, and a kill loses what the parts held then: the next run reads them again.
So the parts held at once have a gate of their own, driven by a controller
like the two below from a couple of parts up, to what brings throughput (at
most what the byte budget and ``concurrency`` allow): a destination that
takes parts slowly gets fewer held at once, not a budget full of parts read
and waiting to be written.

Requests in flight: each side has its own :class:`~stager.engine.PriorityGate`
driven by its own :class:`~stager.engine.concurrency.ConcurrencyController`
(the one the engine uses), so reads follow what the source can give and
writes what the destination takes, up to ``concurrency`` each; the byte
budget still bounds the memory of the transfers in flight.

Checking (``--verify``, or an object of the right size nothing vouches for):
the destination copy is read part by part, without retrying mismatches, and
its block digests compared with the manifest.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

import xxhash

from ..engine.concurrency import ConcurrencyController
from ..engine.gate import PriorityGate
from ..errors import (CorruptData, DestinationGone, NotAtDestination, OriginChanged, OriginError, ShardNotFound,
                      StagerError, UploadLost, first_error)
from ..store import InvalidRange, RangeSink, Store, UnsupportedOperation, Upload
from ..store.parts import MAX_PARTS
from .budget import ByteBudget
from .journal import Journal
from .plan import PlanItem
from .stats import ReplicateStats

MiB = 1 << 20
#: S3 refuses parts smaller than this, except the last one.
MIN_PART_SIZE = 5 * MiB
#: 8 MiB: a killed run loses the parts it held, and smaller parts lose less for the same throughput
#: (benchmarks/README.md, "Resume after a kill": 0.055 of the dataset read twice against 0.076 with 16 MiB).
DEFAULT_PART_SIZE = 8 * MiB
#: Parts held at once at the start (see the module's docstring); the number grows while it brings throughput.
INITIAL_HELD_PARTS = 2
#: A part is read as up to this many ranged GETs at once, each of whole blocks (one block each for 8 MiB
#: parts of 1 MiB blocks): an object store caps each connection (a few MB/s to tens), and the parts held
#: are bounded by memory, so one GET per part would hold the copy to (parts held) x (one connection's
#: rate). The bytes are received straight into the part's buffer, so more GETs cost no more memory.
READS_PER_PART = 8
#: A part is cut so that each GET takes about this long from its first byte, at the best rate one GET has
#: reached: where one connection is fast (a source on this host or rack), more GETs would only add requests.
PIECE_SECONDS = 0.25


@contextmanager
def _writing(dst: Store, path: str) -> Iterator[None]:
    try:
        yield
    except ShardNotFound as exc:
        raise DestinationGone(f"{dst.url}/{path}: the destination refused the write as not found "
                              f"(does the bucket exist?): {exc}") from exc


@contextmanager
def _uploading(dst: Store, path: str) -> Iterator[None]:
    try:
        yield
    except ShardNotFound as exc:  # NoSuchUpload
        raise UploadLost(f"{dst.url}/{path}: the multipart upload is gone (aborted or expired before it "
                         f"completed): {exc}") from exc


def part_size_for(size: int, block_size: int, target: int = DEFAULT_PART_SIZE) -> int:
    """The part size for an object of ``size`` bytes: whole blocks, >= 5 MiB, at most 10,000 parts."""
    blocks = max(1, -(-max(target, MIN_PART_SIZE) // block_size))
    part = blocks * block_size
    if -(-size // part) > MAX_PARTS:
        per_part = -(-size // MAX_PARTS)
        part = -(-per_part // block_size) * block_size
    return part


class Copier:
    """Copies and checks objects of one plan.

    Args:
        src, dst: the two stores.
        journal: where finished objects and parts are committed.
        block_size: the manifest's block size.
        part_size: the target part size for large objects (rounded to whole blocks, >= 5 MiB).
        budget: bytes in flight (see :mod:`.budget`).
        stats: counters to update.
        verify_after: read every copy back and check it before recording it done.
        before_change: awaited before the first write to the destination (removes a stale manifest).
        copy: False for ``--finalize``: an object that would need copying raises NotAtDestination.
        concurrency: the most requests in flight per side (None: only the stores' own limits, fixed);
            the number in flight then adapts to each side below it.
    """

    def __init__(
        self,
        src: Store,
        dst: Store,
        journal: Journal,
        *,
        block_size: int,
        part_size: int,
        budget: ByteBudget,
        stats: ReplicateStats,
        verify_after: bool = False,
        before_change: Callable[[], Awaitable[None]] | None = None,
        copy: bool = True,
        concurrency: int | None = None,
    ) -> None:
        self.src = src
        self.dst = dst
        self.journal = journal
        self.block_size = block_size
        self.part_size = part_size_for(0, block_size, part_size)
        self.budget = budget
        self.stats = stats
        self.verify_after = verify_after
        self.copy_enabled = copy
        self._before_change = before_change
        self._buffers = _BufferPool()
        self._best_read_rate = 0.0  # bytes/s: the fastest one GET of a part's blocks has been
        first, last = self._pieces(0, self.part_size)[0]  # a full read: one GET of a part cut as at the start
        self.read_gate = _adaptive_gate(src, concurrency, last - first)
        self.write_gate = _adaptive_gate(dst, concurrency, self.part_size)
        held = max(1, min(budget.capacity // self.part_size, concurrency or budget.capacity))
        self.part_gate = PriorityGate(1, controller=ConcurrencyController(
            held, initial=INITIAL_HELD_PARTS, full_request=self.part_size, slow_start=False))

    async def replicate(self, item: PlanItem) -> None:
        """Bring ``item`` to the destination (or find it there), verified, and record it.

        Raises:
            OriginChanged: the source keeps serving bytes other than the manifest says.
            CorruptData: the destination copy did not read back right (``verify_after``).
            NotAtDestination: ``copy=False`` and the object is missing or different.
            OriginError: either side failed beyond its retry budget.
        """
        stats = self.stats
        if item.action.is_check:
            if await self.matches(item):
                await self.journal.record_done(item.path, item.digest, item.size)
                stats.objects_done += 1
                stats.bytes_done += item.size
                return
            stats.check_mismatches += 1
        if not self.copy_enabled:
            raise NotAtDestination(f"{self.dst.url}/{item.path}: {item.action.reason}" if not item.action.is_check
                                   else f"{self.dst.url}/{item.path}: differs from the source manifest")
        if item.size <= self.part_size:
            await self._copy_whole(item)
        else:
            await self._copy_parts(item)
        if self.verify_after and not await self.matches(item):
            await self.journal.forget(item.path)
            raise CorruptData(f"{self.dst.url}/{item.path}: the copy does not read back as the manifest says")
        await self.journal.record_done(item.path, item.digest, item.size)
        stats.objects_done += 1
        stats.copied_objects += 1

    async def _changing(self) -> None:
        if self._before_change is not None:
            await self._before_change()

    # -- reading the source ------------------------------------------------------------

    def _checker(self, item: PlanItem, start: int) -> Callable[[bytes], None]:
        """Raises CorruptData (counted) unless every block of bytes read from ``start`` matches the manifest."""
        find_bad = self._bad_block_finder(item, start)
        corrupt = self._corrupt(item)

        def check(data: bytes) -> None:
            bad = find_bad(data)
            if bad is not None:
                raise corrupt(bad)

        return check

    def _bad_block_finder(self, item: PlanItem, start: int) -> Callable[[bytes], int | None]:
        """The first block of bytes read from ``start`` that does not match the manifest, or None (touches
        nothing but the bytes: it may run on a thread)."""
        first = start // self.block_size
        block_size = self.block_size
        blocks = item.blocks

        def find_bad(data: bytes) -> int | None:
            view = memoryview(data)
            for k, offset in enumerate(range(0, len(view), block_size)):
                if xxhash.xxh3_64_intdigest(view[offset:offset + block_size]) != int(blocks[first + k]):
                    return first + k
            return None

        return find_bad

    def _corrupt(self, item: PlanItem) -> Callable[[int], CorruptData]:
        stats = self.stats

        def corrupt(block: int) -> CorruptData:
            stats.corrupt_blocks += 1
            return CorruptData(f"{item.path}: block {block} does not match the manifest")

        return corrupt

    async def _read(self, item: PlanItem, start: int, end: int) -> bytes:
        """``[start, end)`` of the source object, every block verified (retried until it is)."""
        async with self.read_gate.slot(nbytes=end - start):
            return await self.src.read_range(item.path, start, end, check=self._checker(item, start))

    async def _read_into(self, buffer: bytearray, item: PlanItem, start: int, end: int) -> memoryview:
        """As :meth:`_read`, into ``buffer`` (reused from part to part: no fresh pages to fault in), as
        ranged GETs of whole blocks at once (:data:`READS_PER_PART`), each verified and retried alone."""
        view = memoryview(buffer)[:end - start]
        pieces = self._pieces(start, end)
        if len(pieces) == 1:
            await self._read_piece(view, item, start, end)
            return view
        try:
            async with asyncio.TaskGroup() as tg:
                for first, last in pieces:
                    tg.create_task(self._read_piece(view[first - start:last - start], item, first, last))
        except BaseExceptionGroup as group:
            raise first_error(group) from None
        return view

    async def _read_piece(self, view: memoryview, item: PlanItem, start: int, end: int) -> None:
        find_bad, corrupt = self._bad_block_finder(item, start), self._corrupt(item)
        sinks: list[_BufferSink] = []

        def open_sink() -> _BufferSink:
            sinks.append(_BufferSink(view, find_bad, corrupt))
            return sinks[-1]

        async with self.read_gate.slot(nbytes=end - start):
            await self.src.read_range_into(item.path, start, end, open_sink)
        # the rate from the first byte on: the wait for it is latency, which more GETs per part do not cut
        seconds = time.monotonic() - sinks[-1].first_byte_at if sinks and sinks[-1].first_byte_at else 0.0
        if seconds > 0 and end - start > 1:
            self._best_read_rate = max(self._best_read_rate, (end - start) / seconds)

    def _pieces(self, start: int, end: int) -> list[tuple[int, int]]:
        """``[start, end)`` (``start`` on a block boundary) cut into runs of whole blocks, each about
        PIECE_SECONDS at the best rate one GET has reached (READS_PER_PART of them until one has ended)."""
        blocks = -(-(end - start) // self.block_size)
        wanted = READS_PER_PART
        if self._best_read_rate > 0:
            wanted = math.ceil((end - start) / (self._best_read_rate * PIECE_SECONDS))
        per_piece = -(-blocks // max(1, min(READS_PER_PART, blocks, wanted))) * self.block_size
        return [(at, min(at + per_piece, end)) for at in range(start, end, per_piece)]

    # -- small objects -----------------------------------------------------------------

    async def _copy_whole(self, item: PlanItem) -> None:
        granted = await self.budget.acquire(item.size)
        try:
            data = await self._read(item, 0, item.size)
            if xxhash.xxh3_128_digest(data) != item.digest:
                raise OriginChanged(f"{item.path}: blocks match the manifest but the whole-object digest does not")
            await self._changing()
            with _writing(self.dst, item.path):
                async with self.write_gate.slot(nbytes=len(data)):
                    await self.dst.write(item.path, data)
            self.stats.copied_bytes += item.size
            self.stats.bytes_done += item.size
        finally:
            self.budget.release(granted)

    # -- large objects -----------------------------------------------------------------

    async def _copy_parts(self, item: PlanItem) -> None:
        part_size = part_size_for(item.size, self.block_size, self.part_size)
        opened = await self._open_upload(item, part_size)
        if opened is None:
            return
        upload, written = opened
        count = -(-item.size // part_size)
        try:
            async with asyncio.TaskGroup() as tg:
                for number in range(1, count + 1):
                    if number in written:
                        continue
                    start = (number - 1) * part_size
                    end = min(start + part_size, item.size)
                    await self.part_gate.acquire()
                    held = _HeldPart(self.part_gate, self.budget, end - start)
                    try:
                        held.granted = await self.budget.acquire(end - start)
                    except BaseException:
                        held.release(False)
                        raise
                    task = tg.create_task(self._part(upload, item, number, start, end, held))
                    task.add_done_callback(lambda _, held=held: held.release(False))  # cancelled before it ran
        except BaseExceptionGroup as group:
            raise first_error(group) from None
        await self._changing()
        try:
            with _uploading(self.dst, item.path):
                await upload.complete()
        except UploadLost:
            await self.journal.forget(item.path)
            raise

    async def _part(self, upload: Upload, item: PlanItem, number: int, start: int, end: int, held: _HeldPart) -> None:
        """Copy one part, then give back what it ``held`` (a slot of ``part_gate`` and its share of the budget)."""
        buffer = self._buffers.take(end - start)
        ok = False
        try:
            data = await self._read_into(buffer, item, start, end)
            with _uploading(self.dst, item.path):
                async with self.write_gate.slot(nbytes=len(data)):
                    await upload.write_part(number, data)
            await self.journal.record_part(item.path, number, len(data))
            self.stats.copied_bytes += len(data)
            self.stats.bytes_done += len(data)
            ok = True
        finally:
            self._buffers.give_back(buffer)
            held.release(ok)

    async def _open_upload(self, item: PlanItem, part_size: int) -> tuple[Upload, set[int]] | None:
        """A resumed upload and its written parts, or a new one; None if the object turned out complete."""
        record = await self.journal.upload_of(item.path)
        if record is not None:
            if record.digest == item.digest and record.part_size == part_size:
                try:
                    upload = await self.dst.resume_upload(item.path, part_size=part_size, token=record.token,
                                                          parts=record.parts)
                except (ShardNotFound, UnsupportedOperation):
                    # Gone: completed just before a kill, or expired. Look before copying again.
                    if await self.matches(item):
                        self.stats.bytes_done += item.size
                        return None
                else:
                    resumed = sum(record.parts.values())
                    self.stats.resumed_bytes += resumed
                    self.stats.bytes_done += resumed
                    return upload, set(record.parts)
            else:
                await abort_upload(self.dst, item.path, record.part_size, record.token)
        await self._changing()
        with _writing(self.dst, item.path):
            upload = await self.dst.open_upload(item.path, part_size=part_size)
        if upload.token is not None:
            await self.journal.begin_upload(item.path, item.digest, part_size, upload.token)
        return upload, set()

    # -- checking the destination ------------------------------------------------------

    async def matches(self, item: PlanItem) -> bool:
        """Whether the destination object has exactly the manifest's bytes (read and hashed)."""
        step = self.part_size
        try:
            info = await self.dst.info(item.path)
            if info.size != item.size:
                return False
            for start in range(0, item.size, step):
                end = min(start + step, item.size)
                granted = await self.budget.acquire(end - start)
                try:
                    data = await self.dst.read_range(item.path, start, end)
                finally:
                    self.budget.release(granted)
                try:
                    self._checker(item, start)(data)
                except CorruptData:
                    self.stats.corrupt_blocks -= 1  # a stale destination copy, not a bad source read
                    return False
                self.stats.checked_bytes += end - start
        except (ShardNotFound, InvalidRange):
            return False
        self.stats.checked_objects += 1
        return True


class _BufferSink(RangeSink):
    """One attempt at a part, received into (or copied into) a reused buffer, its blocks checked at the end
    on a thread (the event loop, which every transfer shares, does not hash)."""

    def __init__(self, view: memoryview, find_bad: Callable[[bytes], int | None],
                 corrupt: Callable[[int], CorruptData]) -> None:
        self._view = view
        self._find_bad = find_bad
        self._corrupt = corrupt
        self._filled = 0
        self.first_byte_at = 0.0  # monotonic time of the first write

    def receive_into(self) -> memoryview:
        return self._view  # an HTTP store receives straight into the part's buffer: no buffer of its own, no copy

    async def write(self, chunk: bytes) -> None:
        if not self.first_byte_at:
            self.first_byte_at = time.monotonic()
        end = self._filled + len(chunk)
        if end > len(self._view):  # the store checks lengths; never write past the part
            raise CorruptData(f"a body longer than its {len(self._view)}-byte range")
        if not (isinstance(chunk, memoryview) and chunk.obj is self._view.obj):  # else received in place
            self._view[self._filled:end] = chunk
        self._filled = end

    async def close(self) -> None:
        if self._filled != len(self._view):
            raise CorruptData(f"a body of {self._filled} bytes for a {len(self._view)}-byte range")
        bad = await asyncio.to_thread(self._find_bad, self._view)  # type: ignore[arg-type]
        if bad is not None:
            raise self._corrupt(bad)

    async def abort(self) -> None:
        self._filled = 0


class _HeldPart:
    """A part's slot of the copier's part gate and its share of the byte budget, given back once."""

    __slots__ = ("gate", "budget", "nbytes", "granted", "began", "released")

    def __init__(self, gate: PriorityGate, budget: ByteBudget, nbytes: int) -> None:
        self.gate = gate
        self.budget = budget
        self.nbytes = nbytes
        self.granted = 0
        self.began = time.monotonic()
        self.released = False

    def release(self, ok: bool) -> None:
        if self.released:
            return
        self.released = True
        self.budget.release(self.granted)
        self.gate.release_after(time.monotonic() - self.began, self.nbytes, ok)


class _BufferPool:
    """Part buffers handed from part to part: a fresh 16 MiB allocation per part costs more in page
    faults than copying its bytes. The byte budget bounds how many are out at once."""

    KEEP = 8  # idle buffers kept

    def __init__(self) -> None:
        self._idle: list[bytearray] = []

    def take(self, size: int) -> bytearray:
        for i, buffer in enumerate(self._idle):
            if len(buffer) >= size:
                return self._idle.pop(i)
        return bytearray(size)

    def give_back(self, buffer: bytearray) -> None:
        if len(self._idle) < self.KEEP:
            self._idle.append(buffer)


def _adaptive_gate(store: Store, concurrency: int | None, full_request: int) -> PriorityGate:
    """A gate for the requests to ``store``: adaptive up to ``concurrency``, or wide open if None."""
    if concurrency is None:
        return PriorityGate(1 << 30)
    stats = getattr(store, "stats", None)
    controller = ConcurrencyController(concurrency, full_request=full_request,
                                       throttled=lambda: stats.throttled if stats is not None else 0)
    return PriorityGate(controller.limit, controller=controller)


async def abort_upload(dst: Store, path: str, part_size: int, token: str) -> None:
    """Discard an upload left by an earlier run (best effort: it may be gone already)."""
    try:
        upload = await dst.resume_upload(path, part_size=part_size, token=token, parts={})
        await upload.abort()
    except (ShardNotFound, UnsupportedOperation):
        pass
