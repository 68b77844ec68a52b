"""The cluster cache: the node daemons of one cluster share their caches, so a shard crosses the origin once.

How it works. Every daemon started with ``--peers`` learns the members from
what the cluster already has (``membership.py``: a list, Slurm's node list,
a headless Service's DNS records, a file), with no coordinator. For each blob
the members are ranked by rendezvous hashing of its digest (``placement.py``);
rank 0, the owner, fetches it from the origin once for everyone, and the
ranking doubles as a tree along which it spreads: each node asks its parent,
so no node sends a blob more than a few times and a blob reaches N nodes in
about log N hops. The engine sees peers as blob sources before the origin
(``peer_source.py``) and verifies every block against the manifest, so a
peer that is down, slow or lying costs time, never a wrong byte or a failed
read. Peers talk over aiohttp (``peer_server.py``, ``peer_client.py``),
every request proved with an HMAC of the cluster secret (``auth.py``); what a
node sends or fetches for a peer follows the daemon's rule between
credential sets (``holdings.py``, ``identity.py``). ``node.py`` assembles it
all for the daemon.
"""

from .config import PeerConfig
from .node import ClusterNode

__all__ = ["ClusterNode", "PeerConfig"]
