"""Sending one checkpoint file from one store to another, verified at both ends, resumable.

The bytes are read from the source in parts of whole blocks, every block
checked against the file's record inside the source store's retry loop (so a
byte that changed on the staging disk, or a corrupt body from a remote copy,
is never sent). A file of at most one part is one ``write``; a larger one is
a multipart upload whose parts are written concurrently, its resume token and
each finished part recorded in the :class:`~.journal.DrainJournal`, so a drain
started again after a kill sends only the parts that were in flight.

Then the destination is checked: the size, and the MD5 the store vouches for
(S3's ETag) against the source's MD5 where both are known; otherwise the file
is read back and every block hashed. A file already there and good (sent by a
drain killed before it could record it) is recorded without being sent again.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from pathlib import Path

from ..errors import CorruptData, ShardNotFound
from ..hashing import StreamHasher, block_digest
from ..store import Store, UnsupportedOperation
from .journal import DrainJournal
from .manifest import FileRecord

MiB = 1 << 20
DEFAULT_PART_SIZE = 16 * MiB
MIN_PART_SIZE = 5 * MiB  # S3's smallest part (but the last)

Md5Of = Callable[[], Awaitable[str | None]]


def part_size_for(block_size: int, wanted: int = DEFAULT_PART_SIZE) -> int:
    """A part size of whole blocks, at least S3's minimum."""
    size = max(wanted, MIN_PART_SIZE)
    return -(-size // block_size) * block_size


def block_check(record: FileRecord, start: int, block_size: int) -> Callable[[bytes], None]:
    """A ``check`` for a read of ``record`` from ``start`` (a block boundary): every block must match."""
    first = start // block_size

    def check(data: bytes) -> None:
        view = memoryview(data)
        for i in range(0, len(view), block_size):
            if block_digest(view[i:i + block_size]) != record.blocks[first + i // block_size]:
                raise CorruptData(f"{record.path}: block {first + i // block_size} does not match its digest")

    return check


def local_md5(path: Path) -> Md5Of:
    """The MD5 of a local file, computed once (in a thread) when first asked for."""
    result: list[str] = []

    def compute() -> str:
        h = hashlib.md5()
        with open(path, "rb") as fh:
            while chunk := fh.read(8 * MiB):
                h.update(chunk)
        return h.hexdigest()

    async def md5() -> str:
        if not result:
            result.append(await asyncio.to_thread(compute))
        return result[0]

    return md5


async def holds(store: Store, record: FileRecord, block_size: int, md5_of: Md5Of | None = None,
                part_size: int = DEFAULT_PART_SIZE) -> bool:
    """Whether ``store`` holds exactly ``record``'s bytes (see the module docstring).

    Raises:
        OriginError: the store failed otherwise than "not found" (after retries).
    """
    try:
        info = await store.info(record.path)
    except ShardNotFound:
        return False
    if info.size != record.size:
        return False
    if info.md5 is not None and md5_of is not None:
        ours = await md5_of()
        if ours is not None:
            return info.md5 == ours
    return await reads_back(store, record, block_size, part_size)


async def reads_back(store: Store, record: FileRecord, block_size: int, part_size: int = DEFAULT_PART_SIZE) -> bool:
    """Read ``record`` back from ``store`` and compare every block and the whole digest (no retry on mismatch)."""
    hasher = StreamHasher(block_size)
    step = part_size_for(block_size, part_size)
    try:
        for start in range(0, record.size, step):
            hasher.update(await store.read_range(record.path, start, min(start + step, record.size)))
    except (ShardNotFound, CorruptData):
        return False
    digest, blocks = hasher.finish()
    return digest == record.digest and tuple(blocks) == record.blocks


class Sender:
    """Sends files between stores (see the module docstring); ``sent_bytes`` counts what went out."""

    def __init__(self, block_size: int, *, part_size: int = DEFAULT_PART_SIZE, concurrency: int = 8) -> None:
        self.block_size = block_size
        self.part_size = part_size_for(block_size, part_size)
        self._slots = asyncio.Semaphore(concurrency)
        self.sent_bytes = 0
        self.skipped_bytes = 0  # found good at the store already: not sent

    async def send(self, src: Store, dst: Store, record: FileRecord, *, md5_of: Md5Of | None = None,
                   journal: DrainJournal | None = None, store_index: int = 0) -> None:
        """Make ``dst`` hold ``record``'s bytes from ``src``, verified; record it in ``journal``.

        Raises:
            OriginChanged: the source's bytes keep failing the record (the copy there is damaged).
            CorruptData: what landed at ``dst`` does not read back as the record.
            OriginError: either store failed as a whole.
        """
        if journal is not None and journal.is_verified(store_index, record.path, record.digest):
            return
        if await holds(dst, record, self.block_size, md5_of, self.part_size):
            self.skipped_bytes += record.size
        else:
            if record.size <= self.part_size:
                async with self._slots:
                    data = await src.read_range(record.path, 0, record.size,
                                                check=block_check(record, 0, self.block_size))
                    await dst.write(record.path, data)
                    self.sent_bytes += len(data)
            else:
                await self._multipart(src, dst, record, journal, store_index)
            if not await holds(dst, record, self.block_size, md5_of, self.part_size):
                raise CorruptData(f"{dst.url}/{record.path}: the copy just written does not match its digests")
        if journal is not None:
            await journal.mark_verified(store_index, record.path, record.digest)

    async def _multipart(self, src: Store, dst: Store, record: FileRecord, journal: DrainJournal | None,
                         store_index: int) -> None:
        key = (store_index, record.path, record.digest)
        upload, done = None, {}
        if journal is not None and key in journal.uploads:
            token, size = journal.uploads[key]
            if size == self.part_size:
                try:
                    done = dict(journal.parts.get(key, {}))
                    upload = await dst.resume_upload(record.path, part_size=size, token=token, parts=done)
                except (ShardNotFound, UnsupportedOperation):
                    upload, done = None, {}
            if upload is None:
                journal.forget_upload(*key)
        if upload is None:
            upload = await dst.open_upload(record.path, part_size=self.part_size)
            if journal is not None and upload.token is not None:
                await journal.mark_upload(*key, upload.token, self.part_size)
        count = -(-record.size // self.part_size)

        async def part(number: int) -> None:
            start = (number - 1) * self.part_size
            end = min(start + self.part_size, record.size)
            async with self._slots:
                data = await src.read_range(record.path, start, end, check=block_check(record, start, self.block_size))
                await upload.write_part(number, data)
                self.sent_bytes += len(data)
            if journal is not None and upload.token is not None:
                await journal.mark_part(*key, number, len(data))

        async with asyncio.TaskGroup() as tg:
            for number in range(1, count + 1):
                if number not in done:
                    tg.create_task(part(number))
        await upload.complete()
