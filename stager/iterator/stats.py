"""What a consumer spent waiting for data, and what staging did for it.

The iterator counts what only it can see (time blocked in ``ready``, shards
found staged on first touch); the session adds the engine's and the
origin's counters (bytes staged, retries); the "steps ready ahead" figure
is measured when asked, from the cache directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(slots=True)
class IteratorStats:
    wait_seconds: float = 0.0  # wall time blocked until a shard was verified in the cache
    waits: int = 0  # shards that were not staged yet when first needed
    cache_hits: int = 0  # shards already staged when first needed
    shards_opened: int = 0
    plans: int = 0  # plans registered (one per epoch or resume)
    corrupt_blobs: int = 0  # cache files whose bytes no longer matched their digest (dropped)
    refetches: int = 0  # shards fetched again after their cache file was found bad or gone

    def opened(self, hit: bool, waited: float) -> None:
        self.shards_opened += 1
        self.wait_seconds += waited
        if hit:
            self.cache_hits += 1
        else:
            self.waits += 1

    def as_dict(self, session: Mapping[str, Any], ready_steps: int) -> dict[str, Any]:
        """These counters, the session's (prefixed ``session_``) and the headline figures."""
        return {
            "wait_seconds": self.wait_seconds,
            "waits": self.waits,
            "cache_hits": self.cache_hits,
            "shards_opened": self.shards_opened,
            "plans": self.plans,
            "cache_full_waits": int(session.get("cache_full_waits", 0)),  # the engine waits for room
            "corrupt_blobs": self.corrupt_blobs,
            "refetches": self.refetches,
            "bytes_staged": int(session.get("bytes_fetched", 0)),
            "retries": int(session.get("origin_retries", 0)),
            "ready_steps": ready_steps,
            **{f"session_{k}": v for k, v in session.items()},
        }
