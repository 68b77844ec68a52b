"""Test helpers: deterministic blobs, and a checker of every invariant the cache promises."""

from __future__ import annotations

import ctypes
import mmap
import os
import random
import stat
from dataclasses import dataclass
from pathlib import Path

import xxhash

from stager.cache import BlobState, CacheTier
from stager.cache.blob_index import unpack_block_digests
from stager.cache.layout import CacheLayout
from stager.config import CacheConfig


@dataclass(frozen=True)
class Blob:
    data: bytes
    block_size: int

    @property
    def digest(self) -> str:
        return xxhash.xxh3_128_hexdigest(self.data)

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def blocks(self) -> list[int]:
        bs = self.block_size
        return [xxhash.xxh3_64_intdigest(self.data[i:i + bs]) for i in range(0, len(self.data), bs)]

    def block(self, index: int) -> bytes:
        return self.data[index * self.block_size:(index + 1) * self.block_size]

    @property
    def block_count(self) -> int:
        return -(-len(self.data) // self.block_size)


def make_blob(size: int, block_size: int = 16 * 1024, seed: int = 0) -> Blob:
    return Blob(random.Random(seed).randbytes(size), block_size)


def corpus(count: int, *, min_size: int, max_size: int, block_size: int, seed: int = 0) -> list[Blob]:
    rng = random.Random(seed)
    return [make_blob(rng.randint(min_size, max_size), block_size, seed * 1000 + i) for i in range(count)]


def config(directory: Path, capacity: int) -> CacheConfig:
    return CacheConfig(directory=directory, capacity=capacity)


def fill(tier: CacheTier, blob: Blob, *, durable: bool = True, **begin_kwargs) -> Path:
    """Begin, write every missing block and commit one blob."""
    with tier.begin(blob.digest, blob.size, blob.block_size, blob.blocks, **begin_kwargs) as partial:
        for index in partial.missing_blocks():
            partial.write_block(index, blob.block(index), durable=durable)
        return partial.commit()


def _hash_block(fd: int, index: int, size: int, block_size: int) -> int:
    start = index * block_size
    length = min(block_size, size - start)
    return xxhash.xxh3_64_intdigest(os.pread(fd, length, start))


def check_invariants(tier: CacheTier) -> dict[str, int]:
    """Assert everything the cache promises about its index and its files; returns counts."""
    layout = CacheLayout(tier.directory)
    index = tier._index
    rows, after = [], ""
    while page := index.page(after, 500):
        rows.extend(page)
        after = page[-1].digest
    counts = {"complete": 0, "partial": 0, "verified_blocks": 0}
    expected_partial_files, expected_blob_files = set(), set()
    for row in rows:
        digests = unpack_block_digests(row.block_digests)
        assert len(digests) == -(-row.size // row.block_size)
        if row.state is BlobState.COMPLETE:
            path = layout.complete_path(row.digest)
            st = os.stat(path)
            assert st.st_size == row.size, f"{row.digest}: complete file has the wrong size"
            assert not st.st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH), f"{row.digest}: writable"
            assert row.charged == min(st.st_blocks * 512, tier.charge(row.size))  # no file system books
            fd = os.open(path, os.O_RDONLY)
            try:
                data = os.pread(fd, row.size, 0)
                assert xxhash.xxh3_128_hexdigest(data) == row.digest, f"{row.digest}: complete file is wrong"
                for i, expected in enumerate(digests):
                    assert _hash_block(fd, i, row.size, row.block_size) == expected
            finally:
                os.close(fd)
            assert not index.verified(row.digest), "block records left for a complete blob"
            expected_blob_files.add(row.digest)
            counts["complete"] += 1
        else:
            path = layout.partial_path(row.digest, row.gen)
            st = os.stat(path)
            assert st.st_size == row.size, f"{row.digest}: partial file has the wrong size"
            fd = os.open(path, os.O_RDONLY)
            try:
                for i in index.verified(row.digest):
                    assert 0 <= i < len(digests)
                    assert _hash_block(fd, i, row.size, row.block_size) == digests[i], \
                        f"{row.digest}: block {i} is recorded verified but does not hash right"
                    counts["verified_blocks"] += 1
            finally:
                os.close(fd)
            expected_partial_files.add(path.name)
            counts["partial"] += 1
    assert set(os.listdir(layout.partial_dir)) == expected_partial_files, "orphan partial files"
    blob_files = {name for shard in os.listdir(layout.blobs_dir) for name in os.listdir(layout.blobs_dir / shard)}
    assert blob_files == expected_blob_files, "orphan complete files"
    usage = tier.usage()
    assert usage.used == sum(r.charged for r in rows), "running capacity total drifted"
    assert (usage.complete, usage.partial) == (counts["complete"], counts["partial"])
    return counts


_libc = ctypes.CDLL(None, use_errno=True)


def resident_pages(path) -> tuple[int, int]:
    """(pages of ``path`` in the page cache, pages in all), asked of the kernel with mincore(2)."""
    size = os.path.getsize(path)
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_COPY) as mapped:
        pages = -(-size // mmap.PAGESIZE)
        vec = (ctypes.c_ubyte * pages)()
        address = ctypes.addressof(ctypes.c_char.from_buffer(mapped))
        if _libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(size), vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore failed")
        return sum(v & 1 for v in vec), pages
