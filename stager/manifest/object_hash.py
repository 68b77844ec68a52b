"""Hashing one object of an origin so that the digests recorded are its true bytes.

A manifest built from bytes corrupted in transit makes the corruption the
truth: every later read of the right bytes fails verification against it, on
every run. So the bytes of an object count only once something vouches for
them:

- **the origin**, where it says what the bytes are: the MD5 it lists with the
  object (S3's ETag of a single-part object, GCS's ``md5Hash``, Azure's
  ``Content-MD5``; see :attr:`ObjectInfo.md5`). The first pass computes the
  MD5 of what it reads along with the xxhash digests; if they match, that
  one read is the truth.
- **a second read**, where the origin vouches for nothing (multipart ETags,
  plain HTTP, ``memory://``) or the first pass failed its MD5: every block is
  read again until enough reads agree (see :class:`_Agreement`): two with
  the same xxh3-64 for a block of 64 KiB or more, more for a smaller one (a
  byte flipped the same way twice is likelier in a few bytes), and once reads
  of a block have disagreed, one value must lead every other by two reads. A
  read of a small block covers the 64 KiB before its end where the object
  has them, so a corrupted byte rarely lands in the block. Past
  :func:`read_limit` reads the block fails as :class:`~stager.errors.OriginChanged`. Where the origin gave an MD5, the
  agreed bytes must then match it too; when they do not, a HEAD tells an
  object that changed while it was read (hashed again from the start, at most
  :data:`CHANGED_RETRIES` times) from one whose ETag is no MD5 of its bytes
  (SSE-KMS and SSE-C objects, some S3-compatible stores): the bytes two reads
  agreed on are the truth, as for an origin that vouches for nothing, and a
  warning names the object (its bytes may also be corrupt at rest: then they
  are what the origin holds, and the manifest says so).
- **the local disk** (``file://``) is trusted as the disk is: one read.

The hash work of a block (xxh3 and MD5) runs in a thread: MD5 runs at about
600 MB/s, so hashing on the loop would hold it ~1.7 ms per MiB.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
from dataclasses import dataclass, replace
from typing import Any, Callable

import xxhash

from ..errors import ManifestError, OriginChanged
from ..hashing import StreamHasher, block_count, block_range

log = logging.getLogger(__name__)

#: Whole-object passes at most when the object keeps changing while it is hashed.
CHANGED_RETRIES = 3
#: Bytes of the first block kept for format sniffing (the .npy header).
HEAD_BYTES = 4096
#: Bytes a read for agreement covers at least, ending at its block's end (where the object has them).
AGREEMENT_SPAN = 64 * 1024
#: Agreeing reads asked of a block whose reads cover a byte or two: as many as the odds allow.
MOST_READS_NEEDED = 8


@dataclass(frozen=True, slots=True)
class HashedObject:
    """The digests of an object's vouched-for bytes, and the bytes a format needs to describe it."""

    size: int
    digest: str  # xxh3-128, hex
    blocks: tuple[int, ...]  # xxh3-64 of each block
    head: bytes  # the first HEAD_BYTES bytes
    probe: Any = None  # what ``new_probe`` made for the pass whose bytes were taken, fed every block


def trusted(store) -> bool:
    """Whether one read of ``store`` is the truth: a local file system."""
    return store.url.startswith("file://")


def reads_expected(store, obj) -> int:
    """How many times each byte of ``obj`` is read when nothing goes wrong (for progress totals)."""
    return 1 if trusted(store) or obj.md5 is not None else 2


async def hash_object(
    store,
    obj,
    block_size: int,
    *,
    gate: asyncio.Semaphore,
    read_ahead: int = 4,
    new_probe: Callable[[], Any] | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> HashedObject:
    """Hash ``obj`` (an :class:`~stager.store.ObjectInfo` of ``store``) by the rules of the module docstring.

    Args:
        store: the :class:`~stager.store.Store` holding it.
        obj: its listing: path, size and the MD5 the origin vouches for, if any.
        block_size: the manifest's block size.
        gate: bounds block reads in flight (shared by every object hashed at once).
        read_ahead: blocks read ahead within the object.
        new_probe: makes an object with ``feed(bytes)`` (a layout's check of the file, see
            :mod:`.layouts`), or None; a new one for each pass, fed that pass's blocks in
            order, so the one returned has seen exactly the bytes the digests describe.
        on_bytes: called with each block's size as it is read.

    Raises:
        OriginChanged: a block's reads kept disagreeing, or the object kept changing.
        ManifestError: the object changed size while it was read.
        OriginError: reading failed beyond the retry budget.
    """
    where = f"{store.url.rstrip('/')}/{obj.path}"
    for _ in range(CHANGED_RETRIES):
        with_md5 = obj.md5 is not None and not trusted(store)
        first = await _read_pass(store, obj, block_size, gate, read_ahead, new_probe, with_md5, None, on_bytes)
        if trusted(store) or (with_md5 and first.md5 == obj.md5):
            return first.hashed
        second = await _read_pass(store, obj, block_size, gate, read_ahead, new_probe, with_md5,
                                  first.hashed.blocks, on_bytes)
        if not with_md5 or second.md5 == obj.md5:
            return second.hashed
        now = await store.info(obj.path)
        if now.size != obj.size:
            raise ManifestError(f"{where}: size changed while indexing ({obj.size} -> {now.size})")
        if now.md5 is None or now.md5 == obj.md5:
            log.warning("%s: every block read twice alike, but their MD5 is not the ETag %s the origin lists; "
                        "recorded the bytes the two reads agree on (an ETag that is no MD5, as with SSE-KMS, "
                        "or bytes corrupt at rest)", where, obj.md5)
            return second.hashed
        obj = replace(obj, md5=now.md5, mtime=now.mtime)  # rewritten while we read it: start again
    raise OriginChanged(f"{where}: changed {CHANGED_RETRIES} times while it was being indexed")


@dataclass(frozen=True, slots=True)
class _Pass:
    hashed: HashedObject
    md5: str | None


def reads_needed(span: int) -> int:
    """Agreeing reads that make a block's bytes the truth when each read covers ``span`` bytes.

    A corrupter that flips one byte the same way gives two reads of ``span`` bytes the same wrong
    bytes one time in ``span``; ``k`` reads that agree are then wrong by chance one time in
    ``span ** (k - 1)`` at most. Enough reads to bring that under 2**-16: two from 64 KiB up,
    three from 256 bytes, seven for 7 bytes, :data:`MOST_READS_NEEDED` for one byte.
    """
    if span >= 1 << 16:
        return 2
    if span < 2:
        return MOST_READS_NEEDED
    return min(MOST_READS_NEEDED, 1 + math.ceil(16 / math.log2(span)))


def read_limit(needed: int) -> int:
    """Reads of one block past which its reads count as disagreeing for good.

    Generous, since only a block whose reads disagreed gets here: through an origin corrupting
    three bodies in ten, a block with a budget of 10 reads ran out about once in a thousand blocks; with
    18 it is about once in three million (fewer than three clean reads in 18), and an object that
    really keeps changing costs a few more reads before it fails.
    """
    return 2 * needed + 14


class _Agreement:
    """When a block's reads count as its true bytes: ``needed`` that agree, leading every other value by two.

    Two corrupted reads can agree: a corrupter that flips one byte the same way hits the same byte
    of a 7-byte tail block once in seven (one such flip, twice, was taken for the truth and copied).
    So a small block needs more agreeing reads (:func:`reads_needed`), and once reads of a block
    have disagreed, corruption is on the way, so one value must be read twice more often than any
    other before it counts; transient corruption is rarer than clean reads, so the clean value gets
    there first, for about one more read of a block that was corrupted.
    """

    __slots__ = ("counts", "needed")

    def __init__(self, first: int, needed: int = 2) -> None:
        self.counts = {first: 1}
        self.needed = needed

    def take(self, digest: int) -> bool:
        """Count one more read; True if its bytes are now the block's truth."""
        counts = self.counts
        counts[digest] = counts.get(digest, 0) + 1
        mine = counts[digest]
        others = max((n for d, n in counts.items() if d != digest), default=0)
        return mine >= self.needed and (others == 0 or mine - others >= 2)


async def _read_pass(store, obj, block_size: int, gate: asyncio.Semaphore, read_ahead: int,
                     new_probe: Callable[[], Any] | None,
                     with_md5: bool, agree_with: tuple[int, ...] | None,
                     on_bytes: Callable[[int], None] | None) -> _Pass:
    """One pass over ``obj``'s blocks in order, a few read ahead; with ``agree_with`` (an earlier
    pass's block digests), each block is read until enough reads agree (:class:`_Agreement`)."""
    hasher = StreamHasher(block_size)
    md5 = hashlib.md5(usedforsecurity=False) if with_md5 else None
    probe = new_probe() if new_probe is not None else None
    nblocks = block_count(obj.size, block_size)

    async def read_block(index: int) -> bytes:
        start, end = block_range(index, obj.size, block_size)
        if agree_with is None:
            async with gate:
                return await store.read_range(obj.path, start, end)
        return await agreed_block(index, start, end)

    async def agreed_block(index: int, start: int, end: int) -> bytes:
        first = max(0, min(start, end - AGREEMENT_SPAN))  # a small block's read covers more
        agreement = _Agreement(agree_with[index], reads_needed(end - first))
        limit = read_limit(agreement.needed)
        for _ in range(limit):
            async with gate:
                data = await store.read_range(obj.path, first, end)
            block = data[start - first:]
            if agreement.take(xxhash.xxh3_64_intdigest(block)):  # well under a millisecond
                return block
        raise OriginChanged(f"{store.url.rstrip('/')}/{obj.path}: block {index}: {limit} reads gave "
                            f"different bytes ({len(agreement.counts)} different values)")

    def feed(data: bytes) -> None:
        hasher.update(data)
        if md5 is not None:
            md5.update(data)
        if probe is not None:
            probe.feed(data)

    pending: list[asyncio.Future[bytes]] = []
    head = b""
    try:
        for index in range(nblocks):
            while len(pending) < read_ahead and index + len(pending) < nblocks:
                pending.append(asyncio.ensure_future(read_block(index + len(pending))))
            data = await pending.pop(0)
            if md5 is not None:
                await asyncio.to_thread(feed, data)
            else:
                feed(data)
            if index == 0:
                head = data[:HEAD_BYTES]
            if on_bytes:
                on_bytes(len(data))
    finally:
        for task in pending:
            task.cancel()
        if pending:  # collect them, so no error of a read ahead goes unretrieved
            await asyncio.gather(*pending, return_exceptions=True)
    if hasher.size != obj.size:
        raise ManifestError(f"{store.url.rstrip('/')}/{obj.path}: size changed while indexing "
                            f"({obj.size} -> {hasher.size})")
    digest, blocks = hasher.finish()
    return _Pass(HashedObject(obj.size, digest, tuple(blocks), head, probe), md5.hexdigest() if md5 else None)
