"""Real daemons on 127.0.0.2..5 sharing one dataset: the origin is read about once, whatever peers do."""

from __future__ import annotations

from tests.cluster.support import Cluster

HOSTS = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]


def origin_bytes(cluster: Cluster) -> int:
    return cluster.proxy.bytes_forwarded


def test_four_nodes_staging_one_dataset_read_it_from_the_origin_about_once(cluster):
    nodes = [cluster.add(h) for h in HOSTS]
    cluster.start(*nodes)
    before = origin_bytes(cluster)
    cluster.stage_everywhere()
    total = cluster.corpus.manifest.total_bytes
    read = origin_bytes(cluster) - before
    for node in nodes:
        cluster.assert_complete_and_exact(node)
    statuses = [n.status() for n in nodes]
    from_peers = sum(s["cluster"]["bytes_from_peers"] for s in statuses)
    manifests = 2 * len(nodes) * cluster.corpus.manifest_size  # read by each node's stage and by its daemon
    assert read - manifests <= 1.1 * total, (read, manifests, total, "\n".join(str(s["cluster"]) for s in statuses))
    assert from_peers >= 2.5 * total  # the other three copies crossed peer links
    assert all(s["cluster"]["live"] == sorted(n.address for n in nodes) for s in statuses)
