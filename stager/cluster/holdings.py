"""What this node may give a peer that asks for a range of a blob, and the blocks themselves.

The rule (the cluster's form of the daemon's rule between credential sets):

1. Blocks this node holds verified are served to any peer that proves the
   cluster secret, as the daemon shares blobs in its cache by digest between
   consumers: their bytes are the manifest's, and the asker verifies them again.
2. Anything else means fetching, and a node fetches from the origin for a
   peer only through a dataset version it holds itself under the identity
   and manifest fingerprint the peer sent (``identity.py``): the same URL,
   the same storage options, the same manifest, so the fetch uses exactly
   the credentials the peer's own consumer proved. And only when it is its
   turn: in ``fetch`` mode when this node owns the blob in its own view (or
   fetches it anyway), in ``relay`` mode only when it is fetching the blob
   for itself (it is in one of its plans' windows), never in ``hold`` mode.
   A request from the node this one would itself ask first for the blob is
   answered with what is held only, so two nodes whose views disagree never
   wait on each other.

A peer refused here is told 404 and asks the next node, or the origin with
its own credentials.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterable

from ..cache import BlobState, CacheTier
from ..cache.fileio import pread_exact
from ..engine import URGENT, BlobRef, Engine
from .identity import ClusterIdentities
from .placement import PeerRing
from .request import PeerRequest
from .stats import ClusterStats

log = logging.getLogger(__name__)

#: Gate priority of blocks fetched for a peer: with the nearest prefetch, behind consumers blocked here.
PEER_PRIORITY = 0.0
#: Seconds a request naming a dataset version not held here waits for it to be opened (the nodes of one
#: job start their consumers at about the same time, and the first blobs would all go to the origin).
VERSION_WAIT = 10.0
#: Seconds after such a wait ran out during which that version is not waited for again.
ABSENT_SECONDS = 60.0


def read_held_block(cache: CacheTier, digest: str, start: int, end: int, index: int) -> bytes | None:
    """Bytes ``[start, end)`` (block ``index``) of a blob this node holds verified; None if it does not.

    A blob being committed is renamed into ``blobs/`` before the index says it is complete, so a partial
    blob that is gone when looked for is looked for there too (a file there is always complete).
    """
    if cache.state(digest) is not BlobState.COMPLETE:
        handle = cache.open_partial(digest)
        if handle is not None:
            try:
                return handle.read_block(index)
            except Exception:  # noqa: BLE001 - not verified, or dropped meanwhile: perhaps just committed
                pass
            finally:
                handle.close()
    try:
        fd = os.open(cache.complete_path(digest), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None  # not complete, or evicted meanwhile
    try:
        return pread_exact(fd, end - start, start)
    finally:
        os.close(fd)


class Holdings:
    """This node's blobs as peers see them.

    Args:
        engine: fetches (single flight, shared with this node's own plans) and protects what plans want.
        versions: the dataset versions this node holds now, as ``(dataset, fingerprint)`` pairs.
        identities: the cluster identities of those datasets.
        ring: this node's current view of the members.
        stats: counts fetches made for peers.
    """

    def __init__(self, engine: Engine, versions: Callable[[], Iterable[tuple[object, str]]],
                 identities: ClusterIdentities, ring: Callable[[], PeerRing], stats: ClusterStats) -> None:
        self.engine = engine
        self._versions = versions
        self._identities = identities
        self._ring = ring
        self.stats = stats
        self._warming: dict[str, asyncio.Task] = {}
        self._opened = asyncio.Event()  # replaced by a fresh one each time a version is held
        self._absent: dict[tuple[str, str], float] = {}

    def version_held(self) -> None:
        """Call when the node holds a new dataset version: requests waiting for it look again."""
        self._opened.set()
        self._opened = asyncio.Event()

    async def open(self, request: PeerRequest) -> tuple[PeerRequest, AsyncIterator[bytes]] | None:
        """The range as it will be answered and its blocks one by one (a block is read or fetched when the
        previous one is sent), or None if this node neither holds them nor may fetch them for the asker.

        In ``hold`` mode the answer is the longest run of the range, from its start, held verified here
        (shorter than asked when only its start is held): an owner asking a node that holds part of a blob
        takes that part, and asks the next one for the rest.
        """
        cache, digest = self.engine.cache, request.digest
        record = await self.engine.in_disk_thread(cache.record, digest)
        fits = record is not None and record.size == request.size and record.block_size == request.block_size
        held = fits and all(b in record.verified for b in request.blocks)
        if fits and not held and request.mode == "hold":
            run = 0
            for b in request.blocks:
                if b not in record.verified:
                    break
                run += 1
            if run == 0:
                return None
            request = dataclasses.replace(request, end=min(request.size, (request.blocks[0] + run)
                                                           * request.block_size))
            return request, self._held_blocks(request)
        ref = self._ref(request)
        if ref is None and not held and request.mode != "hold":
            ref = await self._wait_for_version(request)
        if held and (ref is None or request.mode == "hold"):
            return request, self._held_blocks(request)  # read as held; never a fetch, even if evicted meanwhile
        if ref is None or not (held or self._may_fetch(request)):
            return None
        if not held:
            self.stats.fetches_for_peers += 1
            self._warm(ref)
        return request, self._engine_blocks(ref, request)

    def owns(self, digest: str) -> bool:
        """This node owns ``digest`` in its view (it fetches it from the origin: its blocks may be the only
        copies in the cluster)."""
        return self._ring().is_owner(digest)

    def _may_fetch(self, request: PeerRequest) -> bool:
        if request.mode == "hold":
            return False
        ring, digest = self._ring(), request.digest
        upstream = ring.upstream(digest)
        if upstream and upstream[0] == request.asker:
            return False  # it is the node this one asks first: it waits on us, or we on it
        wanted_here = digest in self.engine.protected_digests()
        return wanted_here or (request.mode == "fetch" and ring.is_owner(digest))

    def _ref(self, request: PeerRequest) -> BlobRef | None:
        """The blob in a dataset version held here under the asker's identity and manifest, if any."""
        if not request.dataset or not request.manifest:
            return None
        for dataset, fingerprint in self._versions():
            if self._identities.of(dataset, fingerprint) != (request.dataset, request.manifest):
                continue
            m = dataset.manifest
            if request.index < len(m) and m.digest(request.index) == request.digest \
                    and int(m.sizes[request.index]) == request.size and m.block_size == request.block_size:
                return dataset.ref(request.index)
        return None

    async def _wait_for_version(self, request: PeerRequest) -> BlobRef | None:
        key = (request.dataset, request.manifest)
        now = asyncio.get_running_loop().time()
        if not all(key) or self._absent.get(key, 0.0) > now:
            return None
        deadline = now + VERSION_WAIT
        while (left := deadline - asyncio.get_running_loop().time()) > 0:  # bounded; woken by each new version
            opened = self._opened
            try:
                async with asyncio.timeout(left):
                    await opened.wait()
            except TimeoutError:
                break
            if (ref := self._ref(request)) is not None:
                return ref
        self._absent = {k: t for k, t in self._absent.items() if t > now}
        self._absent[key] = asyncio.get_running_loop().time() + ABSENT_SECONDS
        return None

    def _warm(self, ref: BlobRef) -> None:
        """Fetch the whole blob once (in ranged requests of many blocks), whoever asks for which block."""
        if ref.digest in self._warming:
            return
        task = asyncio.create_task(self.engine.ensure(ref, priority=PEER_PRIORITY), name=f"peer fetch {ref.path}")
        self._warming[ref.digest] = task

        def done(t: asyncio.Task) -> None:
            self._warming.pop(ref.digest, None)
            if not t.cancelled() and t.exception() is not None:
                log.info("fetching %s for a peer failed: %s", ref.path, t.exception())

        task.add_done_callback(done)

    async def _engine_blocks(self, ref: BlobRef, request: PeerRequest) -> AsyncIterator[bytes]:
        priority = URGENT if request.urgent else PEER_PRIORITY  # a consumer of the asker waits: as one of ours
        for index in request.blocks:
            yield await self.engine.read_block(ref, index, priority=priority)

    async def _held_blocks(self, request: PeerRequest) -> AsyncIterator[bytes]:
        for index in request.blocks:
            start = index * request.block_size
            end = min(start + request.block_size, request.size)
            data = await self.engine.in_disk_thread(read_held_block, self.engine.cache, request.digest, start,
                                                    end, index)
            if data is None:
                raise LookupError(f"blob {request.digest}: block {index} left the cache while being sent")
            yield data

    async def close(self) -> None:
        tasks = list(self._warming.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
