"""Origin profiles: fault plans that make the proxy behave like a real object store.

A loopback origin answers at once and as fast as the CPU goes; a real object
store takes tens of milliseconds to the first byte of each GET, delivers tens
of MB/s per connection at most, and answers ``503 SlowDown`` to a burst of
requests on one prefix. Each profile here is a :class:`FaultPlan` for
:class:`FaultProxy` that reproduces one such origin, so tests, the demo and
the benchmarks compare tools on the same terms.
"""

from __future__ import annotations

from .fault_plan import FaultPlan

MB = 1_000_000

#: name -> (one line description, FaultPlan fields). Latency jitter is a quarter of the latency.
PROFILES: dict[str, tuple[str, dict[str, float]]] = {
    "loopback": ("no shaping: the origin as it is", {}),
    "near": ("40 ms to first byte, 8 MB/s per connection (an object store in the same region)",
             {"latency_s": 0.04, "jitter_s": 0.01, "connection_bps": 8 * MB}),
    "far": ("100 ms to first byte, 2 MB/s per connection (an object store across regions)",
            {"latency_s": 0.1, "jitter_s": 0.025, "connection_bps": 2 * MB}),
    "throttled": ("503 SlowDown above 300 requests/s per prefix, 10 ms to first byte",
                  {"latency_s": 0.01, "jitter_s": 0.0025, "rate_limit_rps": 300.0}),
}


def object_store_plan(name: str, **overrides: object) -> FaultPlan:
    """A fresh :class:`FaultPlan` for profile ``name`` (see :data:`PROFILES`), with ``overrides`` applied.

    Raises:
        ValueError: an unknown profile name or an invalid override.
    """
    if name not in PROFILES:
        raise ValueError(f"unknown origin profile {name!r}; known: {', '.join(PROFILES)}")
    fields = {**PROFILES[name][1], **overrides}
    return FaultPlan(**fields)  # type: ignore[arg-type]
