"""Who owns a blob, and whom a node asks for it: rendezvous hashing and a spreading tree per blob.

Every node ranks the live members for a blob by the score
``xxh3_64(digest + 0 + member id)``, highest first (rendezvous, or highest
random weight, hashing). Rank 0 is the blob's *owner*: the one node that
fetches it from the origin for the whole cluster. A member that joins takes
exactly the blobs on which it now scores highest, and one that leaves hands
each of its blobs to the member ranked next for it; no other blob changes
owner (``tests/cluster/test_placement.py``).

The same ranking lays the members out as a ``fanout``-ary tree per blob:
the member at rank ``r`` asks the one at rank ``(r - 1) // fanout``, which
asks its own parent, and so on up to the owner. So each node sends one blob
to at most ``fanout`` others (plus fallbacks when a node is down), and a
blob reaches all N nodes in about ``log_fanout(N)`` hops instead of the
owner sending it N - 1 times. :meth:`PeerRing.upstream` lists the chain a
node tries, nearest first; the engine then falls back to the origin.
The owner's children take a blob in staggered orders (:func:`first_block_in`),
so that the owner sends the first copies of its blocks before most second copies.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import xxhash

#: Children per node in a blob's spreading tree.
DEFAULT_FANOUT = 4


def score(digest: str, member: str) -> int:
    """The rendezvous weight of ``member`` for the blob ``digest`` (the same on every node)."""
    return xxhash.xxh3_64_intdigest(f"{digest}\0{member}".encode())


def ranked(digest: str, members: Iterable[str]) -> list[str]:
    """``members`` by their weight for ``digest``, highest first (ties, which need equal hashes, by name)."""
    return sorted(set(members), key=lambda m: (-score(digest, m), m))


class PeerRing:
    """The live members as one node sees them, itself included (when it is a member).

    Args:
        members: every live member's id (``host:port`` as the membership spec names it).
        me: this node's id; a node that is not among ``members`` only asks, it never owns.
        fanout: children per node in each blob's spreading tree.
    """

    def __init__(self, members: Iterable[str], me: str, *, fanout: int = DEFAULT_FANOUT) -> None:
        if fanout < 1:
            raise ValueError(f"fanout must be >= 1, got {fanout}")
        self.members = frozenset(members)
        self.me = me
        self.fanout = fanout
        self._last: tuple[str, list[str]] = ("", [])  # a blob is looked at several times in a row

    def ranking(self, digest: str) -> list[str]:
        """Every member for ``digest``, the owner first."""
        if self._last[0] != digest:
            self._last = (digest, ranked(digest, self.members))
        return self._last[1]

    def owner(self, digest: str) -> str | None:
        """The member that fetches ``digest`` from the origin for everyone (None: no members)."""
        order = self.ranking(digest)
        return order[0] if order else None

    def is_owner(self, digest: str) -> bool:
        return self.owner(digest) == self.me

    def upstream(self, digest: str) -> list[str]:
        """The members this node asks for ``digest``, nearest first: its parent in the blob's tree, that
        one's parent, ..., the owner. Empty for the owner itself."""
        return upstream_in(self.ranking(digest), self.me, self.fanout)

    def successors(self, digest: str, count: int) -> list[str]:
        """The ``count`` members ranked after the owner: who owned ``digest`` before a member joined."""
        return [m for m in self.ranking(digest)[1:count + 1] if m != self.me]

    def children(self, digest: str) -> list[str]:
        """The members that ask this node for ``digest`` first (its children in the blob's tree)."""
        return children_in(self.ranking(digest), self.me, self.fanout)


def upstream_in(order: Sequence[str], me: str, fanout: int) -> list[str]:
    """In a blob's ranking ``order``: whom ``me`` asks, nearest first (parent, grandparent, ..., owner).

    A node outside ``order`` asks the owner alone; the owner asks nobody.
    """
    if me not in order:
        return list(order[:1])
    rank = order.index(me)
    chain: list[str] = []
    while rank > 0:
        rank = (rank - 1) // fanout
        chain.append(order[rank])
    return chain


def children_in(order: Sequence[str], me: str, fanout: int) -> list[str]:
    """In a blob's ranking ``order``: the members whose parent is ``me``."""
    if me not in order:
        return []
    first = order.index(me) * fanout + 1
    return list(order[first:first + fanout])


def first_block_in(order: Sequence[str], me: str, fanout: int, span_blocks: int) -> int:
    """In a blob's ranking ``order``: where ``me`` starts its whole-blob fetch, in each request of
    ``span_blocks`` blocks. 0 for the owner (and a node outside ``order``). The owner's ``k``-th child
    (rank ``k + 1``) of ``c`` (``fanout``, or fewer in a cluster of at most ``fanout`` members) starts
    ``k * span_blocks // c`` blocks in, so each child's first run is as long as its siblings': the owner's children's requests, side
    by side and each in order, carry different blocks at any moment, so few blocks are on the owner alone
    (what only it holds is what its death costs the origin). Every deeper node starts where its ancestor
    among the owner's children does: it takes the blocks in the order its parent receives them, pipelined
    (whatever its parent holds, the owner holds too)."""
    if me not in order:
        return 0
    rank = order.index(me)
    while rank > fanout:
        rank = (rank - 1) // fanout
    children = min(fanout, len(order) - 1)  # fewer than fanout in a small cluster: they share the request
    return (rank - 1) * span_blocks // children if rank else 0


def share(members: Sequence[str], digests: Sequence[str]) -> dict[str, int]:
    """How many of ``digests`` each member owns (for tests, benchmarks and ``stager status``)."""
    counts = {m: 0 for m in members}
    for digest in digests:
        counts[ranked(digest, members)[0]] += 1
    return counts
