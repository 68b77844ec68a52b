"""An owner sends each block's first copy before any second copy, and its children ask it for all of its
blobs at once: when it dies, they hold between them most of what it owned (real daemons)."""

from __future__ import annotations

import asyncio
import os
import signal

from stager.cluster.placement import ranked
from stager.testing.s3server import free_port
from tests.cluster.support import Cluster

HOSTS = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]
#: What the owner sends each peer, bytes per second: its uplink, not the origin, is what holds the blocks back.
PEER_BPS = 4_000_000
#: The owner's blobs: its first child asks it for more requests (two a blob) than its 8 connections, the
#: others (whose staggered start puts a blob in one request) for fewer.
OWNED = 7


def _addresses_with_an_owner_of(digests: list[str], count: int) -> list[tuple[str, int]]:
    """Ports for ``HOSTS`` under which the member owning most of ``digests`` owns ``count`` (ownership follows
    the addresses, and free ports are drawn at random)."""
    for _ in range(200):
        picked = [(h, free_port(h)) for h in HOSTS]
        names = [f"{h}:{p}" for h, p in picked]
        owners = [ranked(d, names)[0] for d in digests]
        if max(owners.count(n) for n in names) == count:
            return picked
    raise AssertionError(f"no draw of ports gave a member {count} of {len(digests)} shards")


def test_an_owner_killed_once_it_has_sent_its_share_once_leaves_most_of_it_on_its_children(big_blob_cluster):
    cluster: Cluster = big_blob_cluster
    m = cluster.corpus.manifest
    digests = [m.digest(i) for i in range(len(m))]
    nodes = [cluster.add(h, port=p) for h, p in _addresses_with_an_owner_of(digests, OWNED)]
    addresses = [n.address for n in nodes]
    owned = {n.address: [i for i in range(len(m)) if ranked(digests[i], addresses)[0] == n.address] for n in nodes}
    victim = max(nodes, key=lambda n: len(owned[n.address]))
    survivors = [n for n in nodes if n is not victim]
    victim.extra = ["--peer-bandwidth", str(PEER_BPS)]
    cluster.start(*nodes)
    share = sum(int(m.sizes[i]) for i in owned[victim.address])
    blocks = {i: -(-int(m.sizes[i]) // m.block_size) for i in owned[victim.address]}
    before = cluster.proxy.bytes_forwarded
    held: dict[int, set[int]] = {}  # per shard it owns: the blocks the others hold when it dies
    its: dict[int, set[int]] = {}  # and those it holds itself

    async def run() -> None:
        killed = asyncio.Event()

        async def kill_once_it_has_sent_its_share_once() -> None:
            try:
                for _ in range(1200):  # at most 60 s
                    sent = (await asyncio.to_thread(victim.status))["cluster"]["bytes_to_peers"]
                    if sent >= share:
                        break
                    await asyncio.sleep(0.05)
                os.kill(victim.daemon.proc.pid, signal.SIGSTOP)  # it sends nothing more; what do the others hold?
                for i in owned[victim.address]:
                    its[i] = await asyncio.to_thread(victim.held_blocks, digests[i], blocks[i])
                    held[i] = set()
                    for node in survivors:
                        held[i] |= await asyncio.to_thread(node.held_blocks, digests[i], blocks[i])
                victim.daemon.kill()  # SIGKILL
            finally:
                killed.set()

        # The consumers read (and block on what is missing) only after the kill: until then every byte the
        # owner sends is prefetch, which it orders as it likes (a blocked consumer's requests go first).
        await asyncio.gather(cluster.stage_all(nodes, 120.0, may_fail=[victim], read_after=killed),
                             kill_once_it_has_sent_its_share_once())

    asyncio.run(run())
    assert victim.daemon.proc.returncode == -signal.SIGKILL
    for node in survivors:
        cluster.assert_complete_and_exact(node)
    read = cluster.proxy.bytes_forwarded - before - 2 * len(nodes) * cluster.corpus.manifest_size
    again = read - m.total_bytes  # what the origin sent twice
    alone = sum(len(its[i] - held[i]) for i in held)  # blocks only the owner held when it died
    total_blocks = sum(blocks.values())
    print(f"owned {len(owned[victim.address])} of {len(m)} shards ({total_blocks} blocks); when it died it held "
          f"{sum(len(b) for b in its.values())}, the others all but {alone} of those ({alone / total_blocks:.3f} of "
          f"its share); the origin sent again {again / share:.3f} of its share")
    pattern = " ".join("".join("#" if b in held[i] else "." for b in range(blocks[i])) for i in sorted(held))
    print(f"the owner's blocks held elsewhere when it died, by shard in the window's order: {pattern}")
    # Before, the owner answered each child's requests side by side from their staggered starts (a quarter
    # of a request apart, for three children), and the first child's requests beyond its 8 connections
    # waited: when it had sent its share once, the blocks at three quarters of each request, and the tail
    # of the last blobs, had never left it (0.162 to 0.209 of its share in six runs of the code before).
    # Now each lane sends the block with the fewest copies out, the children start a third apart and ask
    # for every blob at once: 0.029 to 0.082 in six runs.
    assert alone <= 0.12 * total_blocks, (alone, total_blocks, pattern)
