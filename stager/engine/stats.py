"""The engine's counters: what it fetched, verified, hedged and waited for.

Plain integers and floats updated on the event loop; the daemon exports them
to Prometheus and ``stage``/``stats()`` print them. Beside the counters,
``gauges`` (set by the engine) reads what is true now: the adaptive
concurrency limit, requests in flight and the recent throughput. Origin-side counters
(requests by outcome, retries) live in the store's ``OriginStats``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Callable

from .source import ORIGIN, PEER


@dataclass(slots=True)
class EngineStats:
    bytes_fetched: int = 0  # verified bytes written to the cache, from every source
    bytes_from_origin: int = 0  # of those, from the origin
    bytes_from_peers: int = 0  # of those, from other sources (peers)
    blocks_fetched: int = 0
    blobs_completed: int = 0  # blobs this engine committed
    blobs_already_cached: int = 0  # asked for, found complete
    blobs_from_other_process: int = 0  # completed by another process sharing the cache while we waited
    hedged_requests: int = 0
    hedges_won: int = 0
    verify_failures: int = 0  # blocks whose bytes did not match their digest (then retried)
    consumer_wait_seconds: float = 0.0  # time consumers spent blocked on a blob or block
    consumer_waits: int = 0
    cache_full_waits: int = 0  # prefetches that waited for room
    # sources skipped for a span (failed, timed out, bytes failing verification) by kind: source_failures_<kind>
    source_failures: dict[str, int] = field(default_factory=dict)
    # -> concurrency, concurrency_peak, requests_in_flight, throughput_bps, throttle_backoffs
    gauges: Callable[[], dict[str, float]] | None = field(default=None, repr=False, compare=False)

    def as_dict(self) -> dict[str, float]:
        """The counters, and the gauges' values now."""
        values: dict[str, float] = {f.name: getattr(self, f.name) for f in fields(self)
                                    if f.name not in ("gauges", "source_failures")}
        for kind in (ORIGIN, PEER, *self.source_failures):
            values[f"source_failures_{kind}"] = self.source_failures.get(kind, 0)
        if self.gauges is not None:
            values.update(self.gauges())
        return values
