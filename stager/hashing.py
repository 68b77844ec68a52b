"""Digests: xxh3-128 for whole blobs, xxh3-64 for fixed-size blocks.

A blob's identity in the cache is the xxh3-128 of its bytes (32 hex digits).
Each block of ``block_size`` bytes (the last one shorter) also has an xxh3-64
digest, so a block can be verified on its own as it streams in, out of order
and in parallel with other blocks. :class:`StreamHasher` computes both from one
pass over the bytes, so indexing reads every byte once.

xxh3 runs at tens of GB/s here; hashing a 1 MiB block costs well under a
millisecond, which is why callers may hash on the event loop.
"""

from __future__ import annotations

import xxhash

DIGEST_HEX_LEN = 32  # xxh3-128 as lowercase hex


def block_count(size: int, block_size: int) -> int:
    """How many blocks a blob of ``size`` bytes has (0 for an empty blob)."""
    return -(-size // block_size)


def block_range(index: int, size: int, block_size: int) -> tuple[int, int]:
    """The ``[start, end)`` byte range of block ``index`` of a blob of ``size`` bytes."""
    start = index * block_size
    return start, min(start + block_size, size)


def block_digest(data: bytes | bytearray | memoryview) -> int:
    """The xxh3-64 digest of one block, as an unsigned 64-bit integer."""
    return xxhash.xxh3_64_intdigest(data)


def blob_digest(data: bytes | bytearray | memoryview) -> str:
    """The xxh3-128 digest of a whole blob held in memory, as 32 hex digits."""
    return xxhash.xxh3_128_hexdigest(data)


class StreamHasher:
    """Hashes a blob fed in order, in chunks of any size: whole digest and block digests."""

    __slots__ = ("_block_size", "_whole", "_block", "_in_block", "_blocks", "size")

    def __init__(self, block_size: int) -> None:
        self._block_size = block_size
        self._whole = xxhash.xxh3_128()
        self._block = xxhash.xxh3_64()
        self._in_block = 0
        self._blocks: list[int] = []
        self.size = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        self._whole.update(view)
        self.size += len(view)
        while len(view):
            take = min(len(view), self._block_size - self._in_block)
            if take == self._block_size:  # a whole aligned block: one call, no streaming state
                self._blocks.append(xxhash.xxh3_64_intdigest(view[:take]))
            else:
                self._block.update(view[:take])
                self._in_block += take
                if self._in_block == self._block_size:
                    self._blocks.append(self._block.intdigest())
                    self._block.reset()
                    self._in_block = 0
            view = view[take:]

    def finish(self) -> tuple[str, list[int]]:
        """Return ``(xxh3-128 hex digest, [xxh3-64 of each block])``."""
        blocks = list(self._blocks)
        if self._in_block:
            blocks.append(self._block.intdigest())
        return self._whole.hexdigest(), blocks
