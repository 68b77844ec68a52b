"""Peers as places a blob's blocks come from (the engine's blob-source seam), and which to ask, in order.

:class:`ClusterSources` answers the engine's ``for_blob(ref)`` from the
current ring (``placement.py``): a node that does not own the blob asks its
parent in the blob's spreading tree (``relay``), then that one's parent, and
so on, the owner last (``fetch``: it fetches from the origin once for
everyone); the owner itself first asks the two nodes ranked after it, which
owned the blob before a member joined or are its children (``hold``: only
what they have, as much of the range as they hold from its start). The
origin is always the last source, so a read never fails because a peer did.
The owner's children fetch a blob staggered (:meth:`ClusterSources.first_block`):
the first copies of its blocks leave the owner before most second copies.

Every block a peer sends goes through the engine's sink, which verifies it
against the manifest. A peer that is down or refuses is marked down
(skipped until it answers a health check); one whose bytes fail
verification is skipped for ``bad_peer_seconds`` too. One slower than its
deadline is passed over for that request only: the health checks judge
whether it is alive, and ranking every blob without a peer that is merely
busy would send its whole share to the origin until the next check. All are
counted by kind. A peer that lacks the blob (404) is simply passed over.
A peer found down (by a failed request or the health checks) also ends every
request still waiting on it (``PeerClient.abandon``), so a request whose long
wait for a first byte was meant for a peer fetching from the origin does not
sit it out on a peer that stopped answering.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from ..engine import BlobRef
from ..engine.source import BlobSource, OriginSource, request_priority
from ..errors import PeerError
from ..store import Check, RangeSink
from ..store.base import run_check
from .identity import ClusterIdentities
from .membership import Membership
from .peer_client import PeerClient
from .placement import DEFAULT_FANOUT, PeerRing, first_block_in
from .request import PeerRequest
from .stats import ClusterStats

log = logging.getLogger(__name__)

#: Seconds a peer whose bytes failed verification is not asked again.
BAD_PEER_SECONDS = 300.0
#: Nodes ranked after the owner that the owner asks before the origin (the owners before a join).
SUCCESSORS = 2


class PeerSource(BlobSource):
    """One peer, asked in one mode (``request.py``)."""

    def __init__(self, peer: str, mode: str, cluster: "ClusterSources") -> None:
        self.peer = peer
        self.mode = mode
        self.name = f"peer {peer}"
        self._cluster = cluster

    def _ask(self, ref: BlobRef, start: int, end: int) -> PeerRequest:
        dataset, manifest = self._cluster.identities.of(ref.dataset)
        try:
            index = ref.dataset.manifest.index_of(ref.path)
        except KeyError:
            index = 0
        return PeerRequest(ref.digest, start, end, ref.size, ref.block_size, index, dataset, manifest, self.mode,
                           self._cluster.membership.me)

    async def read_into(self, ref: BlobRef, start: int, end: int, open_sink: Callable[[], RangeSink]) -> None:
        try:
            received = await self._cluster.client.read_into(self.peer, self._ask(ref, start, end), open_sink,
                                                            priority=request_priority())
        except PeerError as exc:
            self._cluster.failed(self.peer, exc)
            raise
        self._cluster.stats.bytes_from_peers += received
        self._cluster.stats.blocks_from_peers += len(range(start // ref.block_size,
                                                           -(-min(end, start + received) // ref.block_size)))

    async def read(self, ref: BlobRef, start: int, end: int, *, check: Check | None = None) -> bytes:
        try:
            data = await self._cluster.client.read(self.peer, self._ask(ref, start, end))
            await run_check(check, data)
        except PeerError as exc:
            self._cluster.failed(self.peer, exc)
            raise
        self._cluster.stats.bytes_from_peers += len(data)
        return data


class ClusterSources:
    """The engine's sources for each blob on a node of a cluster (see the module doc).

    Args:
        membership: this node's view of the members (down peers are left out of the ring).
        client: signed requests to peers.
        identities: the cluster identity of a blob's dataset, sent with each request.
        stats: bytes from peers and failures by kind.
        fanout: children per node in a blob's spreading tree.
    """

    def __init__(self, membership: Membership, client: PeerClient, identities: ClusterIdentities,
                 stats: ClusterStats, *, fanout: int = DEFAULT_FANOUT,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.membership = membership
        self.client = client
        self.identities = identities
        self.stats = stats
        self.fanout = fanout
        self._clock = clock
        self._origin = OriginSource()
        self._bad: dict[str, float] = {}
        self._ring: PeerRing | None = None
        self._ring_key: tuple[tuple[str, ...], str] | None = None
        membership.on_down(client.abandon)  # a request waiting on a peer found down moves on at once

    def ring(self) -> PeerRing:
        """The live members, this node included, as one ring (rebuilt only when they change)."""
        now = self._clock()
        self._bad = {p: until for p, until in self._bad.items() if until > now}
        live = tuple(m for m in self.membership.live() if m not in self._bad)
        key = (live, self.membership.me)
        if self._ring is None or key != self._ring_key:
            self._ring = PeerRing(live, self.membership.me, fanout=self.fanout)
            self._ring_key = key
        return self._ring

    def for_blob(self, ref: BlobRef) -> Sequence[BlobSource]:
        ring = self.ring()
        if len(ring.members) <= 1:
            return (self._origin,)
        me = self.membership.me
        if ring.is_owner(ref.digest):
            sources: list[BlobSource] = [PeerSource(p, "hold", self) for p in ring.successors(ref.digest, SUCCESSORS)]
        else:
            chain = [p for p in ring.upstream(ref.digest) if p != me]
            sources = [PeerSource(p, "relay", self) for p in chain[:-1]]
            if chain:
                sources.append(PeerSource(chain[-1], "fetch", self))
        return (*sources, self._origin)

    def first_block(self, ref: BlobRef, span_blocks: int) -> int:
        """Where this node's whole-blob fetch of ``ref`` starts, in each request of ``span_blocks`` blocks
        (``placement.first_block_in``).

        The owner reads in order. Its ``c`` children (``fanout``, fewer in a small cluster) start a ``1/c``
        of a request apart (the ``k``-th at ``k * span_blocks // c``): their requests to the owner run side
        by side, each in order, and the owner sends first the block with the fewest copies out
        (``uplink.py``), so the first copy of every block of a request has left the owner when a ``1/c`` of
        its sends are done. An owner that dies then leaves little
        that it alone held (its children hold the rest between them, and the new owner asks them first,
        ``hold`` taking what they hold of a range). Deeper nodes start as their ancestor among the owner's
        children does, so they take blocks in the order their parent receives them.
        """
        return first_block_in(self.ring().ranking(ref.digest), self.membership.me, self.fanout, span_blocks)

    def failed(self, peer: str, exc: PeerError) -> None:
        """Count a failed request and keep away from the peer as its failure deserves."""
        self.stats.failed(exc.kind)
        if exc.kind in ("down", "refused"):  # not "timeout": busy is not dead (see the module doc)
            self.membership.mark_down(peer, exc.kind)
        elif exc.kind in ("corrupt", "protocol"):
            if peer not in self._bad:
                log.warning("%s: skipped for %.0fs", exc, BAD_PEER_SECONDS)
            self._bad[peer] = self._clock() + BAD_PEER_SECONDS
