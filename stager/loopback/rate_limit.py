"""A per-prefix request-rate limit for the fault proxy, as S3 applies one per key prefix.

How it works: one token bucket per prefix (the request path up to its last
``/``), refilled at ``rate`` tokens per second up to ``burst``. A request takes
a token or, if the bucket is empty, is refused (the proxy then answers
``503 SlowDown``). Refused requests take nothing, so a client that backs off
gets through again at the rate. Buckets live on the proxy's event loop only
(no lock); the rate is passed per call, so a plan change applies at once.
"""

from __future__ import annotations


def prefix_of(path: str) -> str:
    """The S3 prefix that a request for ``path`` counts against (``/bucket/a/b`` -> ``/bucket/a/``)."""
    return path[: path.rfind("/") + 1]


class PrefixRateLimiter:
    """Token buckets by prefix: :meth:`admit` says whether a request may go on now."""

    def __init__(self) -> None:
        self._buckets: dict[str, tuple[float, float]] = {}  # prefix -> (tokens, last refill time)

    def admit(self, path: str, now: float, rate: float | None, burst: float | None = None) -> bool:
        """Take a token for ``path``'s prefix at time ``now``; False if there is none (rate None: always True)."""
        if not rate:
            return True
        depth = burst if burst else max(1.0, rate / 10)
        prefix = prefix_of(path)
        tokens, last = self._buckets.get(prefix, (depth, now))
        tokens = min(depth, tokens + (now - last) * rate)
        if tokens < 1.0:
            self._buckets[prefix] = (tokens, now)
            return False
        self._buckets[prefix] = (tokens - 1.0, now)
        return True
