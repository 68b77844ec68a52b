"""Fetching a blob (or some of its blocks) into the cache: lock, resume, parallel verified blocks, commit.

A :class:`BlobJob` is the single flight for one blob in this process (the
engine keeps one per digest and every waiter shares it). It serves two kinds
of wants, in any mix: the whole blob (``want_all``, what ``Engine.ensure``
and plans ask for; resolved with the complete file's path once committed) and
single blocks (``want``, what a reader blocked on one block asks for, e.g. the
FUSE mount; resolved once the block is verified and recorded, for the reader
to take from the cache). Each wanted block has one future shared by all its
waiters, so a block is fetched once however many ask for it and whichever kind
of want asked first; a block wanted urgently while the whole-blob fetch has it
queued just has its queued request boosted.

Across processes that share the cache directory, the cache's per-blob file
lock plays the same role: the job takes it first. A job that finds it held
waits for the other process, serving meanwhile the wanted blocks that process
verifies, then finds the blob complete (or resumes what that process left). A
job that only served single blocks keeps the lock for ``IDLE_RELEASE``
seconds after its last want (the next read of the blob is likely near), then
closes the partial file and releases the lock so other processes can proceed.

Blocks are the unit of verification; requests are ranged GETs of runs of
consecutive wanted blocks (up to ``FetchConfig.request_bytes``; a block a
reader waits for alone gets a request of its own), fetched in parallel
through the engine's priority gate. A request's body streams into its place
in the partial file as it arrives (batched ``pwritev`` on the disk threads, a
few batches in flight, so memory stays small whatever the sizes), each block
hashed on the way and checked at its end: a block that matches the manifest
is recorded as verified at once and its waiters served while the rest of the
request arrives; one that does not fails the attempt, which the store's retry
loop repeats (blocks recorded before it are kept and not written again; the
bytes of the failed attempt count for nothing and are written over once its
writes have ended). A request that straggles is raced by a hedged request that
keeps its bytes in memory; if the hedge wins, the first request is cancelled
and its writes settled before the hedge's bytes are written. Blocks a previous
run already verified are not fetched again. When every block is verified and
the whole blob is wanted, the partial file is committed by rename, after a
re-hash of the whole file: blocks that changed on the disk since they were
recorded are forgotten by the commit and fetched again. A disk write
in progress is always let finish before the partial file's handle is closed,
even when the job is cancelled.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Awaitable, Callable, TypeVar

import xxhash

from ..cache import BlobState
from ..cache.direct import ALIGN as DIRECT_ALIGN
from ..cache.fileio import cut_views
from ..errors import (AccessDenied, BlobSourceError, CacheCorrupt, CacheError, CorruptData, ShardNotFound,
                      StagerError)
from ..hashing import block_digest, block_range
from ..store import RangeSink
from .hedging import hedged
from .source import ORIGIN

if TYPE_CHECKING:
    from ..cache import BlobLock, PartialBlob
    from .gate import PriorityGate
    from .dataset import BlobRef
    from .engine import Engine
    from .source import BlobSource

log = logging.getLogger(__name__)

T = TypeVar("T")

FOREIGN_LOCK_POLL = 0.25  # seconds per blocking try on another process's blob lock
IDLE_RELEASE = 1.0  # seconds a job serving single blocks keeps the blob after its last want
COMMIT_ATTEMPTS = 3  # commits refused for blocks that rotted on disk before the blob fails


def _retrieve(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()  # a failure nobody awaited is not logged as lost


async def _finish_even_if_cancelled(awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` to its end even if the caller is cancelled meanwhile (then re-raise).

    A block write runs in a thread that cancellation cannot stop; the partial
    file's handle must not be closed under it.
    """
    task = asyncio.ensure_future(awaitable)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])
        raise


class _Block:
    """One block a job fetches: its gate priority and the future its waiters share.

    The future's result is None once the block is verified and recorded
    (readers then read it from the cache), or bytes if the job held them.
    """

    __slots__ = ("index", "priority", "future", "explicit", "span")

    def __init__(self, index: int, priority: float) -> None:
        self.index = index
        self.priority = priority
        self.future: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
        self.future.add_done_callback(_retrieve)
        self.explicit = False  # someone waits for this very block: a whole-blob failure does not stop it
        self.span: _Span | None = None  # the request it goes in, once there is one


def _release_if_taken(lock: "BlobLock") -> Callable[[concurrent.futures.Future[bool]], None]:
    """A done-callback for an abandoned ``lock.acquire`` in a thread: release what it took."""
    def release(attempt: concurrent.futures.Future[bool]) -> None:
        if not attempt.cancelled() and attempt.exception() is None and attempt.result():
            lock.release()
    return release


class _Span:
    """Consecutive blocks fetched by one ranged GET, each verified and recorded as soon as it is in.

    Blocks are the unit of verification, spans the unit of requests: small
    blocks let a reader have the block it waits for sooner, while whole-blob
    fetches still go as requests of about ``FetchConfig.request_bytes``.
    """

    __slots__ = ("blocks", "priority")

    def __init__(self, blocks: list[_Block]) -> None:
        self.blocks = blocks
        self.priority = min(block.priority for block in blocks)
        for block in blocks:
            block.span = self

    def boost(self, gate: "PriorityGate", priority: float) -> None:
        if priority < self.priority:
            self.priority = priority
            gate.boost(self, priority)


class BlobJob:
    """Brings wanted blocks of one blob, or all of it, into the cache once, however many wait."""

    def __init__(self, engine: "Engine", ref: "BlobRef", priority: float = math.inf) -> None:
        self.engine = engine
        self.ref = ref
        self.priority = priority  # of the whole blob; inf while only single blocks are wanted
        self.task: asyncio.Task[None] | None = None
        self._blocks: dict[int, _Block] = {}
        self._whole: asyncio.Future[Path] | None = None
        self._wake = asyncio.Event()

    # -- wants (called on the event loop by the engine) ------------------------------------

    def want_all(self, priority: float) -> asyncio.Future[Path]:
        """The whole blob: a future resolved with its complete path (or the error that stopped it)."""
        if self._whole is None or self._whole.done():
            self._whole = asyncio.get_running_loop().create_future()
            self._whole.add_done_callback(_retrieve)
        self.boost(priority)
        self._wake.set()
        return self._whole

    def want(self, index: int, priority: float) -> asyncio.Future[bytes | None]:
        """One block: a future resolved with its verified bytes, or None if it was already on disk."""
        block = self._blocks.get(index)
        if block is None:
            block = self._blocks[index] = _Block(index, priority)
        elif priority < block.priority:
            block.priority = priority
            if block.span is not None:
                block.span.boost(self.engine.gate, priority)
        block.explicit = True
        self._wake.set()
        return block.future

    def boost(self, priority: float) -> None:
        """A consumer now waits for the whole blob: let its queued blocks go first."""
        if priority < self.priority:
            self.priority = priority
            for block in self._blocks.values():
                mine = self._block_priority(block.index)
                if mine < block.priority:
                    block.priority = mine
                    if block.span is not None:
                        block.span.boost(self.engine.gate, mine)

    def _block_priority(self, index: int) -> float:
        return self.priority + index * 1e-6  # nearer blocks of the blob first

    # -- resolution ------------------------------------------------------------------------

    def _finish(self, path: Path) -> None:
        """The blob is complete: every want is served, and later wants go to a new job."""
        self._detach()
        if self._whole is not None and not self._whole.done():
            self._whole.set_result(path)
        self._whole = None
        for block in self._blocks.values():
            if not block.future.done():
                block.future.set_result(None)
        self._blocks.clear()

    def _fail(self, error: BaseException) -> None:
        """Nothing more will be fetched: every open want gets ``error``, later wants go to a new job."""
        self._detach()
        futures = [block.future for block in self._blocks.values()]
        if self._whole is not None:
            futures.append(self._whole)
        self._blocks.clear()
        self._whole = None
        for future in futures:
            if future.done():
                continue
            if isinstance(error, asyncio.CancelledError):
                future.cancel()
            else:
                future.set_exception(error)

    def _idle(self) -> bool:
        return self._whole is None and not self._blocks

    def _detach(self) -> None:
        """Leave the engine's table: later wants start a new job (this one is finishing)."""
        jobs = self.engine._jobs
        if jobs.get(self.ref.digest) is self:
            del jobs[self.ref.digest]

    # -- the job ---------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self._run()
        except BaseException as exc:
            self._fail(exc)
            raise
        finally:
            self._detach()
        if not self._idle():  # pragma: no cover - every path above serves or fails its wants
            self._fail(StagerError(f"{self.ref.path}: blob job ended with wants unserved (a bug)"))

    async def _run(self) -> None:
        engine, ref = self.engine, self.ref
        cache = engine.cache
        if cache.state(ref.digest) is BlobState.COMPLETE:
            if self._whole is not None:
                engine.stats.blobs_already_cached += 1
            self._finish(cache.complete_path(ref.digest))
            return
        lock = cache.lock(ref.digest)
        if not lock.try_lock():
            if not await self._wait_foreign_lock(lock):
                return
            if cache.state(ref.digest) is BlobState.COMPLETE:
                lock.release()
                engine.stats.blobs_from_other_process += 1
                self._finish(cache.complete_path(ref.digest))
                return
        try:
            await self._fetch_locked()
        finally:
            lock.release()

    async def _wait_foreign_lock(self, lock: "BlobLock") -> bool:
        """Wait for another holder of the blob's lock; True once we hold it.

        False: the blob became complete meanwhile, or the blocks still wanted
        were all verified by the other process (their wants are served).
        """
        # flock has no async wake-up: wait in a thread, in short tries so cancellation is prompt.
        while True:
            attempt = self.engine.lock_waiters.submit(lock.acquire, FOREIGN_LOCK_POLL)
            try:
                if await asyncio.shield(asyncio.wrap_future(attempt)):
                    return True
            except asyncio.CancelledError:
                # The thread may still take the lock after we stop waiting: it gives it back then,
                # itself. (Not through the event loop, which may be closed by then: a lock taken
                # for an engine that is gone would stay held until the process exits.)
                attempt.add_done_callback(_release_if_taken(lock))
                raise
            if await self._serve_from_other_process():
                return False

    async def _serve_from_other_process(self) -> bool:
        """Serve the wanted blocks another process has verified; True if nothing is left to wait for."""
        engine, digest = self.engine, self.ref.digest
        record = await engine.in_disk_thread(engine.cache.record, digest)
        if record is not None and record.state is BlobState.COMPLETE:
            engine.stats.blobs_from_other_process += 1
            self._finish(engine.cache.complete_path(digest))
            return True
        verified = record.verified if record is not None else frozenset()
        for index in [i for i in self._blocks if i in verified]:
            block = self._blocks.pop(index)
            if not block.future.done():
                block.future.set_result(None)
        return self._idle()

    async def _fetch_locked(self) -> None:
        engine, ref = self.engine, self.ref
        cache = engine.cache
        if cache.state(ref.digest) is BlobState.COMPLETE:
            engine.stats.blobs_from_other_process += 1
            self._finish(cache.complete_path(ref.digest))
            return
        partial = await engine.in_disk_thread(
            cache.begin, ref.digest, ref.size, ref.block_size, ref.blocks,
            rank=engine.eviction_rank, protect=engine.protected_digests())
        try:
            if partial.complete:
                self._finish(partial.path)
                return
            await self._fill(partial)
        finally:
            await engine.in_disk_thread(partial.close)

    async def _fill(self, partial: "PartialBlob") -> None:
        """Fetch what is wanted until the blob is committed, or nothing has been wanted for a while."""
        engine = self.engine
        inflight: dict[int, asyncio.Task[None]] = {}
        rotted_commits = 0
        try:
            while True:
                verified = partial.verified
                for index in [i for i in self._blocks if i in verified and i not in inflight]:
                    block = self._blocks.pop(index)
                    if not block.future.done():
                        block.future.set_result(None)
                if self._whole is not None:
                    for index in partial.missing_blocks():
                        if index not in self._blocks:
                            self._blocks[index] = _Block(index, self._block_priority(index))
                for span in self._spans([block for index, block in sorted(self._blocks.items())
                                         if index not in inflight]):
                    task = asyncio.create_task(self._fetch_span(partial, span))
                    for block in span.blocks:
                        inflight[block.index] = task
                if not inflight:
                    if self._whole is not None:  # every block is verified
                        try:
                            path = await engine.in_disk_thread(partial.commit)
                        except CacheCorrupt:
                            # Recorded blocks changed on the disk (forgotten by the commit): fetch them
                            # again, a few times at most; a disk that keeps rotting them fails the blob.
                            engine.stats.verify_failures += 1
                            rotted_commits += 1
                            if rotted_commits > COMMIT_ATTEMPTS:
                                raise
                            continue
                        engine.stats.blobs_completed += 1
                        self._finish(path)
                        return
                    if not await self._wait_for_wants(IDLE_RELEASE):
                        return
                    continue
                self._wake.clear()
                woken = asyncio.ensure_future(self._wake.wait())
                try:
                    await asyncio.wait({woken, *set(inflight.values())}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    woken.cancel()
                for index, task in list(inflight.items()):
                    if task.done():
                        del inflight[index]
                        self._block_done(index, task, inflight)
        finally:
            tasks = set(inflight.values())
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)

    def _spans(self, blocks: list[_Block]) -> list[_Span]:
        """``blocks`` (in index order) as requests: runs of consecutive blocks up to ``request_bytes``.

        A block someone waits for alone starts a span of its own, so its
        request is as short as can be and its reader is served first.
        """
        spans: list[_Span] = []
        run: list[_Block] = []
        block_size = self.ref.block_size
        for block in blocks:
            if run and (block.index != run[-1].index + 1 or block.explicit or run[-1].explicit
                        or (len(run) + 1) * block_size > self.engine.config.request_bytes):
                spans.append(_Span(run))
                run = []
            run.append(block)
        if run:
            spans.append(_Span(run))
        return spans

    def _block_done(self, index: int, task: asyncio.Task[None], inflight: dict[int, asyncio.Task[None]]) -> None:
        block = self._blocks.pop(index, None)
        if task.cancelled():  # only the whole blob wanted it, and the whole blob failed
            if block is not None and block.explicit:
                self._blocks[index] = block  # but a reader asked for it meanwhile: fetch it anew
            elif block is not None:
                block.future.cancel()
            return
        error = task.exception()
        if error is None:
            return
        if block is not None and not block.future.done():
            block.future.set_exception(error)
        if isinstance(error, CacheError):
            raise error  # the partial file cannot take blocks (evicted, disk full): the next want begins anew
        if isinstance(error, (AccessDenied, ShardNotFound)):
            raise error  # refused through this job's store (its consumer's keys): the next want begins anew
        if self._whole is not None and not self._whole.done():
            self._whole.set_exception(error)  # the whole blob fails with its first failed block
            self._whole = None
            for other, other_task in list(inflight.items()):  # and stops fetching what only it wanted
                other_block = self._blocks.get(other)
                if other_block is not None and not other_block.explicit:
                    other_task.cancel()

    async def _wait_for_wants(self, timeout: float) -> bool:
        """Only single blocks were wanted and all are served: keep the blob a moment for the next
        read; False once nothing was wanted for ``timeout`` seconds (the job then leaves the table)."""
        self._wake.clear()
        try:
            async with asyncio.timeout(timeout):
                await self._wake.wait()
        except TimeoutError:
            pass
        if self._idle():
            self._detach()
            return False
        return True

    async def _fetch_span(self, partial: "PartialBlob", span: _Span) -> None:
        """The span's blocks from the blob's sources in turn, each taking the blocks still unverified."""
        engine, ref = self.engine, self.ref
        indexes = [block.index for block in span.blocks]
        start = block_range(indexes[0], ref.size, ref.block_size)[0]
        end = block_range(indexes[-1], ref.size, ref.block_size)[1]
        try:
            sources = engine.sources.for_blob(ref)
            for n, source in enumerate(sources):
                todo = [index for index in indexes if index not in partial.verified]
                if not todo:
                    break
                if n == len(sources) - 1:  # the origin: its retry policy, hedged, its errors stand
                    # Only origin requests take a slot of the gate: a peer's answer may wait on a fetch that
                    # peer makes for this node, and two nodes whose slots all waited on each other would
                    # both stall (peer requests are bounded by the peer client's connections instead).
                    async with engine.gate.slot(span.priority, owner=span, nbytes=end - start):
                        await self._from_origin(partial, source, todo[0], todo[-1])
                    break
                try:
                    await self._from_source(partial, source, todo[0], todo[-1])
                except (BlobSourceError, CorruptData, TimeoutError) as exc:
                    engine.stats.source_failures[source.kind] = engine.stats.source_failures.get(source.kind, 0) + 1
                    log.info("%s: blocks %d-%d not from %s (the next source is tried): %s",
                             ref.path, todo[0], todo[-1], source.name, exc or type(exc).__name__)
        except Exception as exc:  # cancellation is settled by the job (the blocks may be wanted again)
            for block in span.blocks:
                if not block.future.done():
                    block.future.set_exception(exc)
            raise

    def _corrupt(self, index: int) -> CorruptData:
        ref = self.ref
        self.engine.stats.verify_failures += 1
        first, last = block_range(index, ref.size, ref.block_size)
        return CorruptData(f"{ref.dataset.name}/{ref.path}: block {index} (bytes {first}-{last}) "
                           "does not match the manifest digest")

    def _verified(self, kind: str) -> Callable[[int, int], None]:
        """What is done once a block from a source of ``kind`` is recorded: its waiters may read it."""
        engine, ref = self.engine, self.ref

        def verified(index: int, nbytes: int) -> None:
            block = self._blocks.get(index)
            if block is not None and not block.future.done():
                block.future.set_result(None)
            engine.stats.bytes_fetched += nbytes
            engine.stats.blocks_fetched += 1
            if kind == ORIGIN:
                engine.stats.bytes_from_origin += nbytes
            else:
                engine.stats.bytes_from_peers += nbytes
            engine.on_block_fetched(ref, nbytes)
        return verified

    def _writer(self, partial: "PartialBlob", first: int, last: int, kind: str) -> Callable[[], "_SpanWriter"]:
        """Opens a sink per attempt that streams blocks ``first..last`` into the partial file, hashed on the way."""
        verified = self._verified(kind)
        return lambda: _SpanWriter(self.engine, partial, self.ref, first, last, self._corrupt, verified)

    async def _from_source(self, partial: "PartialBlob", source: "BlobSource", first: int, last: int) -> None:
        """Blocks ``first..last`` from a source that is not the last: not hedged, bounded by its own
        timeout and corrupt budget (past it, a :class:`BlobSourceError`)."""
        ref = self.ref
        start = block_range(first, ref.size, ref.block_size)[0]
        end = block_range(last, ref.size, ref.block_size)[1]
        sinks = _CorruptBudget(self._writer(partial, first, last, source.kind), source)
        if source.timeout is None:
            await source.read_into(ref, start, end, sinks.open)
        else:
            async with asyncio.timeout(source.timeout):
                await source.read_into(ref, start, end, sinks.open)

    async def _from_origin(self, partial: "PartialBlob", source: "BlobSource", first: int, last: int) -> None:
        """Blocks ``first..last`` from the last source (the origin), raced by a hedge if it straggles."""
        engine, ref = self.engine, self.ref
        config = engine.config
        indexes = range(first, last + 1)
        start = block_range(first, ref.size, ref.block_size)[0]
        end = block_range(last, ref.size, ref.block_size)[1]
        verified = self._verified(source.kind)

        def stream() -> Awaitable[None]:  # into the partial file as the bytes arrive, hashed on the way
            return source.read_into(ref, start, end, self._writer(partial, first, last, source.kind))

        def check(data: bytes) -> None:
            view = memoryview(data)
            for index in indexes:
                lo, hi = block_range(index, ref.size, ref.block_size)
                if block_digest(view[lo - start:hi - start]) != ref.blocks[index]:
                    raise self._corrupt(index)

        def in_memory() -> Awaitable[bytes]:  # the hedge: must not write where the first request writes
            return source.read(ref, start, end, check=check)

        def count_hedge() -> None:
            engine.stats.hedged_requests += 1

        delay = engine.latency.hedge_delay(end - start, config.hedge_factor, config.hedge_min_delay) \
            if config.hedge else None
        began = time.monotonic()
        data, hedge_won = await hedged(stream, delay, count_hedge, make_hedge=in_memory)
        engine.latency.record(time.monotonic() - began, end - start)
        if hedge_won:  # the first request was cancelled and its writes settled: ours go over them
            engine.stats.hedges_won += 1
            view = memoryview(data)
            for index in indexes:
                if index in partial.verified:
                    continue
                lo, hi = block_range(index, ref.size, ref.block_size)
                await _finish_even_if_cancelled(engine.start_in_disk_thread(
                    partial.write_into_block, index, lo, [view[lo - start:hi - start]]))
                await _finish_even_if_cancelled(engine.start_in_disk_thread(
                    partial.mark_verified, index, durable=config.durable))
                verified(index, hi - lo)


class _CorruptBudget:
    """Opens a source's sinks, counting the attempts whose bytes fail verification; past the source's
    ``corrupt_budget`` the attempt fails with :class:`BlobSourceError` instead (not retried by the source)."""

    def __init__(self, open_sink: Callable[[], RangeSink], source: "BlobSource") -> None:
        self._open_sink = open_sink
        self._source = source
        self.failures = 0

    def open(self) -> RangeSink:
        return _BudgetedSink(self._open_sink(), self)

    def failed(self, exc: CorruptData) -> BlobSourceError | None:
        self.failures += 1
        if self.failures > self._source.corrupt_budget:
            return BlobSourceError(f"{self._source.name}: {self.failures} attempts failed verification: {exc}")
        return None


class _BudgetedSink(RangeSink):
    def __init__(self, sink: RangeSink, budget: _CorruptBudget) -> None:
        self._sink = sink
        self._budget = budget

    async def write(self, chunk: bytes) -> None:
        try:
            await self._sink.write(chunk)
        except CorruptData as exc:
            raise self._budget.failed(exc) or exc

    async def close(self) -> None:
        try:
            await self._sink.close()
        except CorruptData as exc:
            raise self._budget.failed(exc) or exc

    async def abort(self) -> None:
        await self._sink.abort()


#: Bytes of a streaming request gathered (within one block) before they go to a disk thread in one pwritev.
WRITE_BATCH = 1 << 20
#: Batches of one request on their way to the disk at once; the next chunk waits for room.
WRITES_IN_FLIGHT = 2


class _SpanWriter(RangeSink):
    """One attempt at a span: written into the partial file as it arrives, each block hashed on the way.

    At the end of each block its digest is checked (a mismatch fails the
    attempt, to be retried) and, once its writes are on disk, it is recorded
    as verified and its waiters served, while the rest of the span streams on.
    Blocks already verified (by an earlier attempt) are neither hashed nor
    written again. Memory held is about ``WRITE_BATCH * (WRITES_IN_FLIGHT + 1)``
    whatever the span's size. Every write and record this attempt started has
    ended by the time :meth:`close` or :meth:`abort` returns, so a retry or a
    hedge never races an old write.
    """

    def __init__(self, engine: "Engine", partial: "PartialBlob", ref: "BlobRef", first: int, last: int,
                 corrupt: Callable[[int], CorruptData], verified: Callable[[int, int], None]) -> None:
        self._engine = engine
        self._partial = partial
        self._ref = ref
        self._last = last
        self._corrupt = corrupt
        self._verified = verified
        self._durable = engine.config.durable
        self._writes: deque[asyncio.Future[None]] = deque()  # every write in flight, oldest first
        self._finishing: list[asyncio.Future[None]] = []  # blocks being recorded
        self._batch: list[memoryview] = []
        self._batch_bytes = 0
        self._start_block(first)

    def _start_block(self, index: int) -> None:
        self._index = index
        self._block_start, self._block_end = block_range(index, self._ref.size, self._ref.block_size)
        self._offset = self._block_start  # where the next byte goes
        self._batch_at = self._block_start
        self._skip = index in self._partial.verified
        self._hasher = xxhash.xxh3_64()
        self._block_writes: list[asyncio.Future[None]] = []

    async def write(self, chunk: bytes) -> None:
        view = memoryview(chunk)
        while len(view):
            if self._index > self._last:
                raise CorruptData(f"{self._ref.path}: a body longer than its range")
            take = min(len(view), self._block_end - self._offset)
            if not self._skip:
                piece = view[:take]
                self._hasher.update(piece)
                self._batch.append(piece)
                self._batch_bytes += take
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

    def _send_batch(self, keep_partial_page: bool = False) -> None:
        """Write the batch; inside a block, the bytes past its last page boundary wait for the next
        batch (a batch then ends on a page boundary, so all its pages may go ``O_DIRECT``)."""
        batch, nbytes, rest = self._batch, self._batch_bytes, []
        if keep_partial_page:
            keep = (self._batch_at + nbytes) % DIRECT_ALIGN
            if keep < nbytes:
                batch, rest = cut_views(batch, nbytes - keep)
                nbytes -= keep
        if batch:
            write = self._engine.start_in_disk_thread(
                self._partial.write_into_block, self._index, self._batch_at, batch)
            self._writes.append(write)
            self._block_writes.append(write)
            self._batch_at += nbytes
            self._batch = rest
            self._batch_bytes -= nbytes

    def _end_block(self) -> None:
        index = self._index
        if not self._skip:
            if self._hasher.intdigest() != self._ref.blocks[index]:
                raise self._corrupt(index)
            nbytes = self._block_end - self._block_start
            if not self._block_writes:  # the whole block in one batch: write and record it in one go
                done = self._engine.start_in_disk_thread(
                    self._partial.write_verified, index, self._batch_at, self._batch, durable=self._durable)
                done.add_done_callback(lambda f: f.cancelled() or f.exception() or self._verified(index, nbytes))
                self._writes.append(done)
                self._batch = []
                self._batch_bytes = 0
            else:
                self._send_batch()
                self._finishing.append(asyncio.ensure_future(self._record(index, self._block_writes, nbytes)))
        if index < self._last:
            self._start_block(index + 1)
        else:
            self._index = index + 1

    async def _record(self, index: int, writes: list[asyncio.Future[None]], nbytes: int) -> None:
        for write in writes:
            await asyncio.shield(write)
        await _finish_even_if_cancelled(
            self._engine.start_in_disk_thread(self._partial.mark_verified, index, durable=self._durable))
        self._verified(index, nbytes)

    async def close(self) -> None:
        if self._index <= self._last:
            raise CorruptData(f"{self._ref.path}: the body ended inside block {self._index}")
        for future in [*self._writes, *self._finishing]:
            await asyncio.shield(future)

    async def abort(self) -> None:
        self._batch = []
        pending = [*self._writes, *self._finishing]
        if pending:
            await asyncio.wait(pending)  # threads cannot be stopped: let them end
            for future in pending:
                if not future.cancelled():
                    future.exception()  # retrieved: the attempt's own error is what counts
