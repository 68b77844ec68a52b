"""One span's fetch: its blocks from the blob's sources in turn, through the gate, hedged at the origin.

A :class:`SpanFetch` asks the blob's sources (:mod:`.source`) in order for
the span's blocks still unverified, naming them again after each failure
(those tried left out: a peer found dead changes whom to ask, and the rest
comes from its successor before the origin); only a request to the origin takes a slot
of the engine's priority gate (a peer's answer may wait on a fetch that peer
makes for this node: two nodes whose slots all waited on each other would
stall), requests to peers being bounded by their own client. A source
before the last is not hedged; it is skipped, and the next one takes the
blocks it did not verify, when it raises :class:`~stager.errors.BlobSourceError`,
exceeds its own ``timeout``, or sends bytes that fail verification more than
its ``corrupt_budget`` allows (:class:`CorruptBudget`). The last source (the
origin) keeps its store's retry policy and errors; a request to it that
straggles is raced by a hedged request that keeps its bytes in memory, and
if the hedge wins, the first request is cancelled and its writes settled
before the hedge's bytes are written (:func:`~.span_writer.write_held`).
Every block from every source is verified by the :class:`~.span_writer.SpanWriter`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Awaitable, Callable

from ..errors import BlobSourceError, CorruptData
from ..hashing import block_digest, block_range
from ..store import RangeSink
from ..store.held import urgent_while
from .hedging import hedged
from .plan import URGENT
from .source import ORIGIN, reset_request_priority, set_request_priority
from .span_writer import SpanWriter, write_held

if TYPE_CHECKING:
    from ..cache import PartialBlob
    from .context import FetchContext
    from .dataset import BlobRef
    from .source import BlobSource
    from .spans import Span

log = logging.getLogger(__name__)


class SpanFetch:
    """Brings one span's blocks into the partial file; ``served(index)`` is told of each block recorded."""

    def __init__(self, ctx: "FetchContext", ref: "BlobRef", partial: "PartialBlob", span: "Span",
                 served: Callable[[int], None]) -> None:
        self._ctx = ctx
        self._ref = ref
        self._partial = partial
        self._span = span
        self._served = served

    async def run(self) -> None:
        ctx, span = self._ctx, self._span
        indexes = span.indexes
        try:
            sources = list(ctx.sources.for_blob(self._ref))
            tried: set[str] = set()
            while sources:
                source = sources[0]
                todo = [index for index in indexes if index not in self._partial.verified]
                if not todo:
                    break
                if len(sources) == 1:  # the origin: its retry policy, hedged, its errors stand
                    await self._from_origin(source, todo[0], todo[-1])
                    break
                try:
                    await self._from_source(source, todo[0], todo[-1])
                except (BlobSourceError, CorruptData, TimeoutError) as exc:
                    failures = ctx.stats.source_failures
                    failures[source.kind] = failures.get(source.kind, 0) + 1
                    log.info("%s: blocks %d-%d not from %s (the next source is tried): %s",
                             self._ref.path, todo[0], todo[-1], source.name, exc or type(exc).__name__)
                    # What failed may have changed whom to ask (a peer found dead leaves the ring, and the
                    # blob has a new parent or owner that holds or fetches the rest): the sources are named
                    # again, those tried left out, so the rest comes from a live holder before the origin.
                    tried.add(source.name)
                    sources = [s for s in ctx.sources.for_blob(self._ref) if s.name not in tried]
                    continue
                sources = sources[1:]  # it answered: the loop ends here unless it left blocks unverified
        except Exception as exc:  # cancellation is settled by the job (the blocks may be wanted again)
            for block in span.blocks:
                if not block.future.done():
                    block.future.set_exception(exc)
            raise

    def _range(self, first: int, last: int) -> tuple[int, int]:
        ref = self._ref
        return block_range(first, ref.size, ref.block_size)[0], block_range(last, ref.size, ref.block_size)[1]

    async def _from_source(self, source: "BlobSource", first: int, last: int) -> None:
        """Blocks ``first..last`` from a source that is not the last, within its timeout and budget."""
        start, end = self._range(first, last)
        sinks = CorruptBudget(self._writer(first, last, source.kind), source)
        span = self._span
        token = set_request_priority(lambda: span.priority)  # a peer orders its requests and marks urgent ones
        try:
            async with asyncio.timeout(source.timeout):
                await source.read_into(self._ref, start, end, sinks.open)
        finally:
            reset_request_priority(token)

    async def _from_origin(self, source: "BlobSource", first: int, last: int) -> None:
        """Blocks ``first..last`` from the last source (the origin), raced by a hedge if it straggles."""
        ctx, ref = self._ctx, self._ref
        config = ctx.config
        start, end = self._range(first, last)
        indexes = range(first, last + 1)

        def stream() -> Awaitable[None]:  # into the partial file as the bytes arrive, hashed on the way
            return source.read_into(ref, start, end, self._writer(first, last, source.kind))

        def in_memory() -> Awaitable[bytes]:  # the hedge: must not write where the first request writes
            return source.read(ref, start, end, check=lambda data: self._check(indexes, start, data))

        # Only origin requests take a slot of the gate: a peer's answer may wait on a fetch that peer
        # makes for this node, and two nodes whose slots all waited on each other would both stall
        # (requests to peers are bounded by their own client's connections instead).
        async with ctx.gate.slot(self._span.priority, owner=self._span, nbytes=end - start):
            gate = ctx.gate
            sharing = gate.holders  # origin requests in flight beside this one (itself included)

            def delay() -> float | None:  # asked again when it runs out: the neighbours may have multiplied
                return ctx.latency.hedge_delay(end - start, config.hedge_factor, config.hedge_min_delay,
                                               urgent=self._span.priority <= URGENT,
                                               sharing=max(sharing, gate.holders))

            began = time.monotonic()
            span = self._span
            with urgent_while(lambda: span.priority <= URGENT):  # a waiting consumer's bytes never wait for memory
                data, hedge_won = await hedged(stream, delay if config.hedge else None, self._count_hedge,
                                               make_hedge=in_memory)
            ctx.latency.record(time.monotonic() - began, end - start, sharing=(sharing + gate.holders) / 2)
            if hedge_won:  # the first request was cancelled and its writes settled: ours go over them
                ctx.stats.hedges_won += 1
                await write_held(ctx.disk, self._partial, ref, indexes, start, data, durable=config.durable,
                                 verified=self._verified(source.kind))

    def _count_hedge(self) -> None:
        self._ctx.stats.hedged_requests += 1

    def _check(self, indexes: range, start: int, data: bytes) -> None:
        """The hedge's bytes, block by block, against the manifest."""
        ref, view = self._ref, memoryview(data)
        for index in indexes:
            first, last = block_range(index, ref.size, ref.block_size)
            if block_digest(view[first - start:last - start]) != ref.blocks[index]:
                raise self._corrupt(index)

    def _corrupt(self, index: int) -> CorruptData:
        ref = self._ref
        self._ctx.stats.verify_failures += 1
        first, last = block_range(index, ref.size, ref.block_size)
        return CorruptData(f"{ref.dataset.name}/{ref.path}: block {index} (bytes {first}-{last}) "
                           "does not match the manifest digest")

    def _writer(self, first: int, last: int, kind: str) -> Callable[[], SpanWriter]:
        """Opens a sink per attempt that streams blocks ``first..last`` into the partial file."""
        verified = self._verified(kind)
        return lambda: SpanWriter(self._ctx.disk, self._partial, self._ref, first, last,
                                  durable=self._ctx.config.durable, corrupt=self._corrupt, verified=verified)

    def _verified(self, kind: str) -> Callable[[int, int], None]:
        """What is done once a block from a source of ``kind`` is recorded: its waiters may read it."""
        return _Counted(self._ctx, self._ref, kind, self._served)


class _Counted:
    """A recorded block: its waiters served, its bytes counted (in all, and by its source's kind)."""

    __slots__ = ("_ctx", "_ref", "_origin", "_served")

    def __init__(self, ctx: "FetchContext", ref: "BlobRef", kind: str, served: Callable[[int], None]) -> None:
        self._ctx = ctx
        self._ref = ref
        self._origin = kind == ORIGIN
        self._served = served

    def __call__(self, index: int, nbytes: int) -> None:
        self._served(index)
        stats = self._ctx.stats
        stats.bytes_fetched += nbytes
        stats.blocks_fetched += 1
        if self._origin:
            stats.bytes_from_origin += nbytes
        else:
            stats.bytes_from_peers += nbytes
        self._ctx.block_fetched(self._ref, nbytes)


class CorruptBudget:
    """Opens a source's sinks, counting the attempts whose bytes fail verification; past the source's
    ``corrupt_budget`` the attempt fails with :class:`BlobSourceError` instead (so the source stops)."""

    def __init__(self, open_sink: Callable[[], RangeSink], source: "BlobSource") -> None:
        self._open_sink = open_sink
        self._source = source
        self.failures = 0

    def open(self) -> RangeSink:
        return _BudgetedSink(self._open_sink(), self)

    def failed(self, exc: CorruptData) -> CorruptData | BlobSourceError:
        """The error an attempt that failed verification ends with."""
        self.failures += 1
        if self.failures > self._source.corrupt_budget:
            return BlobSourceError(f"{self._source.name}: {self.failures} attempts failed verification: {exc}")
        return exc


class _BudgetedSink(RangeSink):
    """A sink whose verification failures count against its source's budget."""

    def __init__(self, sink: RangeSink, budget: CorruptBudget) -> None:
        self._sink = sink
        self._budget = budget

    async def write(self, chunk: bytes) -> None:
        try:
            await self._sink.write(chunk)
        except CorruptData as exc:
            raise self._budget.failed(exc)

    async def close(self) -> None:
        try:
            await self._sink.close()
        except CorruptData as exc:
            raise self._budget.failed(exc)

    async def abort(self) -> None:
        await self._sink.abort()
