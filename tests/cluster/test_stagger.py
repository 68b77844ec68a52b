"""The owner's children in a blob's spreading tree take its blocks in staggered orders: an owner that dies
leaves little that only it held, so its successors read little of its share from the origin again (real
daemons)."""

from __future__ import annotations

import asyncio
import signal

from stager.cluster.placement import ranked
from tests.cluster.support import Cluster

HOSTS = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]
#: What the owner sends each peer, bytes per second: its uplink, not the origin, is what holds the blocks back.
PEER_BPS = 150_000


def test_an_owner_killed_while_its_children_take_its_blobs_costs_the_origin_little_of_its_share(fine_cluster):
    cluster: Cluster = fine_cluster
    m = cluster.corpus.manifest
    nodes = [cluster.add(h) for h in HOSTS]
    addresses = [n.address for n in nodes]
    owned = {n.address: [i for i in range(len(m)) if ranked(m.digest(i), addresses)[0] == n.address]
             for n in nodes}
    victim = max(nodes, key=lambda n: len(owned[n.address]))
    survivors = [n for n in nodes if n is not victim]
    victim.extra = ["--peer-bandwidth", str(PEER_BPS)]
    cluster.start(*nodes)
    share = sum(int(m.sizes[i]) for i in owned[victim.address])
    total = m.total_bytes
    assert share >= 2 * total / len(m), owned  # the victim owns two shards at least
    before = cluster.proxy.bytes_forwarded

    async def run() -> None:
        killed = asyncio.Event()

        async def kill_when_each_child_has_a_third_of_its_share() -> None:
            try:
                for _ in range(600):  # at most 60 s
                    sent = (await asyncio.to_thread(victim.status))["cluster"]["bytes_to_peers"]
                    if sent >= share * len(survivors) / 3:
                        break
                    await asyncio.sleep(0.1)
                victim.daemon.kill()  # SIGKILL
            finally:
                killed.set()

        # The consumers block on what is missing only after the kill. Blocked from the start, each would
        # wait on the same first shard: its blocks go to every child at once, first (a consumer is never
        # made to wait for prefetch), and are not staggered; the staggering is for what is fetched ahead.
        await asyncio.gather(cluster.stage_all(nodes, 90.0, may_fail=[victim], read_after=killed),
                             kill_when_each_child_has_a_third_of_its_share())

    asyncio.run(run())
    assert victim.daemon.proc.returncode == -signal.SIGKILL
    for node in survivors:
        cluster.assert_complete_and_exact(node)
    read = cluster.proxy.bytes_forwarded - before - 2 * len(nodes) * cluster.corpus.manifest_size
    statuses = [n.status() for n in survivors]
    detail = "\n".join(str(s["cluster"]) for s in statuses)
    again = read - total  # what the origin sent twice: what only the dead owner held
    # Its three children each held a third of its blobs when it died. Taken in the same order (before), the
    # same third: two thirds of its share came from the origin again (0.660, 0.665, 0.666 in three runs).
    # Staggered (the children start at blocks 0, 5 and 10 of 20; 0, 6 and 13 since they are staggered by
    # their number and their blocks sent fewest times first), different thirds, most of each blob
    # between them, and the new owner takes what its two successors hold: 0.164 to 0.184 in four runs.
    # With the consumers reading only after the kill: 0.172 to 0.270 on main, 0.015 to 0.151 with the first
    # copies sent first (five runs). Blocked from the start instead: 0.25 to 0.56 with the first copies (the
    # first shard goes to every child at once, urgently), 0.164 to 0.184 on main, where urgency stopped at
    # the asker.
    assert again <= 0.5 * share, (again, share, total, detail)  # 0.66 before the staggering; 0.16-0.41 after
