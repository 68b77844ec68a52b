"""Reading a shard's bytes for the mount: from the verified cache, else one urgent block at a time.

Each open shard has one :class:`OpenBlob` (shared by every handle on it): a
file descriptor on its complete cache file, or on its partial file together
with the set of blocks known to be verified there. A read is served by
``pread`` when every block it touches is verified; reads of complete files
(the usual, warm case) first try ``preadv(RWF_NOWAIT)`` on the event loop,
which succeeds without blocking when the bytes are in the page cache, and go
to a thread only when they are not; the FUSE handler's own reads of complete
files land in a few reused buffers (no zeroing, no page faults per read). A block that is missing is first looked
up again in the cache index (the prefetcher may just have verified it), then
fetched alone, urgently, through the session (``Session.read_block``), and
its verified bytes serve the read at once. The last few fetched blocks are
kept in memory, so a reader crawling through a fresh block in small reads
does not go back to the session for each.

Bytes on the cache disk are not trusted either (:mod:`stager.cache.reader`):
the first time this mount process reads a block of a cache file, the whole
block is read and hashed against the manifest's block digest before any of it
is served (and kept among the recent blocks, so the kernel's next reads of it
come from memory); later reads of a checked block are plain ``pread`` s. A
block that does not match is dropped through the core's cache reader (the
whole blob, if complete) and fetched again alone, urgently, like a missing
one; if that fails, the read fails (EIO). ``CacheConfig.verify_reads = "off"``
skips the check. Opening a blob's file (complete, or partial with its
verified blocks, again while it is renamed or evicted) and dropping bad bytes
are the core's (:class:`~stager.cache.reader.BlockReads`); what is the
mount's own here is its table of open blobs, the descriptors kept while reads
use them, the recent blocks, and the ``RWF_NOWAIT`` reads on the loop.

File descriptors are never closed while a read may be using them: a handle
that moves from a partial file to the complete one keeps the old descriptor
(same bytes: the file was renamed, or verified bytes that stay valid) until
the shard's last handle is released and no read is in flight.
"""

from __future__ import annotations

import asyncio
import errno
import os
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from stager.cache import CacheTier
from stager.cache.fileio import pread_exact, readinto_exact
from stager.cache.reader import BlockReads, CacheFile, FileIdentity, VerifiedReads
from stager.errors import CacheError
from stager.hashing import block_range
from stager.session import DatasetHandle, Session

_RWF_NOWAIT = getattr(os, "RWF_NOWAIT", 0)
REUSED_BUFFER = 1 << 20  # the kernel's largest read request (FUSE max_pages 256)
REUSED_BUFFERS = 16


def _same_file(a: int, b: int) -> bool:
    sa, sb = os.fstat(a), os.fstat(b)
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


class OpenBlob:
    """One shard's blob as the mount reads it; shared by every open handle of the shard."""

    __slots__ = ("index", "digest", "size", "block_size", "path", "refs", "busy", "fds", "complete", "verified",
                 "identity", "checked")

    def __init__(self, index: int, digest: str, size: int, block_size: int, path: str) -> None:
        self.index = index
        self.digest = digest
        self.size = size
        self.block_size = block_size
        self.path = path  # the shard's path in the dataset, for messages
        self.refs = 0
        self.busy = 0  # reads in flight
        self.fds: list[int] = []  # the last is current; older ones wait for the last release
        self.complete = False
        self.verified: frozenset[int] = frozenset()
        self.identity: FileIdentity = (0, 0)  # (device, inode) of the current file
        self.checked = False  # every block of the current file was checked by this process

    @property
    def fd(self) -> int | None:
        return self.fds[-1] if self.fds else None


class CacheReader:
    """Serves byte ranges of one dataset's shards for the mount.

    Args:
        session: fetches missing blocks (``read_block``).
        dataset: the dataset opened through that session.
        cache: the cache tier on the same directory the session fills (read-only use here: its files are
            opened, and bad bytes dropped, through :class:`~stager.cache.reader.BlockReads`).
        executor: threads for reads that may block on the disk.
        recent_blocks: how many freshly fetched (or checked) blocks to keep in memory.
    """

    def __init__(self, session: Session, dataset: DatasetHandle, cache: CacheTier, executor: ThreadPoolExecutor,
                 *, recent_blocks: int = 8) -> None:
        self.session = session
        self.dataset = dataset
        self.manifest = dataset.manifest
        self._executor = executor
        self._open: dict[str, OpenBlob] = {}
        self._recent: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._recent_max = recent_blocks
        self._nowait = bool(_RWF_NOWAIT)
        self._buffers: list[bytearray] = []  # see _pread_reused
        self.checks = VerifiedReads(cache.config.verify_reads)
        self.reads = BlockReads(cache.complete_path, lambda: cache)  # the cache's probe and drop of bad bytes

    # -- open and release -----------------------------------------------------------------------

    async def open(self, index: int) -> OpenBlob:
        """The blob of shard ``index``, probed in the cache on its first open.

        Raises:
            CacheError: the cache index cannot be read.
        """
        m = self.manifest
        digest = m.digest(index)
        blob = self._open.get(digest)
        if blob is None:
            blob = OpenBlob(index, digest, int(m.sizes[index]), m.block_size, m.paths[index])
            self._open[digest] = blob
            blob.refs += 1
            try:
                await self._refresh(blob)
            except BaseException:
                self.release(blob)
                raise
            return blob
        blob.refs += 1
        return blob

    def release(self, blob: OpenBlob) -> None:
        """One handle fewer; the last one closes the blob's files (once no read uses them)."""
        blob.refs -= 1
        self._close_if_unused(blob)

    def _close_if_unused(self, blob: OpenBlob) -> None:
        if blob.refs > 0 or blob.busy > 0:
            return
        if self._open.get(blob.digest) is blob:
            del self._open[blob.digest]
        fds, blob.fds = blob.fds, []
        for fd in fds:
            os.close(fd)

    def close(self) -> None:
        """Close every file (at unmount)."""
        for blob in list(self._open.values()):
            blob.refs = blob.busy = 0
            self._close_if_unused(blob)

    # -- state from the cache -------------------------------------------------------------------

    async def _refresh(self, blob: OpenBlob) -> None:
        """Look the blob up in the cache again: the complete file's open is cheap enough for the event
        loop; the index query (sqlite) for a partial blob goes to a thread."""
        if blob.complete:
            return
        fd = self.reads.open_complete(blob.digest)  # a file under blobs/ is always complete and verified
        if fd is not None:
            found: CacheFile | None = CacheFile(fd, True, frozenset())
        else:
            found = await asyncio.get_running_loop().run_in_executor(self._executor, self.reads.open_any, blob.digest)
        if found is None:
            return
        fd = found.fd
        if blob.fds and _same_file(fd, blob.fds[-1]):
            os.close(fd)  # the file we have (a commit renames the partial file: same inode, now complete)
        elif blob.fds and not found.complete and found.verified <= blob.verified:
            os.close(fd)  # nothing new
            return
        else:
            blob.fds.append(fd)
            st = os.fstat(fd)
            blob.identity = (st.st_dev, st.st_ino)
            blob.checked = self.checks.file_checked(blob.identity)
        blob.complete = found.complete
        blob.verified = found.verified

    # -- reading --------------------------------------------------------------------------------

    async def read(self, blob: OpenBlob, offset: int, size: int, *, replied_at_once: bool = False
                   ) -> bytes | bytearray | memoryview:
        """Up to ``size`` bytes at ``offset`` (fewer at the end of the shard), all verified.

        ``replied_at_once``: the caller hands what is returned to the kernel before the event loop runs
        anything else (the FUSE handler's own task, which replies as soon as the read returns); a read of a
        complete file may then come in a buffer that is used again for later reads.

        Raises:
            OriginError: a missing block could not be fetched within the retry budget.
            CacheError: the cache could not hold or read it.
        """
        end = min(offset + size, blob.size)
        if offset >= end:
            return b""
        blob.busy += 1
        try:
            if blob.complete and self._checked(blob, offset, end):
                if replied_at_once:
                    return await self._pread_reused(blob.fds[-1], end - offset, offset)
                return await self._pread(blob.fds[-1], end - offset, offset)
            return await self._read_blocks(blob, offset, end)
        finally:
            blob.busy -= 1
            self._close_if_unused(blob)

    def _checked(self, blob: OpenBlob, offset: int, end: int) -> bool:
        """Whether every block of ``[offset, end)`` in the blob's current file was checked by this process."""
        if blob.checked or not self.checks.enabled:
            return True
        bs = blob.block_size
        if all(self.checks.block_checked(blob.identity, b) for b in range(offset // bs, (end - 1) // bs + 1)):
            blob.checked = self.checks.file_checked(blob.identity)
            return True
        return False

    @staticmethod
    def _on_disk(blob: OpenBlob, block: int) -> bool:
        return blob.fd is not None and (blob.complete or block in blob.verified)

    async def _read_blocks(self, blob: OpenBlob, offset: int, end: int) -> bytes | bytearray | memoryview:
        bs = blob.block_size
        blocks = range(offset // bs, (end - 1) // bs + 1)
        fetched: dict[int, bytes | bytearray] = {}
        for b in blocks:
            data = self._recent.get((blob.digest, b))
            if data is not None:
                self._recent.move_to_end((blob.digest, b))
                fetched[b] = data
        missing = [b for b in blocks if b not in fetched and not self._on_disk(blob, b)]
        if missing:
            await self._refresh(blob)  # the prefetcher may have verified them meanwhile
            missing = [b for b in missing if not self._on_disk(blob, b)]
        for b in blocks:  # on disk, but not checked by this process yet: read the whole block and hash it
            if b in fetched or b in missing or self.checks.block_checked(blob.identity, b):
                continue
            data = await self._read_checked(blob, b)
            if data is None:
                missing.append(b)  # bad on disk, dropped: fetched again below
            else:
                fetched[b] = data
        if missing:
            results = await asyncio.gather(*(self.session.read_block(self.dataset, blob.index, b) for b in missing))
            for b, data in zip(missing, results):
                fetched[b] = data
                self._remember(blob.digest, b, data)
        if not fetched:
            return await self._pread(blob.fds[-1], end - offset, offset)
        parts: list[bytes | bytearray | memoryview] = []
        for b in blocks:
            start, stop = block_range(b, blob.size, bs)
            lo, hi = max(offset, start), min(end, stop)
            data = fetched.get(b)
            if data is not None:
                parts.append(memoryview(data)[lo - start:hi - start])  # no copy of a block for a small read
            else:
                parts.append(await self._pread(blob.fds[-1], hi - lo, lo))
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def _read_checked(self, blob: OpenBlob, block: int) -> bytes | bytearray | None:
        """Block ``block`` read from the blob's cache file and checked against the manifest; None if its
        bytes do not match (then it is dropped from the cache, and this blob looked up afresh)."""
        start, stop = block_range(block, blob.size, blob.block_size)
        fd, identity = blob.fds[-1], blob.identity
        data = await self._pread(fd, stop - start, start)
        expected = self.manifest.block_digests(blob.index)
        if self.checks.check_block(identity, block, data, expected[block], len(expected)):
            self._remember(blob.digest, block, data)
            return data
        drop = partial(self.reads.drop, blob.digest, identity, None if blob.complete else [block],
                       where=f" ({blob.path}) block {block}")
        await asyncio.get_running_loop().run_in_executor(self._executor, drop)  # fetched again below
        self.checks.forget(identity)
        if blob.identity == identity:  # look the blob up again before the next read trusts its file
            blob.complete = False
            blob.checked = False
            blob.verified = blob.verified - {block}
        return None

    def _remember(self, digest: str, block: int, data: bytes | bytearray) -> None:
        self._recent[(digest, block)] = data
        self._recent.move_to_end((digest, block))
        while len(self._recent) > self._recent_max:
            self._recent.popitem(last=False)

    async def _pread_reused(self, fd: int, length: int, offset: int) -> memoryview:
        """``_pread`` into one of the reused buffers, handed back to them once the reply is sent.

        A fresh 1 MiB buffer per read costs its zeroing and a page fault per 4 KiB on top of the copy
        itself: 12 to 15% of the mount process's CPU (perf) when the page cache was dropped and every
        read comes to the mount.
        """
        buf = self._buffers.pop() if self._buffers else bytearray(REUSED_BUFFER)
        if len(buf) < length:
            buf = bytearray(length)
        view = memoryview(buf)[:length]
        try:
            done = 0
            if self._nowait:
                try:
                    done = os.preadv(fd, [view], offset, _RWF_NOWAIT)
                except BlockingIOError:
                    pass
                except OSError as exc:
                    if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                        raise CacheError(f"reading the cache: {exc.strerror}") from exc
                    self._nowait = False
            if done < length:
                await asyncio.get_running_loop().run_in_executor(self._executor, readinto_exact, fd,
                                                                 view[done:], offset + done)
        except BaseException:
            self._give_back(buf)
            raise
        # The caller replies before the loop runs this: the buffer is free again after the reply.
        asyncio.get_running_loop().call_soon(self._give_back, buf)
        return view

    def _give_back(self, buf: bytearray) -> None:
        if len(buf) == REUSED_BUFFER and len(self._buffers) < REUSED_BUFFERS:
            self._buffers.append(buf)

    async def _pread(self, fd: int, length: int, offset: int) -> bytes | bytearray:
        if self._nowait:
            buf = bytearray(length)
            try:
                if os.preadv(fd, [buf], offset, _RWF_NOWAIT) == length:
                    return buf  # all of it was in the page cache
            except BlockingIOError:
                pass
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise CacheError(f"reading the cache: {exc.strerror}") from exc
                self._nowait = False  # a file system without RWF_NOWAIT: threads only
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, pread_exact, fd, length, offset)
