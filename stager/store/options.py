"""How a store runs its requests: one frozen :class:`StoreOptions` value given to every store.

The retry budget, the bandwidth cap, the counters to update and the number of
requests (connections, threads) at once are the same four things for every
origin kind. :func:`~stager.store.open_store` and each store's constructor
take them as one value, and :meth:`StoreOptions.machinery` turns them into
what a store uses: its counters, its retry policy and its bandwidth limiter.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..config import RetryConfig
from ..errors import ConfigError
from .bandwidth import BandwidthLimiter
from .retry import RetryPolicy
from .stats import OriginStats


@dataclass(frozen=True, slots=True)
class StoreOptions:
    """A store's request settings.

    Args:
        retry: retry settings; default :class:`~stager.config.RetryConfig`.
        bandwidth: a cap in bytes per second on all of the store's transfers; None = unlimited.
        stats: counters to update; a new :class:`OriginStats` per store if None (see ``store.stats``).
        concurrency: the connection pool or thread pool size; match the engine's requests in flight.

    Raises:
        ConfigError: a concurrency below 1.
    """

    retry: RetryConfig | None = None
    bandwidth: int | None = None
    stats: OriginStats | None = field(default=None, compare=False)
    concurrency: int = 16

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ConfigError(f"store concurrency must be >= 1, got {self.concurrency}")

    @property
    def retry_config(self) -> RetryConfig:
        return self.retry or RetryConfig()

    def machinery(self) -> tuple[OriginStats, RetryPolicy, BandwidthLimiter | None]:
        """A store's counters, its retry policy (``concurrency`` requests at once) and its limiter."""
        stats = self.stats if self.stats is not None else OriginStats()
        limiter = BandwidthLimiter(self.bandwidth) if self.bandwidth else None
        return stats, RetryPolicy(self.retry, stats=stats, concurrency=self.concurrency), limiter
