"""Span writing: a request's body into its place in the partial file as it arrives, block by block.

Each attempt at a span gets a :class:`SpanWriter` (a :class:`~stager.store.RangeSink`):
the bytes go out in batched ``pwritev`` calls on the disk threads (a batch
gathers the bytes of one receive buffer, and goes when the next bytes come
from another: its views alone would then keep that buffer from being used
again), a few batches in flight, so memory stays small whatever the sizes.
Each block is hashed on the way, by the disk thread that writes a batch, just
before it writes it (a blob's writes take turns, so its bytes are hashed in
order; the event loop, which every connection shares, never hashes, and the
bytes are in the CPU's cache when the write copies them), and checked at its
end. A block that matches the manifest is recorded as verified at once and
its waiters served while the rest of the request arrives; one that does not
fails the attempt, which the source's retry loop repeats (blocks recorded
before it are kept and not written again; the bytes of the failed attempt
count for nothing and are written over once its writes have ended).
:func:`write_held` settles a hedge that won: its bytes, held in memory, go
over the blocks the first request did not record, after that request's
writes have ended.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterable

import xxhash

from ..aio import to_the_end
from ..cache.direct import ALIGN as DIRECT_ALIGN
from ..diskio import cut_views
from ..errors import CorruptData
from ..hashing import block_range
from ..store import RangeSink

if TYPE_CHECKING:
    from ..cache import PartialBlob
    from .dataset import BlobRef
    from .disk_threads import DiskThreads

#: Bytes of a streaming request gathered (within one block) before they go to a disk thread in one pwritev.
WRITE_BATCH = 1 << 20
#: Batches of one request on their way to the disk at once; the next chunk waits for room.
WRITES_IN_FLIGHT = 2


class SpanWriter(RangeSink):
    """One attempt at a span: written into the partial file as it arrives, each block hashed on the way
    (by the disk threads, batch by batch, in the blob's turn).

    At the end of each block one job hashes its last batch, checks the digest
    and, if it matches, writes that batch and records the block as verified
    (its waiters are then served), while the rest of the span streams on. A
    mismatch fails the attempt (to be retried) once that job is back, so
    blocks behind it in the stream may still be recorded, each on its own
    digest; a block one of whose writes failed is never recorded.
    Blocks already verified (by an earlier attempt) are neither hashed nor
    written again. Memory held is about ``WRITE_BATCH * (WRITES_IN_FLIGHT + 1)``
    whatever the span's size. Every write and record this attempt started has
    ended by the time :meth:`close` or :meth:`abort` returns, so a retry or a
    hedge never races an old write.
    """

    def __init__(self, disk: "DiskThreads", partial: "PartialBlob", ref: "BlobRef", first: int, last: int, *,
                 durable: bool, corrupt: Callable[[int], CorruptData], verified: Callable[[int, int], None]) -> None:
        self._disk, self._durable = disk, durable
        self._partial, self._ref, self._last = partial, ref, last
        self._corrupt, self._verified = corrupt, verified  # what a bad block raises; what a recorded one tells
        self._writes: deque[asyncio.Future[Any]] = deque()  # every write in flight, oldest first
        self._batch: list[memoryview] = []
        self._batch_bytes = 0
        self._batch_source: object = None  # the receive buffer the batch's views are in (None: none is pinned)
        self._error: CorruptData | None = None  # a block that did not match: the attempt fails with it
        self._start_block(first)

    def _start_block(self, index: int) -> None:
        self._index = index
        self._block_start, self._block_end = block_range(index, self._ref.size, self._ref.block_size)
        self._offset = self._block_start  # where the next byte goes
        self._batch_at = self._block_start
        self._skip = index in self._partial.verified
        self._block = _BlockCheck()  # used only by this block's writes, which take their turns

    async def write(self, chunk: bytes) -> None:
        if self._error is not None:
            raise self._error
        view = memoryview(chunk)
        # A view of a receive buffer the batch does not hold yet: the connection has moved on from the
        # buffers the batch's views are in, and those views alone now keep them from being used again
        # (a connection may be waiting for one of them to come free): the batch goes now.
        source = view.obj if isinstance(chunk, memoryview) else None
        if source is not self._batch_source and self._batch_source is not None:
            self._send_batch(keep_partial_page=True)
        while len(view):
            if self._index > self._last:
                raise CorruptData(f"{self._ref.path}: a body longer than its range")
            take = min(len(view), self._block_end - self._offset)
            if not self._skip:
                piece = view[:take]
                self._batch.append(piece)
                self._batch_bytes += take
                self._batch_source = source
            self._offset += take
            view = view[take:]
            if self._offset == self._block_end:
                self._end_block()
            elif self._batch_bytes >= WRITE_BATCH:
                self._send_batch(keep_partial_page=True)
            while len(self._writes) > WRITES_IN_FLIGHT:
                if self._writes[0].done():
                    self._writes.popleft().result()  # its error (disk full) ends the attempt
                else:
                    await asyncio.shield(self._writes[0])
            if self._error is not None:
                raise self._error

    def _send_batch(self, keep_partial_page: bool = False) -> None:
        """Write the batch; inside a block, the bytes past its last page boundary wait for the next
        batch (a batch then ends on a page boundary, so all its pages may go ``O_DIRECT``)."""
        batch, nbytes, rest = self._batch, self._batch_bytes, []
        if keep_partial_page:
            keep = min(nbytes, (self._batch_at + nbytes) % DIRECT_ALIGN)
            if keep:
                batch, rest = cut_views(batch, nbytes - keep)
                rest = [memoryview(b"".join(rest))]  # a copy of less than a page: a view would pin a receive buffer
                nbytes -= keep
        self._batch_source = None  # what is left, if anything, is a copy
        if batch:
            self._writes.append(self._disk.start_in_turn(
                self._partial, _hash_and_write, self._block, self._partial, self._index, self._batch_at, batch))
            self._batch_at += nbytes
            self._batch = rest
            self._batch_bytes -= nbytes

    def _end_block(self) -> None:
        index = self._index
        if not self._skip:  # one trip to the disk threads: hash the last batch, check, write and record
            nbytes = self._block_end - self._block_start
            done = self._disk.start_in_turn(self._partial, _finish_block, self._block, self._ref.blocks[index],
                                            self._partial, index, self._batch_at, self._batch, self._durable)
            done.add_done_callback(lambda f: f.cancelled() or f.exception() or self._recorded(f.result(), index,
                                                                                            nbytes))
            self._writes.append(done)
            self._batch = []
            self._batch_bytes = 0
            self._batch_source = None
        if index < self._last:
            self._start_block(index + 1)
        else:
            self._index = index + 1

    def _recorded(self, matched: bool | None, index: int, nbytes: int) -> None:
        """A block's check came back: recorded (its waiters are served); not the manifest's bytes (the
        attempt fails); or None: an earlier write of it failed, and that write's error ends the attempt."""
        if matched:
            self._verified(index, nbytes)
        elif matched is not None and self._error is None:
            self._error = self._corrupt(index)

    async def close(self) -> None:
        if self._error is not None:
            raise self._error
        if self._index <= self._last:
            raise CorruptData(f"{self._ref.path}: the body ended inside block {self._index}")
        for future in list(self._writes):
            await asyncio.shield(future)
        if self._error is not None:
            raise self._error

    async def abort(self) -> None:
        self._batch = []
        self._batch_source = None
        pending = list(self._writes)
        if pending:
            await asyncio.wait(pending)  # threads cannot be stopped: let them end
            for future in pending:
                if not future.cancelled():
                    future.exception()  # retrieved: the attempt's own error is what counts


class _BlockCheck:
    """A block's hash as its batches are written (on the disk threads, in turn), and whether a write failed."""

    __slots__ = ("hasher", "failed")

    def __init__(self) -> None:
        self.hasher = xxhash.xxh3_64()
        self.failed = False


def _hash_and_write(block: _BlockCheck, partial: "PartialBlob", index: int, offset: int,
                    batch: list[memoryview]) -> None:
    """On a disk thread, in the blob's turn: hash a batch of a block (its bytes in order), then write it."""
    for view in batch:
        block.hasher.update(view)
    try:
        partial.write_into_block(index, offset, batch)
    except BaseException:
        block.failed = True
        raise


def _finish_block(block: _BlockCheck, expected: int, partial: "PartialBlob", index: int, offset: int,
                  batch: list[memoryview], durable: bool) -> bool | None:
    """On a disk thread, after the block's other batches: hash its last batch; if the block matches the
    manifest, write that batch and record the block (True). False: it does not match (nothing is
    recorded). None: an earlier batch's write failed (nothing is recorded; that write tells why)."""
    for view in batch:
        block.hasher.update(view)
    if block.hasher.intdigest() != expected:
        return False
    if block.failed:
        return None
    if batch:
        partial.write_verified(index, offset, batch, durable=durable)
    else:
        partial.mark_verified(index, durable=durable)
    return True


async def write_held(disk: "DiskThreads", partial: "PartialBlob", ref: "BlobRef", indexes: Iterable[int], start: int,
                     data: bytes, *, durable: bool, verified: Callable[[int, int], None]) -> None:
    """Write and record the blocks ``indexes`` of ``data`` (bytes from ``start`` of the blob, already
    verified) that the partial file does not hold yet; each write ends even if the caller is cancelled."""
    view = memoryview(data)
    for index in indexes:
        if index in partial.verified:
            continue
        first, last = block_range(index, ref.size, ref.block_size)
        await to_the_end(disk.start_in_turn(partial, partial.write_into_block, index, first,
                                            [view[first - start:last - start]]))
        await to_the_end(disk.start(partial.mark_verified, index, durable=durable))
        verified(index, last - first)
