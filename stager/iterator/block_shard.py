"""A shard of the window being read, served from its verified blocks until its cache file is complete.

A cold start's first window is read in block stripes (:mod:`.order`): its
first steps need the first blocks of each of its shards, long before any
shard is complete. :class:`BlockShard` stands in for the shard's token array
meanwhile: slicing it (``shard[a:b]``, what the iterator does per sample)
maps the tokens to the blocks that hold them and takes those from the
session's ``read_block``: bytes checked against the manifest's block digest,
fetched urgently, alone, if the cache lacks them (never an unverified byte).
The blocks of the next stripes are *warmed* too (read, urgently, into the
cache, their bytes not kept): up to ``AHEAD_BYTES`` of the window ahead of
the stripe being read. Being urgent they take the requests as the prefetches
end, so the window arrives in the order it is read, whatever the order the
plan's prefetcher would fetch its shards in (one after the other); with less
warmed ahead, a consumer reading at half the link's rate stalled 6 to 8%
after its first batch, waiting for request slots held by prefetches. Whenever a block is
missing here, the shard's complete cache file is looked for first (the
engine stages the blob whole meanwhile): once it is there the iterator maps
it and checks it as for any shard, and the stand-in gives way to that array.

A window read in its full shuffle (a stream resumed in a later window) is
served from blocks too: any sample may be in any block there, so
:class:`SamplesAhead` asks for the blocks of the samples read next instead.

Only shards whose tokens are the file's last bytes, in the manifest's dtype,
are served so (flat ``.bin`` and Megatron files, ``.npy`` whose header is
checked against the manifest once block 0 is in); the others, and compressed
shards, are waited for whole. Waiting on a block blocks the calling thread on
a future (the GIL released, the event loop free), bounded by the session's
own retry deadline.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import logging
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np
from numpy.lib import format as npy_format

from ..errors import CacheError, CorruptData, OriginError, StagerError

if TYPE_CHECKING:
    from .staging import StagingLink

log = logging.getLogger(__name__)

AHEAD_BYTES = 64 << 20  # the window's blocks warmed ahead of the stripe being read, in all
AHEAD_MIN = 2  # blocks of each shard warmed ahead of the one being read, at least
KEEP = 4  # blocks held per shard (the stripe being read and the next)


def blocks_ahead(block_size: int, shards: int, request_bytes: int) -> int:
    """Blocks of each of a window's ``shards`` to warm ahead of the one being read: ``AHEAD_BYTES`` of
    the window, so that the consumer's reads, urgent, hold the requests the prefetch would take; at most
    two requests' worth of each shard (consecutive blocks wanted at once go in one request, and urgent
    requests are served in turn: more would hold the other shards' first blocks behind one shard's)."""
    per_request = max(1, request_bytes // max(1, block_size))
    return max(AHEAD_MIN, min(AHEAD_BYTES // max(1, block_size * shards), 2 * per_request))


class BlockShard:
    """Tokens of one shard out of its verified blocks; ``shard[a:b]`` is tokens ``a`` to ``b``.

    Args:
        name: names the shard in errors (its URL).
        base: where its tokens start in the file (bytes).
        dtype: the tokens' dtype (little-endian).
        tokens: the token count the manifest records.
        size: the file's size.
        block_size: the manifest's block size.
        fetch: starts reading one verified block; its future.
        warm: starts reading one block into the cache, its bytes dropped (not waited for).
        wait: the bytes of a block's future (blocking, raises what the read raised).
        complete: the shard's array if its complete cache file is there now, else None.
        ahead: blocks warmed ahead of each one read.
        npy: check the ``.npy`` header in the file's first bytes against ``dtype``, ``tokens`` and ``base``.
    """

    def __init__(self, name: str, base: int, dtype: np.dtype, tokens: int, size: int, block_size: int,
                 fetch: Callable[[int], concurrent.futures.Future], warm: Callable[[int], None],
                 wait: Callable[[concurrent.futures.Future], bytes], complete: Callable[[], np.ndarray | None], *,
                 ahead: int = AHEAD_MIN, npy: bool = False) -> None:
        self.name = name
        self.base, self.dtype, self.tokens, self.size, self.block_size = base, dtype, tokens, size, block_size
        self.blocks = -(-size // block_size)
        self._fetch, self._warm, self._wait, self._complete = fetch, warm, wait, complete
        self.ahead = ahead
        self._held: dict[int, bytes] = {}
        self._pending: dict[int, concurrent.futures.Future] = {}  # reads whose bytes are wanted
        self._warmed: set[int] = set()  # blocks warmed (or being warmed) into the cache
        self._header_checked = not npy
        self.array: np.ndarray | None = None  # the mapped shard, once complete

    def start(self, block: int = 0) -> concurrent.futures.Future:
        """Ask for ``block`` now (the stripe the reader starts at needs it; a stream resumed mid-window
        starts past 0), and block 0 for a header to check, without waiting; the read of ``block``."""
        block = min(max(block, 0), self.blocks - 1)
        for index in {0, block} if not self._header_checked else {block}:
            if index not in self._pending:
                self._pending[index] = self._fetch(index)
        return self._pending[block]

    def warm(self, index: int) -> None:
        """Warm block ``index`` into the cache unless it was (or is being) read already; not waited for."""
        if 0 <= index < self.blocks and index not in self._warmed and index not in self._held \
                and index not in self._pending and self.array is None:
            self._warmed.add(index)
            self._warm(index)

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
        future = self._pending.pop(index, None) or self._fetch(index)  # a warmed block: read back from the cache
        for ahead in range(index + 1, index + 1 + self.ahead):
            self.warm(ahead)
        data = self._wait(future)
        if len(self._held) >= KEEP:  # the stripes go in order: the lowest blocks are done with
            for old in sorted(self._held)[:len(self._held) - KEEP + 1]:
                del self._held[old]
        self._held[index] = data
        return data

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
        self._warmed.clear()

    def close(self) -> None:
        self._drop()


class LinkBlocks:
    """Verified blocks of a dataset's shards through a staging link's session, for synchronous readers:
    a read started on the link's loop (a future, nothing waited for), and the wait for it (the calling
    thread blocks on the future: the GIL is released and the loop goes on).

    Args:
        link: the iterator's staging link.
        deadline: seconds a wait gives up after (the session's own retry deadline comes first).
        waited: told the seconds of each wait.
    """

    def __init__(self, link: "StagingLink", deadline: float, waited: Callable[[float], None]) -> None:
        self.link, self.deadline, self._waited = link, deadline, waited
        self.blocks_read = 0

    def fetch(self, shard: int, block: int) -> concurrent.futures.Future:
        """Start reading block ``block`` of manifest shard ``shard`` (urgently, if the cache lacks it)."""
        link = self.link
        future: concurrent.futures.Future = concurrent.futures.Future()

        async def read() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                assert link.session is not None and link.dataset is not None
                data = await link.session.read_block(link.dataset, shard, block)
            except BaseException as exc:  # noqa: BLE001 - handed to the waiter, whatever it is
                future.set_exception(exc)
                if isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt, SystemExit)):
                    raise
            else:
                future.set_result(data)

        link.loop.submit(read())  # a loop that stopped closes it: the wait below notices
        return future

    def warm(self, shard: int, block: int) -> None:
        """Start reading block ``block`` of ``shard`` into the cache, its bytes dropped (nothing waits: a
        failure is logged, and the read that wants the bytes later meets it again)."""
        link = self.link

        async def warm() -> None:
            assert link.session is not None and link.dataset is not None
            try:
                await link.session.read_block(link.dataset, shard, block)
            except (StagerError, OSError) as exc:
                log.debug("warming block %d of shard %d failed: %s", block, shard, exc)

        link.loop.submit(warm())

    def wait(self, future: concurrent.futures.Future, where: str) -> bytes:
        """The bytes of a read :meth:`fetch` started; ``where`` names the shard in errors.

        Raises:
            OriginError, CacheError: the read failed (naming the shard), the link stopped, or
                ``deadline`` passed.
        """
        began = time.monotonic()
        try:
            while True:  # bounded: by the session's retry deadline, the loop's end, or ``deadline``
                try:
                    data = future.result(timeout=1.0)
                    break
                except concurrent.futures.TimeoutError:
                    if not self.link.usable or time.monotonic() - began > self.deadline:
                        raise CacheError(f"{where}: a block was not read within {self.deadline:.0f} s "
                                         "(the staging loop stopped or hung)") from None
                except (concurrent.futures.CancelledError, asyncio.CancelledError):
                    raise CacheError(f"{where}: a block read was cancelled (the iterator is closing)") from None
        except (OriginError, CacheError) as exc:
            if where.rsplit("/", 1)[-1] in str(exc):
                raise
            raise type(exc)(f"{where}: cannot be read: {exc}") from exc
        finally:
            self._waited(time.monotonic() - began)
        self.blocks_read += 1
        return data


class SamplesAhead:
    """The blocks of the samples read next, asked for in the order they will be read, where a window is
    served from blocks in its full shuffle (a stream resumed in a later window, or in an unstriped one).

    There, any sample may be in any block of any of the window's shards, so a :class:`BlockShard`'s own
    warming (the next blocks of the one read) does not help: each sample would wait for its own block,
    one at a time. Instead the blocks of the next ``look`` samples are asked for: the first batch's
    together (:meth:`start`, their bytes kept for it), then, whenever the reader is half-way through
    what was asked for, the next ones warmed into the cache. They are urgent, so they go ahead of the
    plan's prefetches, in the order they will be read.

    Args:
        arrays: the window's open shards (a :class:`BlockShard` for those served from blocks).
        base: per manifest shard, where its tokens start in the file (bytes).
        itemsize: per manifest shard, bytes per token.
        sample_len: tokens per sample.
        look: samples asked for ahead of the one being read.
    """

    __slots__ = ("arrays", "base", "itemsize", "sample_len", "look", "_until", "next")

    def __init__(self, arrays: dict[int, Any], base: np.ndarray, itemsize: np.ndarray, sample_len: int,
                 look: int) -> None:
        self.arrays, self.base, self.itemsize, self.sample_len = arrays, base, itemsize, sample_len
        self.look = max(1, look)
        self._until = 0  # samples of the run asked for so far
        self.next = 0  # the reader calls advance() again at this sample of the run

    def start(self, shards: list[int], offsets: list[int], count: int) -> list[concurrent.futures.Future]:
        """Ask for the blocks of the run's first ``count`` samples now, their bytes kept; the reads."""
        reads: dict[tuple[int, int], concurrent.futures.Future] = {}
        for shard, block in self._blocks(shards, offsets, 0, min(count, len(shards))):
            if (shard, block) not in reads:
                reads[shard, block] = self.arrays[shard].start(block)
        self._until = min(count, len(shards))
        self.advance(shards, offsets, 0)  # and the samples after them, warmed
        return list(reads.values())

    def advance(self, shards: list[int], offsets: list[int], at: int) -> None:
        """The reader is at sample ``at`` of the run: warm the blocks up to ``look`` samples ahead of it."""
        stop = min(len(shards), at + self.look)
        for shard, block in self._blocks(shards, offsets, self._until, stop):
            self.arrays[shard].warm(block)
        self._until = max(self._until, stop)
        self.next = at + max(1, self.look // 2)

    def _blocks(self, shards: list[int], offsets: list[int], lo: int, hi: int) -> Iterator[tuple[int, int]]:
        """(shard, block) of each block samples ``lo`` to ``hi`` of the run need, in their order, for
        shards served from blocks."""
        for i in range(lo, hi):
            shard = shards[i]
            one = self.arrays.get(shard)
            if not isinstance(one, BlockShard) or one.array is not None:
                continue
            size = int(self.itemsize[shard])
            first = int(self.base[shard]) + offsets[i] * size
            last = first + self.sample_len * size - 1
            for block in range(first // one.block_size, min(last // one.block_size, one.blocks - 1) + 1):
                yield shard, block
