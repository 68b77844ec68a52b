"""Prometheus metrics of the daemon, in the text format, from its own registry.

Most values already exist as plain counters: the engine's
:class:`~stager.engine.EngineStats`, the stores' shared
:class:`~stager.store.OriginStats`, the cache's usage and eviction counts,
and each plan's cursor. A custom collector turns a :class:`DaemonSnapshot` of
them into metric families at scrape time (the snapshot is taken off the event
loop first, since cache usage and readiness ahead of a cursor are sqlite
queries). What only the API sees (blobs handed to consumers, readiness waits)
is counted with ordinary prometheus-client metrics in the same registry.

The registry is this daemon's own ``CollectorRegistry``, never the global
one, so several daemons (tests) in one process do not mix their numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .. import __version__
from ..cache import CacheUsage
from ..store.stats import OUTCOMES

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True, slots=True)
class PlanSnapshot:
    consumer: str
    plan: str
    dataset: str
    cursor: int
    length: int
    window_bytes: int
    ready_steps: int  # consecutive positions from the cursor whose blobs are complete
    ready_bytes: int
    ahead_bytes: int = 0  # how far ahead of the cursor the plan stages now (its window in time, bounded)
    rate: float | None = None  # the consumer's measured bytes/s; None before its cursor has moved


@dataclass(frozen=True, slots=True)
class DaemonSnapshot:
    engine: dict[str, float]
    origin: dict[str, int]
    usage: CacheUsage
    evicted_blobs: int
    evicted_bytes: int
    plans: list[PlanSnapshot] = field(default_factory=list)
    consumers: int = 0
    datasets: int = 0
    draining: bool = False
    started: float = 0.0
    cache: str = ""
    socket: str = ""
    cluster: dict | None = None  # ClusterNode.status() when the daemon is a node of a cluster


#: (metric name, help, engine counter) of the engine's counters, exported as they are.
ENGINE_COUNTERS = (
    ("staged_bytes", "Verified bytes written to the cache (from the origin or peers).", "bytes_fetched"),
    ("staged_blocks", "Verified blocks written to the cache (from the origin or peers).", "blocks_fetched"),
    ("staged_blobs", "Blobs fetched and committed to the cache.", "blobs_completed"),
    ("blobs_already_cached", "Blob fetches that found the blob complete already.", "blobs_already_cached"),
    ("blobs_from_other_process", "Blobs completed by another process sharing the cache.", "blobs_from_other_process"),
    ("hedged_requests", "Straggling block requests raced by a second request.", "hedged_requests"),
    ("hedges_won", "Hedged requests whose second request answered first.", "hedges_won"),
    ("verify_failures", "Blocks from the origin that failed their digest (then retried).", "verify_failures"),
    ("consumer_wait_seconds", "Seconds consumers spent blocked on a blob not yet in the cache.",
     "consumer_wait_seconds"),
    ("consumer_waits", "Times a consumer asked for a blob not yet in the cache.", "consumer_waits"),
    ("cache_full_waits", "Prefetches that waited for room in the cache.", "cache_full_waits"),
)

#: The same for the adaptive concurrency limit (engine/concurrency.py) and what it achieves, as gauges.
CONCURRENCY_GAUGES = (
    ("fetch_concurrency", "Block requests the engine allows in flight now (adaptive).", "concurrency"),
    ("fetch_concurrency_ceiling", "The most block requests the adaptive limit may allow.", "concurrency_ceiling"),
    ("fetch_requests_in_flight", "Block requests in flight now.", "requests_in_flight"),
    ("fetch_throughput_bytes_per_second", "Bytes fetched per second over the last second.", "throughput_bps"),
)


class _SnapshotCollector(Collector):
    def __init__(self) -> None:
        self.snapshot: DaemonSnapshot | None = None

    def collect(self) -> Iterator[Metric]:
        s = self.snapshot
        if s is None:
            return
        e, o = s.engine, s.origin

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            return CounterMetricFamily(f"stager_{name}", doc, value=value)

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"stager_{name}", doc, value=value)

        info = GaugeMetricFamily("stager_daemon_info", "The daemon's version, cache and socket (always 1).",
                                 labels=["version", "cache", "socket"])
        info.add_metric([__version__, s.cache, s.socket], 1)
        yield info
        yield gauge("daemon_start_time_seconds", "When the daemon started (seconds since the epoch).", s.started)
        yield gauge("daemon_draining", "1 while the daemon is stopping.", float(s.draining))

        for name, doc, key in ENGINE_COUNTERS:
            yield counter(name, doc, e[key])
        yield counter("staged_origin_bytes", "Of the staged bytes, those fetched from the origin.",
                      e.get("bytes_from_origin", e["bytes_fetched"]))
        yield counter("staged_peer_bytes", "Of the staged bytes, those received from peer nodes (verified).",
                      e.get("bytes_from_peers", 0))
        if "concurrency" in e:  # the adaptive limit (engine/concurrency.py) and what it achieves
            for name, doc, key in CONCURRENCY_GAUGES:
                yield gauge(name, doc, e[key])
            yield counter("fetch_throttle_backoffs", "Times the adaptive limit was cut after SlowDown.",
                          e["throttle_backoffs"])

        requests = CounterMetricFamily("stager_origin_requests", "Requests to the origin by outcome.",
                                       labels=["outcome"])
        for outcome in OUTCOMES:
            requests.add_metric([outcome], o.get(outcome, 0))
        yield requests
        yield counter("origin_retries", "Origin requests made again after a failure.", o["retries"])
        yield counter("origin_gave_up", "Origin operations that ran out of retry budget.", o["gave_up"])
        origin_bytes = CounterMetricFamily("stager_origin_bytes", "Body bytes exchanged with the origin.",
                                           labels=["direction"])
        origin_bytes.add_metric(["read"], o["bytes_read"])
        origin_bytes.add_metric(["written"], o["bytes_written"])
        yield origin_bytes
        yield counter("origin_range_ignored", "Origin responses that ignored the Range header.",
                      o["range_ignored"])

        yield gauge("cache_used_bytes", "Bytes the cache holds (complete blobs and partial reservations).",
                    s.usage.used)
        yield gauge("cache_capacity_bytes", "The cache's capacity in bytes.", s.usage.capacity)
        blobs = GaugeMetricFamily("stager_cache_blobs", "Blobs in the cache by state.", labels=["state"])
        blobs.add_metric(["complete"], s.usage.complete)
        blobs.add_metric(["partial"], s.usage.partial)
        yield blobs
        yield counter("cache_evictions", "Blobs this daemon evicted to make room.", s.evicted_blobs)
        yield counter("cache_evicted_bytes", "Bytes this daemon freed by eviction.", s.evicted_bytes)

        yield gauge("consumers", "Consumers with a live lease.", s.consumers)
        yield gauge("plans", "Registered plans.", len(s.plans))
        yield gauge("datasets", "Datasets opened by the daemon.", s.datasets)
        labels = ["consumer", "plan", "dataset"]
        steps = GaugeMetricFamily("stager_plan_ready_ahead_steps",
                                  "Positions from a plan's cursor whose blobs are complete in the cache.",
                                  labels=labels)
        ready_bytes = GaugeMetricFamily("stager_plan_ready_ahead_bytes",
                                        "Bytes complete in the cache from a plan's cursor on.", labels=labels)
        cursor = GaugeMetricFamily("stager_plan_cursor", "A plan's cursor (positions consumed).", labels=labels)
        length = GaugeMetricFamily("stager_plan_length", "A plan's length in positions.", labels=labels)
        window = GaugeMetricFamily("stager_plan_window_bytes", "A plan's prefetch window in bytes.", labels=labels)
        ahead = GaugeMetricFamily("stager_plan_ahead_bytes",
                                  "How far ahead of its cursor a plan stages now: seconds of its consumer's measured "
                                  "rate past its floor, at most its window.", labels=labels)
        rate = GaugeMetricFamily("stager_plan_consumer_rate_bytes_per_second",
                                 "A plan's consumer's measured rate (bytes of its order per second, smoothed); "
                                 "absent before its cursor has moved.", labels=labels)
        for p in s.plans:
            key = [p.consumer, p.plan, p.dataset]
            steps.add_metric(key, p.ready_steps)
            ready_bytes.add_metric(key, p.ready_bytes)
            cursor.add_metric(key, p.cursor)
            length.add_metric(key, p.length)
            window.add_metric(key, p.window_bytes)
            ahead.add_metric(key, p.ahead_bytes)
            if p.rate is not None:
                rate.add_metric(key, p.rate)
        yield from (steps, ready_bytes, cursor, length, window, ahead, rate)
        if s.cluster is not None:
            from ..cluster.metrics import cluster_metrics

            yield from cluster_metrics(s.cluster)


class DaemonMetrics:
    """The daemon's registry: snapshot metrics, API counters, and the process's CPU and memory."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._snapshot = _SnapshotCollector()
        self.registry.register(self._snapshot)
        ProcessCollector(registry=self.registry)
        self.served_blobs = Counter("stager_served_blobs", "Blobs handed to consumers (their cache path), by "
                                    "whether they were complete when asked (hit) or had to be waited for (miss).",
                                    ["outcome"], registry=self.registry)
        self.served_bytes = Counter("stager_served_bytes", "Bytes of the blobs handed to consumers from the cache, "
                                    "by outcome as for stager_served_blobs.", ["outcome"], registry=self.registry)
        self.ready_wait = Histogram("stager_ready_wait_seconds", "How long one readiness request waited.",
                                    buckets=WAIT_BUCKETS, registry=self.registry)
        self.ready_requests = Counter("stager_ready_requests", "Readiness requests by result "
                                      "(ready, pending: the long-poll ran out and the consumer asks again, error).",
                                      ["result"], registry=self.registry)
        for outcome in ("hit", "miss"):
            self.served_blobs.labels(outcome)
            self.served_bytes.labels(outcome)
        for result in ("ready", "pending", "error"):
            self.ready_requests.labels(result)

    def served(self, nbytes: int, hit: bool, count: int = 1) -> None:
        outcome = "hit" if hit else "miss"
        self.served_blobs.labels(outcome).inc(count)
        self.served_bytes.labels(outcome).inc(nbytes)

    def render(self, snapshot: DaemonSnapshot) -> bytes:
        """The text exposition of every metric, with snapshot values from ``snapshot``."""
        self._snapshot.snapshot = snapshot  # render runs on the event loop: no other render interleaves
        return generate_latest(self.registry)
