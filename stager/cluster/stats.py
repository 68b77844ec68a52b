"""The cluster's counters on one node: bytes to and from peers, refusals, failures by kind, membership.

Bytes from the origin stay the engine's (``EngineStats``); these count what
crossed the peer links. :meth:`ClusterStats.as_dict` is what ``/metrics``
and ``stager status`` show.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

#: Why a peer request failed, as :class:`~stager.errors.PeerError` names it.
FAILURE_KINDS = ("down", "timeout", "refused", "missing", "corrupt", "protocol")


@dataclass
class ClusterStats:
    """Counted by the peer client (as an asker) and the peer server (as a holder)."""

    bytes_from_peers: int = 0
    blocks_from_peers: int = 0
    bytes_to_peers: int = 0
    requests_served: int = 0  # ranges sent whole
    requests_missing: int = 0  # 404: neither held nor fetched here
    requests_unauthorized: int = 0  # 401
    fetches_for_peers: int = 0  # ranges this node fetched (or waited for) on a peer's behalf
    failures: Counter = field(default_factory=Counter)  # peer request failures by kind

    def failed(self, kind: str) -> None:
        self.failures[kind] += 1

    def as_dict(self) -> dict[str, Any]:
        return {"bytes_from_peers": self.bytes_from_peers, "blocks_from_peers": self.blocks_from_peers,
                "bytes_to_peers": self.bytes_to_peers, "requests_served": self.requests_served,
                "requests_missing": self.requests_missing, "requests_unauthorized": self.requests_unauthorized,
                "fetches_for_peers": self.fetches_for_peers,
                "peer_failures": {kind: self.failures.get(kind, 0) for kind in FAILURE_KINDS}}
