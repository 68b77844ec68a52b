"""Plain counters of what a store asked of its origin, for the engine to export.

Everything runs on one event loop, so increments need no lock. The engine
reads the fields (or :meth:`OriginStats.snapshot`) and turns them into
Prometheus counters; nothing here knows about Prometheus.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

#: The outcomes a request can have, one counter each.
OUTCOMES = ("ok", "throttled", "transient", "corrupt", "not_found", "denied", "failed")


@dataclass(slots=True)
class OriginStats:
    """Counters for one origin (one store, or several sharing it).

    ``failed`` counts attempts that ended in an error that is neither
    transient nor a not-found/denied answer (bad request, invalid range).
    ``retries`` counts attempts made again after a failure; ``gave_up``
    counts operations that ran out of retry budget. Byte counters count
    bodies received or sent, including ones later found corrupt.
    """

    ok: int = 0
    throttled: int = 0
    transient: int = 0
    corrupt: int = 0
    not_found: int = 0
    denied: int = 0
    failed: int = 0
    retries: int = 0
    gave_up: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    range_ignored: int = 0  # responses whose origin ignored the Range header

    @property
    def requests(self) -> int:
        """All attempts, whatever their outcome."""
        return sum(getattr(self, name) for name in OUTCOMES)

    def count(self, outcome: str) -> None:
        """Add one request with ``outcome`` (one of :data:`OUTCOMES`)."""
        setattr(self, outcome, getattr(self, outcome) + 1)

    def snapshot(self) -> dict[str, int]:
        """The counters as a plain dict (a copy)."""
        return asdict(self)
