"""Options that open the cache tier and configure fetching, shared by stage, verify, serve, mount."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import click

from ..config import (
    DEFAULT_CACHE_DIR_HELP,
    LEGACY_CACHE_DIR,
    CacheConfig,
    FetchConfig,
    RetryConfig,
    default_cache_dir,
    move_legacy_replicate_state,
)
from .options import CAPACITY, RATE, SECONDS, Capacity


def cache_flags(fn: Callable) -> Callable:
    """``--cache`` and ``--capacity``."""
    fn = click.option("--capacity", type=CAPACITY, envvar="STAGER_CAPACITY", default="80%", show_default=True,
                      help="Cache capacity: bytes with a unit (500GB, 2TiB; a bare whole number is bytes) or a "
                           "share of the cache's disk written with % (80%). A bare 1 or 0.5 is refused as "
                           "ambiguous.")(fn)
    fn = click.option("--cache", "cache_dir", envvar="STAGER_CACHE", default=None,
                      show_default=DEFAULT_CACHE_DIR_HELP, type=click.Path(file_okay=False),
                      help="Cache directory on node-local disk.")(fn)
    return fn


def write_flags(fn: Callable) -> Callable:
    """For commands that stage into the cache: ``--direct-writes/--buffered-writes`` and ``--durable``."""
    fn = click.option("--durable", is_flag=True, envvar="STAGER_DURABLE",
                      help="fdatasync each block before it is recorded and fsync each shard before its commit, so "
                           "what the cache holds survives a power loss (slower where the disk is slower than the "
                           "link). Without it, what a power loss may have cost is fetched again, or hashed before "
                           "it is read.")(fn)
    return click.option("--direct-writes/--buffered-writes", default=False, show_default=True,
                        envvar="STAGER_DIRECT_WRITES",
                        help="Write staged bytes straight to the disk (O_DIRECT), not through the page cache "
                             "(less CPU where the disk keeps up with the link; buffered where the filesystem "
                             "refuses O_DIRECT).")(fn)


def fetch_flags(fn: Callable) -> Callable:
    """``--concurrency``, ``--bandwidth``, ``--no-hedge`` and ``--retry-deadline``."""
    fn = click.option("--retry-deadline", type=SECONDS, default=RetryConfig().deadline, show_default=True,
                      envvar="STAGER_RETRY_DEADLINE",
                      help="Seconds (finite, > 0) one block may take across all its retries before the origin "
                           "counts as down.")(fn)
    fn = click.option("--no-hedge", is_flag=True, envvar="STAGER_NO_HEDGE",
                      help="Never race a straggling request with a second one.")(fn)
    fn = click.option("--bandwidth", type=RATE, envvar="STAGER_BANDWIDTH", default=None,
                      help="Cap on origin bandwidth in bytes per second, e.g. 200MB/s or 1GiB/s (a bare number is "
                           "bytes/s); 'unlimited' or unset: no cap. 0 is refused.")(fn)
    fn = click.option("--concurrency", type=click.IntRange(1, 4096), default=FetchConfig().concurrency,
                      envvar="STAGER_CONCURRENCY", show_default=True,
                      help="The most block requests in flight (1..4096): the number in flight starts at 16 and "
                           "follows the origin (more while throughput grows, fewer on SlowDown or rising latency) "
                           "up to this.")(fn)
    return fn


def cache_config(cache_dir: str | None, capacity: Capacity, direct_writes: bool = False) -> CacheConfig:
    """The cache of a command from its ``--cache`` and (parsed) ``--capacity``."""
    directory = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    if directory == Path(LEGACY_CACHE_DIR).expanduser():
        move_legacy_replicate_state()  # older versions kept replicate's state inside this directory
    size, share = capacity
    return CacheConfig(directory=directory, capacity=size, capacity_share=share, direct_writes=direct_writes)


def fetch_config(concurrency: int, bandwidth: int | None, no_hedge: bool, retry_deadline: float,
                 durable: bool = False, **extra) -> FetchConfig:
    """The fetch settings of a command from its (parsed) fetch flags; ``extra`` sets other fields."""
    retry = RetryConfig(deadline=retry_deadline, request_timeout=min(RetryConfig().request_timeout, retry_deadline))
    return FetchConfig(concurrency=concurrency, bandwidth=bandwidth, hedge=not no_hedge, retry=retry,
                       durable=durable, **extra)
