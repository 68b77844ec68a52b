"""Options that open the cache tier and configure fetching, shared by stage, verify, serve, mount."""

from __future__ import annotations

from typing import Callable

import click

from ..config import DEFAULT_CACHE_DIR, CacheConfig, FetchConfig, RetryConfig, parse_fraction_or_size, parse_rate
from ..errors import ConfigError


def cache_flags(fn: Callable) -> Callable:
    fn = click.option("--capacity", envvar="STAGER_CAPACITY", default="80%", show_default=True,
                      help="Cache capacity: bytes (500GB, 2TiB) or a share of the cache's disk (80%).")(fn)
    fn = click.option("--cache", "cache_dir", envvar="STAGER_CACHE", default=DEFAULT_CACHE_DIR, show_default=True,
                      type=click.Path(file_okay=False), help="Cache directory on node-local disk.")(fn)
    return fn


def write_flags(fn: Callable) -> Callable:
    """For commands that stage into the cache."""
    return click.option("--direct-writes/--buffered-writes", default=True, show_default=True,
                        envvar="STAGER_DIRECT_WRITES",
                        help="Write staged bytes straight to the disk (O_DIRECT), not through the page cache "
                             "(buffered where the filesystem refuses O_DIRECT).")(fn)


def fetch_flags(fn: Callable) -> Callable:
    fn = click.option("--retry-deadline", type=float, default=RetryConfig().deadline, show_default=True,
                      envvar="STAGER_RETRY_DEADLINE",
                      help="Seconds one block may take across all its retries before the origin counts as down.")(fn)
    fn = click.option("--no-hedge", is_flag=True, help="Never race a straggling request with a second one.")(fn)
    fn = click.option("--bandwidth", envvar="STAGER_BANDWIDTH", default=None,
                      help="Cap on origin bandwidth, e.g. 200MB/s (default: unlimited).")(fn)
    fn = click.option("--concurrency", type=click.IntRange(1, 4096), default=FetchConfig().concurrency,
                      envvar="STAGER_CONCURRENCY", show_default=True, help="The most block requests in flight: the number in flight starts at 16 and follows the "
                           "origin (more while throughput grows, fewer on SlowDown or rising latency) up to this.")(fn)
    return fn


def cache_config(cache_dir: str, capacity: str, direct_writes: bool = True) -> CacheConfig:
    size, share = parse_fraction_or_size(capacity, what="--capacity")
    return CacheConfig(directory=cache_dir, capacity=size, capacity_share=share, direct_writes=direct_writes)


def fetch_config(concurrency: int, bandwidth: str | None, no_hedge: bool, retry_deadline: float,
                 **extra) -> FetchConfig:
    if retry_deadline <= 0:
        raise ConfigError(f"--retry-deadline must be > 0, got {retry_deadline}")
    retry = RetryConfig(deadline=retry_deadline, request_timeout=min(RetryConfig().request_timeout, retry_deadline))
    return FetchConfig(concurrency=concurrency, bandwidth=parse_rate(bandwidth, what="--bandwidth"),
                       hedge=not no_hedge, retry=retry, **extra)
