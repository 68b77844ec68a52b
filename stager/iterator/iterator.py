"""``TokenIterator``: one consumer's stream of token samples, staged ahead and resumable.

Per epoch, the iterator:

1. deals this consumer its slice of the epoch's order (:mod:`.deal`,
   :mod:`.order`), continuing where its state says it stopped;
2. computes the shards of that slice in the order it will first touch them
   and registers them as the plan of a session (:mod:`.staging`), so the
   engine stages them ahead of the cursor, a few windows at a time; the first
   shards of the next epoch go at the end, so the epoch boundary is staged too;
3. walks the slice in blocks of positions mapped to (shard, token offset)
   with NumPy, then per sample only slices an already-open array. Entering a
   shuffle window, it tells the plan the past windows are done (``advance``:
   eviction can take them) and opens every shard of the window (``ready``:
   its verified cache file, fetched urgently if the prefetcher is behind).
   The first window of an epoch is read in block stripes (:mod:`.order`): a
   shard of it that is not complete yet is served from its verified blocks
   (:mod:`.block_shard`, the session's ``read_block``) while the engine stages
   it whole, and mapped as any other once its cache file is complete; so a
   cold start's first batch waits for about one block per shard of the
   window, not for the window.

Samples are views of memory-mapped cache files (or copies of the requested
``dtype``); with ``batch_size`` and ``batches=True`` they come as
``(batch, sample_len)`` arrays. Only verified bytes are ever read: blocks
checked against the manifest's block digests, and complete cache files,
each one's map hashed against the blob's digest before the
first sample is cut from it in this process (one that changed on the disk is
dropped and fetched again, see :mod:`stager.cache.reader`); an origin failure that outlasts the retry budget raises its error,
naming the shard, and no sample is made up.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import logging
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from ..cache import CacheTier
from ..cache.inflate import InflatedForm, Inflater
from ..cache.layout import CacheLayout
from ..cache.reader import BlockReads, VerifiedReads
from ..codecs import DECODED
from ..config import SourceConfig
from ..errors import CacheCorrupt, CacheError, CacheFull, ConfigError, CorruptData, OriginError, StagerError
from ..manifest import Manifest
from .ahead import MadeAhead
from .block_shard import AHEAD_BYTES, BlockShard, LinkBlocks, SamplesAhead, blocks_ahead
from .config import IteratorConfig
from .deal import Layout, Remainder, Slice
from .order import EpochOrder, OrderSpec
from .readers import FlatReader, NpyReader, reader_for
from .samples import SampleIndex
from .shard_plan import plan_shards
from .state import StreamState, from_loader_state
from .staging import StagingLink, describe, load_manifest_sync
from .stats import IteratorStats

log = logging.getLogger(__name__)

BLOCK = 8192  # positions mapped per NumPy call while reading
AHEAD_LIMIT = 1 << 16  # samples looked at for the "steps ready ahead" figure
FIRST_BLOCKS_WAIT = 30.0  # seconds the plan waits for the first window's first blocks, at most
RESERVATION_UNIT = 4096  # the cache charges each blob in whole units of at least this (CacheTier._unit)


class TokenIterator:
    """Fixed-length token samples of a staged dataset, in a deterministic, resumable order.

    Args:
        source: the dataset's URL or path (a :class:`SourceConfig` carries storage options too), or a
            whole :class:`~stager.iterator.config.IteratorConfig`.
        manifest: the dataset's manifest, if already loaded (every consumer must use the same one).
        storage_options, and every other keyword: the fields of
            :class:`~stager.iterator.config.IteratorConfig` (``seq_len``, ``seed``, ``batch_size``,
            ``rank``, ``cache_dir``, ``session``, ...), which says what each means.

    Raises:
        ConfigError: a bad argument, or a capacity smaller than two shuffle windows.
        ManifestError, OriginError: the manifest cannot be loaded.
    """

    def __init__(self, source: str | SourceConfig | IteratorConfig, *, manifest: Manifest | None = None,
                 **options: Any) -> None:
        if isinstance(source, IteratorConfig):
            config = dataclasses.replace(source, **options) if options else source
        else:
            config = IteratorConfig.of(source, **options)
        self.config = config
        self.source, self.cache_config, self.fetch_config = config.source, config.cache, config.fetch
        self.sample_spec, self.order_spec, self.layout = config.sample_spec, config.order_spec, config.layout
        self.batches, self.drop_last, self.dtype = config.batches, config.drop_last, config.dtype
        self.manifest = manifest if manifest is not None else load_manifest_sync(self.source, self.fetch_config)
        self.index = SampleIndex(self.manifest, self.sample_spec, self.source.url)
        shards = self.index.shards.tolist()
        shard_dtypes = {self.manifest.dtypes[i] for i in shards}
        self.out_dtype = self.dtype or np.result_type(*[np.dtype(d or "uint32") for d in shard_dtypes])
        # Decoded token columns may be held narrower than their dtype (stager.codecs.stored_dtype):
        # samples of those are widened back to what the manifest says they are.
        narrowed = any(self.manifest.stored_dtype(i) != self.manifest.dtypes[i] for i in shards
                       if self.manifest.codecs[i] in DECODED)
        self._sample_dtype = self.dtype if self.dtype is not None or not narrowed else self.out_dtype
        self._epoch = config.epoch
        self._remainder: Remainder | None = None  # None: the whole epoch, not started
        self._done = 0  # samples of this consumer's slice already yielded
        self._generation = 0
        self._orders: dict[int, EpochOrder] = {}
        self._unstriped_epoch: int | None = None  # a version 1 state's epoch, read in its unstriped order
        self._link: StagingLink | None = None
        self._finalizer: weakref.finalize | None = None
        self._stats = IteratorStats()
        self._blocks_via: LinkBlocks | None = None  # block reads for shards served from blocks, made on first use
        self._cursor: tuple[EpochOrder, Slice] | None = None
        self._ahead: MadeAhead[tuple[int, Any]] | None = None
        #: Applied to each batch as it is made (on the helper thread when made ahead): torch's
        #: wrapper sets ``torch.from_numpy`` here, so the tensor hand-over is off the loop's path too.
        self.wrap_batch: Callable[[np.ndarray], Any] | None = None
        self._last_log = time.monotonic()
        self._cache_layout = CacheLayout(self.cache_config.directory)
        self._blocks: BlockReads | None = None  # the cache reader's probe and drop, made on first use
        self._reads: VerifiedReads | None = None  # files checked by this process, made on first use
        self._cache: CacheTier | None = None  # opened to drop a blob found bad on disk, and by the inflater
        self._inflater: Inflater | None = None  # compressed shards' decompressed forms, made on first use
        self._check_capacity()

    def _check_capacity(self) -> None:
        """Refuse at once a cache too small for two shuffle windows (the one read, the one staged).

        The shards of the window being read are all mapped at once, and they are only safe from
        eviction while the engine's window ahead of the cursor (at most half the cache) covers them:
        an evicted file that is still mapped keeps its disk blocks, so a smaller cache would overrun
        its capacity, then its disk. The window is not shrunk to fit instead: the order must be the
        same on every rank and node, whatever their caches, so it depends on ``shuffle_window`` alone.
        The bound is the largest window any epoch can have (its biggest shards), so the answer
        does not change from one epoch to the next.

        Raises:
            ConfigError: the capacity is smaller than two of the largest possible windows.
        """
        per_window = self.order_spec.shards_per_window
        sizes = np.asarray(self.manifest.sizes, dtype=np.int64)[self.index.shards]
        # A compressed shard takes its decompressed form's room too (stager.cache.inflate).
        sizes = sizes + np.maximum(self.manifest.raw_sizes[self.index.shards], 0)
        if not len(sizes):
            return
        charged = np.sort(-(-sizes // RESERVATION_UNIT) * RESERVATION_UNIT)[::-1]  # as the cache counts them
        need = 2 * int(charged[:per_window].sum())
        try:
            capacity = self.cache_config.capacity_bytes()
        except OSError:
            return  # the cache directory says why when it is opened
        if capacity >= need:
            return
        fits = int(np.searchsorted(np.cumsum(charged), capacity // 2, side="right"))
        hint = f" or shuffle_window={fits}" if fits >= 1 and self.order_spec.shuffle else ""
        raise ConfigError(f"{self.source.url}: a cache capacity of {capacity:,} bytes is too small for "
                          f"shuffle_window={self.order_spec.shuffle_window}: two windows of its largest shards "
                          f"need {need:,} bytes; give capacity={need:,} or more{hint}")

    # -- the stream ------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Go to the start of ``epoch``; a no-op if it is the current epoch (progress is kept)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ConfigError(f"epoch must be a non-negative integer, got {epoch!r}")
        if epoch != self._epoch:
            self._stop_ahead()
            self._epoch, self._remainder, self._done = epoch, None, 0
            self._generation += 1

    def _order(self, epoch: int) -> EpochOrder:
        order = self._orders.get(epoch)
        if order is None:
            self._orders = {e: o for e, o in self._orders.items() if e >= epoch - 1}
            order = self._orders[epoch] = EpochOrder(self.index, self.order_spec, epoch,
                                                     striped=epoch != self._unstriped_epoch)
        return order

    def _slice(self, remainder: Remainder | None) -> Slice:
        rem = remainder if remainder is not None else Remainder.whole(self.index.total)
        if self.drop_last:
            rem = rem.truncated(self.layout.world * self.layout.batch)
        return Slice(rem, self.layout)

    def __len__(self) -> int:
        """Samples (or batches) this consumer yields in a whole epoch."""
        n = len(self._slice(None))
        return -(-n // self.layout.batch) if self.batches else n

    def __iter__(self) -> Iterator[np.ndarray]:
        """The rest of the current epoch; when it is exhausted, the iterator moves to the next epoch."""
        self._stop_ahead()
        self._generation += 1
        return self._stream(self._generation)

    def _stream(self, generation: int) -> Iterator[np.ndarray]:
        epoch = self._epoch
        order = self._order(epoch)
        piece = self._slice(self._remainder)
        self._cursor = (order, piece)
        link = self._staging()
        arrays: dict[int, Any] = {}  # the open shards of the window being read (BlockShard or array)
        plan = self._start_plan(link, order, piece, self._done, arrays)
        try:
            if self.batches:
                yield from self._counted(generation, self._batches(generation, link, order, piece, plan, self._done,
                                                                   arrays))
            else:
                yield from self._samples(generation, link, order, piece, plan, arrays)
        finally:
            if generation == self._generation:
                self._cursor = None
        if generation == self._generation and self._done >= len(piece):
            self._epoch, self._remainder, self._done = epoch + 1, None, 0

    def _counted(self, generation: int, batches: Iterator[tuple[int, Any]]) -> Iterator[Any]:
        """``batches`` (made ahead if asked), counted as they reach the consumer: its progress."""
        source: Iterator[tuple[int, Any]] = batches
        if self.config.make_ahead:
            source = self._ahead = MadeAhead(batches, self.config.make_ahead)
        try:
            for rows, batch in source:
                if generation != self._generation:
                    break  # superseded: _check() in the making raises for the stream still iterated
                self._done += rows
                yield batch
        finally:
            if isinstance(source, MadeAhead):
                source.close()
                if self._ahead is source:
                    self._ahead = None
        if generation != self._generation:
            self._check(generation)

    def _stop_ahead(self) -> None:
        """Stop the helper making batches for the current stream (before its position changes)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.close()

    def _positions(self, order: EpochOrder, piece: Slice, start: int) -> Iterator[tuple[int, list, list]]:
        """(window, shards, offsets): this consumer's samples from ``start`` on, in runs of one window."""
        for lo in range(start, len(piece), BLOCK):
            found = order.lookup(piece.positions(lo, lo + BLOCK))
            windows = found.windows
            edges = [0, *(np.flatnonzero(windows[1:] != windows[:-1]) + 1).tolist(), len(windows)]
            shards, offsets = found.shards.tolist(), found.offsets.tolist()
            for a, b in zip(edges, edges[1:]):
                yield int(windows[a]), shards[a:b], offsets[a:b]

    def _samples(self, generation: int, link: StagingLink, order: EpochOrder, piece: Slice,
                 plan: tuple[np.ndarray, np.ndarray], arrays: dict[int, Any]) -> Iterator[np.ndarray]:
        n = self.sample_spec.sample_len
        convert = self._sample_dtype
        window = -1
        for run_window, shards, offsets in self._positions(order, piece, self._done):
            self._check(generation)
            if run_window != window:
                window = self._enter_window(link, run_window, plan, arrays, order)
            for lo, hi in self._parts(arrays, window, order, shards, offsets):
                for shard, offset in zip(shards[lo:hi], offsets[lo:hi]):
                    self._done += 1
                    sample = arrays[shard][offset:offset + n]
                    yield sample if convert is None else sample.astype(convert)

    def _batches(self, generation: int, link: StagingLink, order: EpochOrder, piece: Slice,
                 plan: tuple[np.ndarray, np.ndarray], start: int,
                 arrays: dict[int, Any]) -> Iterator[tuple[int, Any]]:
        """(rows, batch) pairs: the batch as an array, or as ``wrap_batch`` makes it."""
        n, size = self.sample_spec.sample_len, self.layout.batch
        window = -1
        out = np.empty((size, n), dtype=self.out_dtype)
        row = 0
        wrap = self.wrap_batch
        for run_window, shards, offsets in self._positions(order, piece, start):
            self._check(generation)
            if run_window != window:
                window = self._enter_window(link, run_window, plan, arrays, order)
            for lo, hi in self._parts(arrays, window, order, shards, offsets):
                for shard, offset in zip(shards[lo:hi], offsets[lo:hi]):
                    out[row] = arrays[shard][offset:offset + n]
                    row += 1
                    if row == size:
                        yield size, out if wrap is None else wrap(out)  # counted when it reaches the consumer
                        out = np.empty((size, n), dtype=self.out_dtype)
                        row = 0
        if row:
            yield row, out[:row] if wrap is None else wrap(out[:row])

    def _parts(self, arrays: dict[int, Any], window: int, order: EpochOrder, shards: list[int],
               offsets: list[int]) -> Iterator[tuple[int, int]]:
        """A run of samples in parts ``[lo, hi)``: the whole run, unless shards of a window in its full shuffle
        are served from blocks; then parts of half the look-ahead, the blocks of the samples ahead of
        each asked for before it is read (:class:`SamplesAhead`)."""
        ahead = None if window == 0 and order.stripes is not None else self._samples_ahead(arrays)
        if ahead is None:
            yield 0, len(shards)
            return
        lo = 0
        while lo < len(shards):
            ahead.advance(shards, offsets, lo)
            hi = min(len(shards), ahead.next)
            yield lo, hi
            lo = hi

    def _check(self, generation: int) -> None:
        """Per block of positions: refuse a superseded stream, log the stats when due."""
        if generation != self._generation:
            raise StagerError("this token stream was superseded (iter() was called again, or the state or "
                              "epoch changed); iterate the newest one")
        self._maybe_log()

    def _maybe_log(self) -> None:
        if self.config.log_every and time.monotonic() - self._last_log >= self.config.log_every:
            self._last_log = time.monotonic()
            log.info("%s", describe(self.stats()))

    def _enter_window(self, link: StagingLink, window: int, plan: tuple[np.ndarray, np.ndarray],
                      arrays: dict[int, Any], order: EpochOrder) -> int:
        """Open every shard this consumer reads in ``window`` (waiting for any not staged yet).

        The window's samples come from its shards in random order, so any of them is needed
        within a few steps: waiting for them all here, once, keeps the plan out of the per-sample
        path and puts a cold start's wait before the first sample of a window, not spread over it.
        Positions only grow, so the shards of earlier windows are done: the plan moves past them.
        The first window of an epoch is read in block stripes: its shards not complete yet are
        served from their blocks instead (their first blocks asked for at once), the others opened.
        """
        shards, windows = plan
        start = int(np.searchsorted(windows, window, side="left"))
        stop = int(np.searchsorted(windows, window, side="right"))
        # Shards served from blocks are the plan's first window's, made with the plan (see _start_plan).
        kept = {s: a for s, a in arrays.items() if isinstance(a, BlockShard)} if window == windows[0] else {}
        for old in arrays.values():
            if isinstance(old, BlockShard) and old not in kept.values():
                old.close()
        arrays.clear()
        arrays.update(kept)
        link.advance(start)
        self._maybe_log()
        for position in range(start, stop):
            shard = int(shards[position])
            if shard not in arrays:
                arrays[shard] = self._open(link, shard, position)
        if stop < len(windows):  # this consumer's next window
            end = int(np.searchsorted(windows, windows[stop], side="right"))
            self._inflate_ahead(link, shards, range(stop, end))
        return window

    def _inflate_ahead(self, link: StagingLink, shards: np.ndarray, positions: range) -> None:
        """Start making the decompressed forms of the next window's compressed shards, each as soon as
        its blob is staged (:meth:`Inflater.prepare`): their first read then waits for none of that work."""
        m = self.manifest

        def compressed(shard: int, position: int) -> memoryview | bytes:
            complete = self._block_reads().complete(m.digest(shard))
            if complete is None:
                complete = link.ready(position)
                if complete.name != m.digest(shard):  # blob files are named by their digest
                    raise CacheError(f"plan position {position} is another blob now (a new plan)")
            return self._map_checked(complete, shard)

        wanted = [(self._inflated_form(shard), functools.partial(compressed, shard, position))
                  for shard, position in ((int(shards[p]), p) for p in positions) if m.codecs[shard] is not None]
        if wanted:
            self._cache_view()  # opened here, not by two threads at once
            self._inflater_of().prepare(wanted)

    # -- staging -----------------------------------------------------------------------------

    def _staging(self) -> StagingLink:
        """This process's link, made on first use (again in a forked child: never an inherited one)."""
        if self._link is None or not self._link.usable:
            self._link = StagingLink(self.source, self.manifest, self.cache_config, self.fetch_config,
                                     self.config.session, self.config.socket)
            # Collected: the link is closed without waiting (a finalizer may run inside any lock, on any
            # thread); at interpreter exit, StagingLink's own hook closes it and waits.
            self._finalizer = weakref.finalize(self, self._link.close_soon)
            self._finalizer.atexit = False
        return self._link

    def _start_plan(self, link: StagingLink, order: EpochOrder, piece: Slice, start: int,
                    arrays: dict[int, Any]) -> tuple[np.ndarray, np.ndarray]:
        """Register this consumer's plan; first put the shards of the window it starts in that are not
        staged yet in ``arrays`` as :class:`BlockShard` and read the blocks the first batch needs (of the
        striped first window: its first stripe; of a later window, resumed: its first samples' blocks):
        read before the plan starts, they take the first requests and the whole link, not places behind
        the prefetches (a request in flight holds its slot until its last byte: on a slow link, seconds).
        The prefetch starts a block's round trip later; the first batch needs those blocks anyway."""
        plan = plan_shards(order, self._order(order.epoch + 1), piece, start, self.manifest.sizes,
                           self.config.prefetch_bytes or self.fetch_config.window_bytes)
        if len(plan.windows):
            window = int(plan.windows[0])
            striped = window == 0 and order.stripes is not None
            served = []
            for shard in plan.shards[plan.windows == window].tolist():
                one = self._block_shard(link, shard, arrays, striped)
                if one is not None:
                    arrays[shard] = one
                    served.append(one)
            if served:
                first = self._first_blocks(order, piece, start, served) if striped \
                    else self._first_samples(order, piece, start, window, arrays)
                began = time.monotonic()
                concurrent.futures.wait(first, timeout=FIRST_BLOCKS_WAIT)  # an error shows where it is read
                self._waited(time.monotonic() - began)
        link.start_plan(plan.staged, plan.ahead, plan.name)
        self._stats.plans += 1
        return plan.shards, plan.windows

    def _first_blocks(self, order: EpochOrder, piece: Slice, start: int,
                      served: list[BlockShard]) -> list[concurrent.futures.Future]:
        """The striped first window: block 0 of every shard (the first steps need them all; past it, where the
        stream resumes), the next stripes warmed behind them, before the plan: blocks asked for once the plan's
        prefetches hold the requests wait for them to end (measured: the consumer then stalled 6 to 8% at
        half the link's rate). The reads of the first ones."""
        assert order.stripes is not None
        position = int(piece.positions(start, start + 1)[0]) if start < len(piece) else 0
        stripe = int(np.searchsorted(order.stripes.starts, position, side="right")) - 1  # where it starts
        first = [one.start(stripe) for one in served]
        for ahead in range(1, served[0].ahead + 1):  # the next stripes, in their order, queued behind them
            for one in served:
                one.warm(stripe + ahead)
        return first

    def _first_samples(self, order: EpochOrder, piece: Slice, start: int, window: int,
                       arrays: dict[int, Any]) -> list[concurrent.futures.Future]:
        """A window in its full shuffle (resumed in a later window): the blocks of the first batch's samples,
        and those of the samples after them warmed, before the plan (as for :meth:`_first_blocks`)."""
        ahead = self._samples_ahead(arrays)
        assert ahead is not None
        found = order.lookup(piece.positions(start, min(len(piece), start + ahead.look)))
        here = found.windows == window
        return ahead.start(found.shards[here].tolist(), found.offsets[here].tolist(), self.layout.batch)

    def _samples_ahead(self, arrays: dict[int, Any]) -> SamplesAhead | None:
        """Asks for the blocks of the samples read next, if some of ``arrays`` (a window in its full
        shuffle) are served from blocks; else None."""
        if not any(isinstance(one, BlockShard) and one.array is None for one in arrays.values()):
            return None
        base, itemsize = self.index.token_bytes
        # Two batches ahead at most: the blocks of one blob wanted at once are fetched in block order, so
        # more asked for ahead would hold the next batch's blocks behind later ones.
        batch = self.layout.batch
        look = max(batch, min(2 * batch, AHEAD_BYTES // self.manifest.block_size))
        return SamplesAhead(arrays, base, itemsize, self.sample_spec.sample_len, look)

    def _open(self, link: StagingLink, shard: int, position: int) -> np.ndarray:
        m = self.manifest
        name = m.paths[shard]
        reader = reader_for(name, token_column=self.config.token_column, layout=m.layouts[shard],
                            column=m.columns[shard], codec=m.codecs[shard])
        # Compressed: its decompressed form is what the reader opens.
        data = self._staged(link, shard, position) if m.codecs[shard] is None else self._inflated(link, shard, position)
        return reader.open(data, name, m.stored_dtype(shard), int(m.tokens[shard]))

    def _block_shard(self, link: StagingLink, shard: int, arrays: dict[int, Any],
                     striped: bool = True) -> BlockShard | None:
        """``shard`` served from its verified blocks until its cache file is complete (which then takes its
        place in ``arrays``); None if it is complete now, compressed, or of a format not served so."""
        m = self.manifest
        name, dtype, digest = m.paths[shard], m.dtypes[shard], m.digest(shard)
        if m.codecs[shard] is not None or dtype is None or self._block_reads().complete(digest) is not None:
            return None
        reader = reader_for(name, token_column=self.config.token_column, layout=m.layouts[shard],
                            column=m.columns[shard], codec=m.codecs[shard])
        if type(reader) not in (FlatReader, NpyReader):
            return None
        tokens = int(m.tokens[shard])
        where = f"{self.source.url}/{name}"

        def complete() -> np.ndarray | None:
            path = self._block_reads().complete(digest)
            if path is None:
                return None
            try:
                data = self._map_checked(path, shard)
            except (CacheCorrupt, FileNotFoundError):
                return None  # dropped as bad, or gone: its blocks still serve it
            array = reader.open(data, name, dtype, tokens)
            arrays[shard] = array  # the per-sample path slices the array itself from now on
            return array

        blocks = self._link_blocks(link)
        base, itemsize = self.index.token_bytes
        served = BlockShard(where, int(base[shard]), np.dtype(dtype).newbyteorder("<"), tokens, int(m.sizes[shard]),
                            m.block_size, functools.partial(blocks.fetch, shard), functools.partial(blocks.warm, shard),
                            functools.partial(blocks.wait, where=where), complete,
                            ahead=blocks_ahead(m.block_size, self.order_spec.shards_per_window,
                                               self.fetch_config.request_bytes) if striped else 0,
                            npy=isinstance(reader, NpyReader))
        self._stats.opened(False, 0.0)  # not staged when first needed; its block waits count as they come
        return served

    def _link_blocks(self, link: StagingLink) -> LinkBlocks:
        """Block reads through ``link`` (one per link: a forked child's new link gets its own)."""
        if self._blocks_via is None or self._blocks_via.link is not link:
            self._blocks_via = LinkBlocks(link, 4 * self.fetch_config.retry.deadline + 60.0, self._waited)
        return self._blocks_via

    def _waited(self, seconds: float) -> None:
        self._stats.wait_seconds += seconds

    def _staged(self, link: StagingLink, shard: int, position: int) -> memoryview | bytes:
        """The staged, verified blob of ``shard`` mapped: the complete cache file if there is one, else
        the one the engine makes ready (urgently); a copy found bad or gone is fetched once more."""
        m = self.manifest
        name = m.paths[shard]
        complete = self._block_reads().complete(m.digest(shard))
        if complete is not None:
            # Staged already (a complete file exists only after its verified rename): read it
            # without asking the engine, which would only answer with this path, a thread hop
            # later. Gone since (dropped by a repair), changed on disk (dropped here) or
            # unreadable: ask the engine as below, which fetches it again.
            try:
                data = self._map_checked(complete, shard)
            except OSError:
                pass
            else:
                self._stats.opened(True, 0.0)
                return data
        began = time.monotonic()
        path = self._ready(link, position, name)
        self._stats.opened(False, time.monotonic() - began)
        try:
            return self._map_checked(path, shard)
        except (CacheCorrupt, FileNotFoundError) as exc:
            # Bad on disk (dropped now) or gone since it was ready: fetched once more; a copy that is
            # bad again fails the read (a disk that rots what it is given cannot serve this shard).
            self._stats.refetches += 1
            try:
                return self._map_checked(self._ready(link, position, name), shard)
            except FileNotFoundError as again:
                raise CacheError(f"{self.source.url}/{name}: evicted from the cache as soon as it was "
                                 f"staged, twice; the cache is too small for its readers") from again
            except CacheCorrupt as again:
                raise CacheCorrupt(f"{self.source.url}/{name}: {again}; fetched again, and the copy on "
                                   "the cache disk is bad again") from exc

    def _inflated(self, link: StagingLink, shard: int, position: int) -> memoryview | bytes:
        """The decompressed form of compressed ``shard``, made once into the cache from its staged, verified
        blob (:mod:`stager.cache.inflate`), checked against the manifest's ``raw_digest``, mapped."""
        form = self._inflated_form(shard)
        staged = []  # whether the compressed blob had to be asked for (its decompressed form was not there)

        def compressed() -> memoryview | bytes:
            staged.append(True)
            return self._staged(link, shard, position)

        data = self._inflater_of().open(form, compressed)
        if not staged:
            self._stats.opened(True, 0.0)  # its decompressed form was in the cache: read without the engine
        return data

    def _inflated_form(self, shard: int) -> InflatedForm:
        m = self.manifest
        return InflatedForm(f"{self.source.url}/{m.paths[shard]}", m.codecs[shard], int(m.raw_sizes[shard]),
                            m.raw_digest(shard), m.block_size, m.columns[shard], m.dtypes[shard],
                            m.stored_dtype(shard))

    def _inflater_of(self) -> Inflater:
        if self._inflater is None:
            self._inflater = Inflater(self._cache_view, self._cache_layout.complete_path, self._verified_reads())
        return self._inflater

    def _map_checked(self, path: Path, shard: int) -> memoryview | bytes:
        """The complete cache file of ``shard`` mapped, its bytes checked against the blob digest the
        first time this iterator maps that file (:class:`~stager.cache.reader.VerifiedReads`).

        Raises:
            CacheCorrupt: the bytes do not match (the blob is dropped from the cache, to be fetched again).
            FileNotFoundError: the file is gone.
            CacheError: another I/O error.
        """
        m = self.manifest
        digest = m.digest(shard)
        try:
            data, _ = self._verified_reads().map_blob(path, digest, int(m.sizes[shard]))
        except CacheCorrupt as exc:
            self._stats.corrupt_blobs += 1
            if exc.identity is not None:
                self._block_reads().drop(digest, exc.identity, where=f" ({self.source.url}/{m.paths[shard]})")
            raise
        return data

    def _block_reads(self) -> BlockReads:
        if self._blocks is None:
            self._blocks = BlockReads(self._cache_layout.complete_path, self._cache_view)
        return self._blocks

    def _verified_reads(self) -> VerifiedReads:
        if self._reads is None:
            self._reads = VerifiedReads(self.cache_config.verify_reads)
        return self._reads

    def _cache_view(self) -> CacheTier:
        """The cache tier, opened on first need (a bad blob to drop): the iterator reads files itself."""
        if self._cache is None:
            self._cache = CacheTier(self.cache_config, reconcile=False)
        return self._cache

    def _ready(self, link: StagingLink, position: int, name: str) -> Path:
        """The complete cache file at plan ``position`` (fetched urgently if missing). A full cache is
        waited out below, by the engine (for up to the retry deadline, woken as room is made), not here.

        Raises:
            CacheFull: the cache stayed full (names the shard).
            OriginError, CacheError: it cannot be staged (names the shard).
        """
        try:
            return link.ready(position)
        except (OriginError, CacheError) as exc:
            if name in str(exc):
                raise
            hint = " (is it smaller than two shuffle windows?)" if type(exc) is CacheFull else ""
            raise type(exc)(f"{self.source.url}/{name}: cannot be staged{hint}: {exc}") from exc

    # -- state ---------------------------------------------------------------------------------

    def _state(self) -> StreamState:
        o = self.order_spec
        remainder = self._remainder if self._remainder is not None else Remainder.whole(self.index.total)
        return StreamState(self.index.fingerprint, o.seed, o.shuffle, o.shuffle_window, self._epoch, remainder,
                           self.layout.shape, {self.layout.worker: self._done},
                           striped=self._epoch != self._unstriped_epoch)

    def state_dict(self) -> dict[str, Any]:
        """Where this consumer's stream stands (plain data: save it with the checkpoint)."""
        return self._state().to_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``: this iterator's, a single-process loader's, or a whole
        ``StatefulDataLoader.state_dict()`` (with every worker's progress, needed when the
        world size, worker count or batch size changed).

        Raises:
            ConfigError: the state belongs to another dataset, seq_len or order, or lacks
                workers' progress for a re-deal.
        """
        parsed = from_loader_state(state)
        if parsed is None:
            raise ConfigError("the state holds no stager iterator state (was the loader ever iterated?)")
        self.load_state(parsed)

    def load_state(self, state: StreamState) -> None:
        o = self.order_spec
        state.check(self.index.fingerprint, o.seed, o.shuffle, o.shuffle_window)
        remainder, done = state.resume(self.layout)
        self._stop_ahead()
        self._epoch, self._remainder, self._done = state.epoch, remainder, done
        unstriped = None if state.striped else state.epoch
        if unstriped != self._unstriped_epoch:
            self._unstriped_epoch, self._orders = unstriped, {}
        self._generation += 1

    # -- stats and lifetime ---------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Time waited for data (shards and blocks), bytes staged, cache hits, retries, steps of data ready
        ahead, and ``blocks_served``: blocks read for shards served from their blocks (a cold first window)."""
        session = self._link.stats() if self._link is not None and self._link.usable else {}
        reads = self._reads.stats() if self._reads is not None else {}
        return {**self._stats.as_dict(session, self._ready_ahead()), "blocks_served": self._blocks_served(), **reads}

    def _blocks_served(self) -> int:
        return self._blocks_via.blocks_read if self._blocks_via is not None else 0

    def _ready_ahead(self) -> int:
        """Whole steps (batches) from the cursor whose shards are all verified in the cache."""
        if self._cursor is None:
            return 0
        order, piece = self._cursor
        positions = piece.positions(self._done, self._done + AHEAD_LIMIT)
        if not len(positions):
            return 0
        shards = order.lookup(positions).shards
        unique = np.unique(shards)
        m = self.manifest
        ready = np.array([self._cache_layout.complete_path(m.digest(int(s))).exists() for s in unique])
        missing = ~ready[np.searchsorted(unique, shards)]
        count = int(np.argmax(missing)) if missing.any() else len(shards)
        return count // self.layout.batch

    def close(self) -> None:
        """Stop staging for this iterator (the cache keeps what was staged). Idempotent."""
        self._stop_ahead()
        finalizer, self._finalizer = self._finalizer, None
        if finalizer is not None and finalizer.detach() is not None and self._link is not None:
            self._link.close()  # asked for: wait for the close (the finalizer's would not)
        self._link = None
        cache, self._cache = self._cache, None
        if cache is not None:
            cache.close()

    def __enter__(self) -> "TokenIterator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        # A copy stages through its own session, and checks files and opens the cache in its own process.
        state.update(_link=None, _finalizer=None, _cursor=None, _ahead=None, _reads=None, _cache=None, _blocks=None,
                     _inflater=None, _blocks_via=None)
        return state
