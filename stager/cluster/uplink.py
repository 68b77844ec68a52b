"""What this node sends to its peers, and in which order: a block's first copy before its second.

Each asker has a *lane* here: at most ``per_peer`` of its requests answered
at once, and their block writes one at a time (each a turn of the lane's
:class:`~.turns.Turns`, the ``--peer-bandwidth`` wait inside it, then the
write, which waits for the socket to drain). The lane is the asker's share
of the uplink, whichever limits it (the bandwidth cap, or TCP backpressure);
when a turn frees, the request to go next is the one whose next block has
*fewest copies outside this node* as far as it knows: the times it sent the
block to peers, plus one if it does not own the blob (it had the block from
its parent, which holds it too). Urgent requests go first whatever the
count; ties by the requests' arrival. Each response stays in block
order: a ranged body is sequential, so the choice is between the requests'
next blocks.

Why: an owner's children ask it for the same blobs. Sent in the order
asked, every lane carries the same blocks at about the same time and the
blocks further on live on the owner alone; an owner that dies then costs
the origin all of them again. With the count, the lanes spread over the
blocks not yet sent anywhere, so the first copy of each block leaves the
owner before most second copies, and what only the owner holds is what it
has not yet sent at all (``benchmarks/cluster_sim.py``,
``tests/cluster/test_first_copies.py``). The time to spread is the same:
the same bytes cross the same links.

A request that is not urgent can be passed over only so often
(``MAX_OVERTAKEN`` turns, ``MAX_WAIT`` seconds), so a request that became
urgent after it was sent, or one behind a stream of fresher blocks, still
goes well within its asker's deadlines (10 s without a byte).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from ..store.bandwidth import BandwidthLimiter
from .turns import Turns

#: Askers whose lanes are remembered; the least recently seen are forgotten past this.
MAX_ASKERS = 4096
#: Blobs whose copy counts are remembered; the least recently sent are forgotten past this.
MAX_BLOBS = 4096
#: Turns of its lane a request's next block lets others take before it goes next.
MAX_OVERTAKEN = 32
#: Seconds a request's next block waits for its lane before it goes next (half an asker's 10 s).
MAX_WAIT = 5.0


class Lane:
    """One asker's share of the uplink: its requests at once, its block writes one at a time, its cap."""

    __slots__ = ("requests", "turns", "limiter")

    def __init__(self, per_peer: int, bandwidth: int | None) -> None:
        self.requests = asyncio.Semaphore(per_peer)
        self.turns = Turns(1, max_overtaken=MAX_OVERTAKEN, max_wait=MAX_WAIT)
        self.limiter = BandwidthLimiter(bandwidth) if bandwidth else None


class Uplink:
    """The node's sends to peers (see the module doc).

    Args:
        per_peer: requests of one asker answered at once.
        bandwidth: bytes per second sent to one asker (None: no cap).
    """

    def __init__(self, per_peer: int = 8, bandwidth: int | None = None) -> None:
        self.per_peer = per_peer
        self.bandwidth = bandwidth
        self._lanes: OrderedDict[str, Lane] = OrderedDict()
        self._copies: OrderedDict[str, dict[int, int]] = OrderedDict()

    def lane(self, asker: str) -> Lane:
        """The asker's lane (made on its first request)."""
        lane = self._lanes.get(asker)
        if lane is None:
            lane = self._lanes[asker] = Lane(self.per_peer, self.bandwidth)
            while len(self._lanes) > MAX_ASKERS:
                self._lanes.popitem(last=False)
        self._lanes.move_to_end(asker)
        return lane

    def copies(self, digest: str, index: int) -> int:
        """How many times block ``index`` of ``digest`` has been sent (or is being sent) to peers."""
        counts = self._copies.get(digest)
        return 0 if counts is None else counts.get(index, 0)

    def uncount(self, digest: str, index: int) -> None:
        """A send counted by :meth:`send` failed after its turn ended: the block has one copy out fewer."""
        self._count(digest, index, -1)

    def _count(self, digest: str, index: int, delta: int) -> None:
        counts = self._copies.get(digest)
        if counts is None:
            counts = self._copies[digest] = {}
            while len(self._copies) > MAX_BLOBS:
                self._copies.popitem(last=False)
        self._copies.move_to_end(digest)
        counts[index] = max(0, counts.get(index, 0) + delta)

    @asynccontextmanager
    async def send(self, lane: Lane, digest: str, index: int, nbytes: int, *, urgent: bool, owned: bool,
                   arrival: int) -> AsyncIterator[None]:
        """Hold the lane's turn to write block ``index`` of ``digest`` (``nbytes``) for the body of the
        ``async with``: it comes when this block ranks first among the lane's (urgent, then fewest copies
        outside this node: those sent, plus one unless this node ``owned`` the blob, then the request's
        ``arrival``), and includes the bandwidth wait. A body that raises (the write failed) does not count
        as a copy sent."""
        upstream = 0 if owned else 1  # a block relayed: the node it came from holds it too

        def key() -> tuple[int, int, int]:
            return (0 if urgent else 1, self.copies(digest, index) + upstream, arrival)

        async with lane.turns.turn(key):
            self._count(digest, index, 1)  # counted at once: the other lanes see it while it is sent
            try:
                if lane.limiter is not None:
                    await lane.limiter.acquire(nbytes)
                yield
            except BaseException:
                self._count(digest, index, -1)
                raise
