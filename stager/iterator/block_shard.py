"""A shard of the window being read, served from its verified blocks until its cache file is complete.

A cold start's first window is read in block stripes (:mod:`.order`): its
first steps need the first blocks of each of its shards, long before any
shard is complete. :class:`BlockShard` stands in for the shard's token array
meanwhile: slicing it (``shard[a:b]``, what the iterator does per sample)
maps the tokens to the blocks that hold them and takes those from the
session's ``read_block``: bytes checked against the manifest's block digest,
fetched urgently, alone, if the cache lacks them (never an unverified byte).
A few blocks past each one asked for are asked for too, without waiting, so
the next stripe is on its way while this one is read. Whenever a block is
missing here, the shard's complete cache file is looked for first (the
engine stages the blob whole meanwhile): once it is there the iterator maps
it and checks it as for any shard, and the stand-in gives way to that array.

Only shards whose tokens are the file's last bytes, in the manifest's dtype,
are served so (flat ``.bin`` and Megatron files, ``.npy`` whose header is
checked against the manifest once block 0 is in); the others, and compressed
shards, are waited for whole. Waiting on a block blocks the calling thread on
a future (the GIL released, the event loop free), bounded by the session's
own retry deadline.
"""

from __future__ import annotations

import concurrent.futures
import io
from typing import Callable

import numpy as np
from numpy.lib import format as npy_format

from ..errors import CorruptData

AHEAD = 2  # blocks asked for past each block read, without waiting
KEEP = 4  # blocks held per shard (the stripe being read and the next)


class BlockShard:
    """Tokens of one shard out of its verified blocks; ``shard[a:b]`` is tokens ``a`` to ``b``.

    Args:
        name: the shard's path in the dataset (for errors).
        base: where its tokens start in the file (bytes).
        dtype: the tokens' dtype (little-endian).
        tokens: the token count the manifest records.
        size: the file's size.
        block_size: the manifest's block size.
        fetch: starts reading one verified block; its future.
        wait: the bytes of a block's future (blocking, raises what the read raised).
        complete: the shard's array if its complete cache file is there now, else None.
        npy: check the ``.npy`` header in the file's first bytes against ``dtype``, ``tokens`` and ``base``.
    """

    def __init__(self, name: str, base: int, dtype: np.dtype, tokens: int, size: int, block_size: int,
                 fetch: Callable[[int], concurrent.futures.Future], wait: Callable[[concurrent.futures.Future], bytes],
                 complete: Callable[[], np.ndarray | None], *, npy: bool = False) -> None:
        self.name = name
        self.base, self.dtype, self.tokens, self.size, self.block_size = base, dtype, tokens, size, block_size
        self.blocks = -(-size // block_size)
        self._fetch, self._wait, self._complete = fetch, wait, complete
        self._held: dict[int, bytes] = {}
        self._pending: dict[int, concurrent.futures.Future] = {}
        self._header_checked = not npy
        self.array: np.ndarray | None = None  # the mapped shard, once complete
        self.blocks_read = 0

    def start(self, block: int = 0) -> concurrent.futures.Future:
        """Ask for ``block`` now (the stripe the reader starts at needs it; a stream resumed mid-window
        starts past 0), and block 0 for a header to check, without waiting; the read of ``block``."""
        block = min(max(block, 0), self.blocks - 1)
        if not self._header_checked:
            self._ask(0, 1)
        self._ask(block, 1)
        return self._pending[block]

    def __getitem__(self, key: slice) -> np.ndarray:
        if self.array is None:
            tokens = self._from_blocks(key.start, key.stop)
            if tokens is not None:
                return tokens
        assert self.array is not None
        return self.array[key]

    def _from_blocks(self, a: int, b: int) -> np.ndarray | None:
        """Tokens ``[a, b)`` out of the blocks; None once the complete file took over."""
        if not self._header_checked and not self._check_header():
            return None
        itemsize = self.dtype.itemsize
        lo, hi = self.base + a * itemsize, self.base + b * itemsize
        first, last = lo // self.block_size, (hi - 1) // self.block_size
        if first == last:
            data = self._block(first)
            if data is None:
                return None
            return np.frombuffer(data, self.dtype, count=b - a, offset=lo - first * self.block_size)
        parts = []
        for index in range(first, last + 1):
            data = self._block(index)
            if data is None:
                return None
            start = index * self.block_size
            parts.append(memoryview(data)[max(lo - start, 0):min(hi - start, len(data))])
        return np.frombuffer(b"".join(parts), self.dtype)

    def _block(self, index: int) -> bytes | None:
        """Block ``index``'s verified bytes; None if the complete file is there (then it is the array)."""
        data = self._held.get(index)
        if data is not None:
            return data
        array = self._complete()
        if array is not None:
            self.array = array
            self._drop()
            return None
        future = self._pending.pop(index, None) or self._fetch(index)
        self._ask(index + 1, AHEAD)
        data = self._wait(future)
        self.blocks_read += 1
        if len(self._held) >= KEEP:  # the stripes go in order: the lowest blocks are done with
            for old in sorted(self._held)[:len(self._held) - KEEP + 1]:
                del self._held[old]
        self._held[index] = data
        return data

    def _ask(self, first: int, count: int) -> None:
        for index in range(first, min(first + count, self.blocks)):
            if index not in self._held and index not in self._pending:
                self._pending[index] = self._fetch(index)

    def _check_header(self) -> bool:
        """The ``.npy`` header, from the first blocks, agrees with the manifest (else CorruptData);
        False if the complete file took over meanwhile."""
        head = b""
        for index in range(0, (max(self.base, 1) - 1) // self.block_size + 1):
            data = self._block(index)
            if data is None:
                return False
            head += data
        stream = io.BytesIO(head[:self.base])
        try:
            version = npy_format.read_magic(stream)
            read = npy_format.read_array_header_1_0 if version == (1, 0) else npy_format.read_array_header_2_0
            shape, _fortran, found = read(stream)
        except (ValueError, OSError, EOFError, SyntaxError) as exc:
            raise CorruptData(f"{self.name}: not a readable .npy file: {exc}") from exc
        if stream.tell() != self.base or tuple(shape) != (self.tokens,) or found.name != self.dtype.name \
                or found.hasobject:
            raise CorruptData(f"{self.name}: its .npy header ({found} {tuple(shape)}, {stream.tell()} bytes) "
                              f"disagrees with the manifest ({self.dtype} ({self.tokens},), {self.base} bytes)")
        self.dtype = found  # its byte order too
        self._header_checked = True
        return True

    def _drop(self) -> None:
        """Forget the blocks held and asked for (the complete file serves from now on)."""
        self._held.clear()
        for future in self._pending.values():
            future.cancel()
        self._pending.clear()

    def close(self) -> None:
        self._drop()
