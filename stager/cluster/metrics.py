"""The cluster's Prometheus metrics, from :meth:`ClusterNode.status` (the daemon's ``/metrics`` adds them).

Bytes from the origin are the engine's ``stager_staged_origin_bytes``; here
are the bytes that crossed peer links each way, peer requests answered by
outcome, requests that failed by kind, and the membership as this node sees it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .stats import FAILURE_KINDS


def cluster_metrics(status: dict[str, Any]) -> Iterator[Metric]:
    """Metric families for one node's cluster status."""
    peer_bytes = CounterMetricFamily("stager_peer_bytes", "Verified bytes exchanged with peer nodes.",
                                     labels=["direction"])
    peer_bytes.add_metric(["received"], status["bytes_from_peers"])
    peer_bytes.add_metric(["sent"], status["bytes_to_peers"])
    yield peer_bytes
    answered = CounterMetricFamily("stager_peer_requests_answered", "Peer requests this node answered, by outcome.",
                                   labels=["outcome"])
    answered.add_metric(["served"], status["requests_served"])
    answered.add_metric(["missing"], status["requests_missing"])
    answered.add_metric(["unauthorized"], status["requests_unauthorized"])
    yield answered
    yield CounterMetricFamily("stager_peer_fetches_for_peers",
                              "Ranges this node fetched (or waited for) on a peer's behalf.",
                              value=status["fetches_for_peers"])
    failures = CounterMetricFamily("stager_peer_failures", "Requests to peers that failed, by kind.",
                                   labels=["kind"])
    for kind in FAILURE_KINDS:
        failures.add_metric([kind], status["peer_failures"][kind])
    yield failures
    members = GaugeMetricFamily("stager_cluster_members", "Cluster members as this node sees them, by state.",
                                labels=["state"])
    members.add_metric(["live"], len(status["live"]))
    members.add_metric(["down"], len(status["down"]))
    yield members
    up = GaugeMetricFamily("stager_cluster_member_up", "1 for a member this node counts as live, 0 for one down.",
                           labels=["member"])
    live = set(status["live"])
    for member in status["members"]:
        up.add_metric([member], 1.0 if member in live else 0.0)
    yield up
