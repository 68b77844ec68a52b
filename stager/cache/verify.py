"""Scrubbing: re-hash blocks on disk against the digests the index recorded for them.

Complete blobs are read sequentially in large reads (at least 16 MiB, a whole
number of blocks) into one reused buffer and every block is hashed with
xxh3-64; a partial blob's verified blocks are read one by one. The scan pages
through the index in digest order, so it holds no lock and no long read
transaction while it reads. The tier decides what to do with a bad blob (drop
it so the engine fetches it again).
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable, Iterator
from pathlib import Path

import xxhash

from ..hashing import block_range
from .blob_index import BlobIndex, BlobRow, unpack_block_digests
from .fileio import os_error, readinto_exact
from .layout import CacheLayout
from .records import BlobCheck, BlobState

READ_CHUNK = 16 * 1024 * 1024
_PAGE = 256


def _sampled(index: BlobIndex, sample: float | None, seed: int | None) -> Iterator[BlobRow]:
    """Every row, or a ``sample`` share of them: at least one when there are any and ``sample > 0``
    (a sample of a small cache that picked nothing would report it verified without reading a byte)."""
    rng = random.Random(seed)
    after = ""
    picked = False
    while rows := index.page(after, _PAGE):
        after = rows[-1].digest
        for row in rows:
            if sample is None or rng.random() < sample:
                picked = True
                yield row
    if not picked and sample and (first := index.page("", 1)):
        yield first[0]


def scrub(index: BlobIndex, layout: CacheLayout, sample: float | None = None,
          seed: int | None = None) -> Iterator[tuple[BlobRow, BlobCheck]]:
    """Check every blob (or a ``sample`` share of them); yields each row checked with its result.

    Blobs that vanish while being checked (evicted, committed) are skipped.

    Raises:
        CacheError: a read error other than a vanished file.
    """
    for row in _sampled(index, sample, seed):
        if row.state is BlobState.COMPLETE:
            path, indexes = layout.complete_path(row.digest), None
            blocks = row.block_count
        else:
            path, indexes = layout.partial_path(row.digest, row.gen), index.verified(row.digest)
            blocks = len(indexes)
            if not indexes:
                continue
        try:
            bad, nread = check_blocks(path, row.size, row.block_size, row.block_digests, indexes)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise os_error(exc, f"verifying blob {row.digest}") from exc
        yield row, BlobCheck(blocks, nread, bad)


def check_blocks(path: Path, size: int, block_size: int, block_digests: bytes,
                 indexes: Iterable[int] | None = None) -> tuple[list[int], int]:
    """Re-hash blocks of the file at ``path``; ``(bad block indexes, bytes read)``.

    ``indexes`` None means every block, read sequentially in large chunks.

    Raises:
        FileNotFoundError: the file is gone (evicted meanwhile).
        OSError: another read error.
    """
    expected = unpack_block_digests(block_digests)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if os.fstat(fd).st_size != size:
            return list(range(len(expected))), 0
        if indexes is None:
            return _check_sequential(fd, size, block_size, expected)
        bad, read = [], 0
        buf = bytearray(block_size)
        for index in sorted(indexes):
            start, end = block_range(index, size, block_size)
            view = memoryview(buf)[: end - start]
            readinto_exact(fd, view, start)
            read += end - start
            if xxhash.xxh3_64_intdigest(view) != expected[index]:
                bad.append(index)
        return bad, read
    finally:
        os.close(fd)


def _check_sequential(fd: int, size: int, block_size: int, expected) -> tuple[list[int], int]:
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
    per_read = max(1, READ_CHUNK // block_size)
    buf = bytearray(per_read * block_size)
    bad: list[int] = []
    index = 0
    while index < len(expected):
        start = index * block_size
        end = min(size, start + per_read * block_size)
        view = memoryview(buf)[: end - start]
        readinto_exact(fd, view, start)
        for offset in range(0, end - start, block_size):
            block = view[offset: offset + block_size]
            if xxhash.xxh3_64_intdigest(block) != expected[index]:
                bad.append(index)
            index += 1
    return bad, size
