"""A blob's single flight: one job per blob, shared by every waiter, and its lock across processes.

A :class:`BlobJob` is the single flight for one blob in this process (the
engine keeps one per digest in its context's job table and every waiter
shares it). It serves two kinds of wants, in any mix: the whole blob
(``want_all``, what ``Engine.ensure`` and plans ask for; resolved with the
complete file's path once committed) and single blocks (``want``, what a
reader blocked on one block asks for, e.g. the FUSE mount; resolved once the
block is verified and recorded, for the reader to take from the cache). Each
wanted block has one future shared by all its waiters, so a block is fetched
once however many ask for it and whichever kind of want asked first; a block
wanted urgently while the whole-blob fetch has it queued just has its queued
request boosted.

Across processes that share the cache directory, the cache's per-blob file
lock plays the same role: the job takes it first. A job that finds it held
waits for the other process, serving meanwhile the wanted blocks that process
verifies, then finds the blob complete (or resumes what that process left). A
job that only served single blocks keeps the lock for ``IDLE_RELEASE``
seconds after its last want (the next read of the blob is likely near), then
closes the partial file and releases the lock so other processes can proceed.

Holding the lock, the job reserves room (``cache.begin``), groups the wanted
blocks not yet verified into requests (:mod:`.spans`) and fetches each as a
:class:`~.span_fetch.SpanFetch`, in parallel. Blocks a previous run already
verified are not fetched again. Where the blob's sources stagger it
(:func:`~.source.first_block`, a cluster node's children in a blob's tree),
the requests start at that block and the blocks before it go last, once the
rest are in; blocks a reader waits for, or a consumer blocked on the whole
blob, never wait. When every block is verified and the whole
blob is wanted, the partial file is committed by rename, after a re-hash of
the whole file: blocks that changed on the disk since they were recorded are
forgotten by the commit and fetched again. A disk write in progress is always
let finish before the partial file's handle is closed, even when the job is
cancelled.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..aio import retrieve, to_the_end, wait_until_set
from ..cache import BlobState
from ..errors import AccessDenied, CacheCorrupt, CacheError, ShardNotFound, StagerError
from .plan import URGENT
from .source import first_block
from .span_fetch import SpanFetch
from .spans import WantedBlock, block_priority, plan_spans

if TYPE_CHECKING:
    from ..cache import BlobLock, PartialBlob
    from .context import FetchContext
    from .dataset import BlobRef

FOREIGN_LOCK_POLL = 0.25  # seconds per blocking try on another process's blob lock
IDLE_RELEASE = 1.0  # seconds a job serving single blocks keeps the blob after its last want
COMMIT_ATTEMPTS = 3  # commits refused for blocks that rotted on disk before the blob fails


def _release_if_taken(lock: "BlobLock") -> Callable[[concurrent.futures.Future[bool]], None]:
    """A done-callback for an abandoned ``lock.acquire`` in a thread: release what it took."""
    def release(attempt: concurrent.futures.Future[bool]) -> None:
        if not attempt.cancelled() and attempt.exception() is None and attempt.result():
            lock.release()
    return release


class BlobJob:
    """Brings wanted blocks of one blob, or all of it, into the cache once, however many wait."""

    def __init__(self, ctx: "FetchContext", ref: "BlobRef", priority: float = math.inf) -> None:
        self._ctx = ctx
        self.ref = ref
        self.priority = priority  # of the whole blob; inf while only single blocks are wanted
        self.task: asyncio.Task[None] | None = None
        self._blocks: dict[int, WantedBlock] = {}
        self._whole: asyncio.Future[Path] | None = None
        self._wake = asyncio.Event()

    # -- wants (called on the event loop by the engine) ------------------------------------

    def want_all(self, priority: float) -> asyncio.Future[Path]:
        """The whole blob: a future resolved with its complete path (or the error that stopped it)."""
        if self._whole is None or self._whole.done():
            self._whole = asyncio.get_running_loop().create_future()
            self._whole.add_done_callback(retrieve)
        self.boost(priority)
        self._wake.set()
        return self._whole

    def want(self, index: int, priority: float) -> asyncio.Future[bytes | None]:
        """One block: a future resolved with its verified bytes, or None if it was already on disk."""
        block = self._blocks.get(index)
        if block is None:
            block = self._blocks[index] = WantedBlock(index, priority)
        else:
            block.boost(self._ctx.gate, priority)
        block.explicit = True
        self._wake.set()
        return block.future

    def boost(self, priority: float) -> None:
        """A consumer now waits for the whole blob: let its queued blocks go first."""
        if priority < self.priority:
            self.priority = priority
            for block in self._blocks.values():
                block.boost(self._ctx.gate, block_priority(priority, block.index))

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
        jobs = self._ctx.jobs
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
        ctx, ref = self._ctx, self.ref
        cache = ctx.cache
        lock = cache.lock(ref.digest)
        taken = await self._try_lock(lock)
        if taken is None:  # complete before we looked
            if self._whole is not None:
                ctx.stats.blobs_already_cached += 1
            self._finish(cache.complete_path(ref.digest))
            return
        if not taken:
            if not await self._wait_foreign_lock(lock):
                return
            if cache.state(ref.digest) is BlobState.COMPLETE:
                await self._release(lock)
                ctx.stats.blobs_from_other_process += 1
                self._finish(cache.complete_path(ref.digest))
                return
        try:
            await self._fetch_locked()
        finally:
            await self._release(lock)

    async def _try_lock(self, lock: "BlobLock") -> bool | None:
        """In a thread: None if the blob is complete, else ``lock.try_lock()``. Off the event loop, as
        the index's read waits behind the commits' writes, and so does making a lock file where byte
        locks are refused: on the loop, a dataset of thousands of small files stalled it for seconds
        (measured)."""
        cache, digest = self._ctx.cache, self.ref.digest

        def attempt_lock() -> bool | None:
            return None if cache.state(digest) is BlobState.COMPLETE else lock.try_lock()

        return await self._lock_attempt(lock, attempt_lock)

    async def _lock_attempt(self, lock: "BlobLock", attempt: Callable[[], bool | None]) -> bool | None:
        """``attempt()`` (which may take ``lock``) on the lock threads; its answer.

        Cancelled meanwhile, the thread may still take the lock after we stop waiting: it gives it
        back then, itself. (Not through the event loop, which may be closed by then: a lock taken
        for an engine that is gone would stay held until the process exits.)
        """
        running = self._ctx.lock_waiters.submit(attempt)
        try:
            return await asyncio.shield(asyncio.wrap_future(running))
        except asyncio.CancelledError:
            running.add_done_callback(_release_if_taken(lock))
            raise

    async def _release(self, lock: "BlobLock") -> None:
        """``lock.release()``: here if it never waits, else (a lock file to unlink) in a thread, to its
        end even if cancelled."""
        if lock.releases_at_once:
            lock.release()
            return
        try:
            released = self._ctx.lock_waiters.submit(lock.release)
        except RuntimeError:  # the engine is closing and its lock threads are gone: here, then
            lock.release()
            return
        await to_the_end(asyncio.wrap_future(released))

    async def _wait_foreign_lock(self, lock: "BlobLock") -> bool:
        """Wait for another holder of the blob's lock; True once we hold it.

        False: the blob became complete meanwhile, or the blocks still wanted
        were all verified by the other process (their wants are served).
        """
        # Neither kind of blob lock has an async wake-up: wait in a thread, in short tries so
        # cancellation is prompt.
        while True:
            if await self._lock_attempt(lock, lambda: lock.acquire(FOREIGN_LOCK_POLL)):
                return True
            if await self._serve_from_other_process():
                return False

    async def _serve_from_other_process(self) -> bool:
        """Serve the wanted blocks another process has verified; True if nothing is left to wait for."""
        ctx, digest = self._ctx, self.ref.digest
        record = await ctx.in_disk_thread(ctx.cache.record, digest)
        if record is not None and record.state is BlobState.COMPLETE:
            ctx.stats.blobs_from_other_process += 1
            self._finish(ctx.cache.complete_path(digest))
            return True
        verified = record.verified if record is not None else frozenset()
        for index in [i for i in self._blocks if i in verified]:
            block = self._blocks.pop(index)
            if not block.future.done():
                block.future.set_result(None)
        return self._idle()

    async def _fetch_locked(self) -> None:
        ctx, ref = self._ctx, self.ref
        cache = ctx.cache
        partial = await ctx.in_disk_thread(
            cache.begin, ref.digest, ref.size, ref.block_size, ref.blocks,
            rank=ctx.eviction_rank, protect=ctx.protected_digests(), unsynced=not ctx.config.durable)
        try:
            if partial.complete:  # committed by another process since we looked
                ctx.stats.blobs_from_other_process += 1
                self._finish(partial.path)
                return
            await self._fill(partial)
        finally:
            if not partial.closed:  # a commit closes it in the same thread
                await ctx.in_disk_thread(partial.close)

    async def _fill(self, partial: "PartialBlob") -> None:
        """Fetch what is wanted until the blob is committed, or nothing has been wanted for a while."""
        ctx = self._ctx
        inflight: dict[int, asyncio.Task[None]] = {}
        rotted_commits = 0
        span_blocks = min(len(self.ref.blocks), max(1, ctx.config.request_bytes // self.ref.block_size))
        head = first_block(ctx.sources, self.ref, span_blocks)  # the blocks before it are fetched last
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
                            self._blocks[index] = WantedBlock(index, block_priority(self.priority, index))
                queued = [block for index, block in sorted(self._blocks.items()) if index not in inflight]
                if head and self.priority > URGENT \
                        and (any(i >= head for i in inflight) or any(b.index >= head for b in queued)):
                    # A staggered whole-blob fetch: its requests start at block ``head`` (so they fall on a
                    # grid shifted from its siblings'), the blocks before it wait until the rest are in. A
                    # block someone waits for (explicit), or any once a consumer is blocked on the whole
                    # blob, never waits.
                    queued = [b for b in queued if b.index >= head or b.explicit]
                for span in plan_spans(queued, self.ref.block_size, ctx.config.request_bytes):
                    task = asyncio.create_task(SpanFetch(ctx, self.ref, partial, span, self._served).run())
                    for block in span.blocks:
                        inflight[block.index] = task
                if not inflight:
                    if self._whole is not None:  # every block is verified
                        try:
                            path = await ctx.in_disk_thread(_commit_and_close, partial)
                        except CacheCorrupt:
                            # Recorded blocks changed on the disk (forgotten by the commit): fetch them
                            # again, a few times at most; a disk that keeps rotting them fails the blob.
                            ctx.stats.verify_failures += 1
                            rotted_commits += 1
                            if rotted_commits > COMMIT_ATTEMPTS:
                                raise
                            continue
                        ctx.stats.blobs_completed += 1
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
        await wait_until_set(self._wake, timeout)
        if self._idle():
            self._detach()
            return False
        return True

    def _served(self, index: int) -> None:
        """Block ``index`` is verified and recorded: its waiters may read it from the cache."""
        block = self._blocks.get(index)
        if block is not None and not block.future.done():
            block.future.set_result(None)


def _commit_and_close(partial: "PartialBlob") -> Path:
    """Commit the blob and close its handle, in one trip to a disk thread (the job is done with it)."""
    path = partial.commit()
    partial.close()
    return path
