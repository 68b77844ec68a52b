"""The store layer: every origin (object store, HTTP server, file system) behind one small interface.

A :class:`Store` is rooted at a URL and reads, writes and lists objects by
relative ``/``-separated paths, which it validates (no ``..``, nothing
absolute): manifest paths are untrusted input. :func:`open_store` picks the
implementation from the URL:

- a bare path or ``file://`` -> :class:`LocalStore`: ``os.pread`` in a
  bounded thread pool, atomic writes by temp file + fsync + rename;
- ``http(s)://`` -> :class:`HttpStore`: read-only, aiohttp Range GETs;
- ``s3://`` -> :class:`S3Store`: SigV4-signed aiohttp requests for reads and
  HEADs (botocore's per-request overhead would cost more CPU than the
  bytes), s3fs/aiobotocore for listing, multipart uploads and the rest;
- any other fsspec protocol -> :class:`FsspecStore`.

The origins this is built for throttle, reset connections, stall, and
sometimes send short or corrupted bodies. So every operation runs under a
:class:`RetryPolicy` (exponential backoff with full jitter, a per-attempt
timeout and an overall deadline) and the libraries' own retries are turned
off, so that there is one budget, one set of counters and one place to
reason about. A store runs at most ``concurrency`` requests at once, and a
request waiting for its turn is not yet timed, so queueing behind the
caller's own requests never looks like a slow origin.

Errors of botocore, aiohttp and the OS are translated in one place
(``translate.py``) into :mod:`stager.errors`: not-found and denied fail at
once; throttling, 5xx, resets, timeouts and wrong-length bodies are retried;
a body that fails the caller's ``check`` (a digest) is retried too and, if it
never passes, reported as :class:`~stager.errors.OriginChanged`.
A ranged read returns exactly the asked bytes or raises: a server that
ignores ``Range`` or answers with other bytes is caught by the response
checks, never passed on. Each store counts what it did in an
:class:`OriginStats` and may share a :class:`BandwidthLimiter`.
"""

from __future__ import annotations

from typing import Any


from ..config import RetryConfig, SourceConfig
from ..errors import ConfigError
from .bandwidth import BandwidthLimiter
from .base import (
    Check,
    InvalidPath,
    InvalidRange,
    ObjectInfo,
    RangeSink,
    Store,
    UnsupportedOperation,
    Upload,
    split_protocol,
    validate_path,
)
from .fsspec_store import FsspecStore
from .http_store import HttpStore
from .local_store import LocalStore
from .retry import RetryPolicy
from .stats import OriginStats


def open_store(
    source: SourceConfig,
    *,
    retry: RetryConfig | None = None,
    bandwidth: int | None = None,
    stats: OriginStats | None = None,
    concurrency: int = 16,
) -> Store:
    """Open the store for ``source``, chosen by its URL scheme.

    Args:
        source: the URL (or bare path) and storage options.
        retry: retry settings; default :class:`~stager.config.RetryConfig`.
        bandwidth: a cap in bytes per second on all of the store's transfers; None = unlimited.
        stats: counters to update; a new :class:`OriginStats` if None (see ``store.stats``).
        concurrency: the connection pool or thread pool size; match the engine's requests in flight.

    Raises:
        ConfigError: unknown protocol, or options the store does not understand.
    """
    if concurrency < 1:
        raise ConfigError(f"store concurrency must be >= 1, got {concurrency}")
    limiter = BandwidthLimiter(bandwidth) if bandwidth else None
    kwargs: dict[str, Any] = dict(retry=retry, bandwidth=limiter, stats=stats, concurrency=concurrency)
    url = source.url
    protocol, _ = split_protocol(url)
    protocol = (protocol or "file").lower()
    options = dict(source.storage_options)
    if protocol in ("file", "local"):
        if options:
            raise ConfigError(f"{url}: a local path takes no storage options, got {sorted(options)}")
        return LocalStore(url if protocol == "file" else url.split("://", 1)[1], **kwargs)
    if protocol in ("http", "https"):
        return HttpStore(url, options, **kwargs)
    if protocol in ("s3", "s3a"):
        try:
            from .s3_store import S3Store
        except ImportError as exc:
            raise ConfigError(f"{url}: S3 support needs the s3 extra (pip install 'stager[s3]')") from exc
        return S3Store(url, options, **kwargs)
    try:
        return FsspecStore(url, options, **kwargs)
    except (ImportError, ValueError) as exc:
        raise ConfigError(f"{url}: no usable filesystem for {protocol}://: {exc}") from exc


def __getattr__(name: str) -> Any:
    # S3Store needs botocore (the s3 extra): imported on first use, not with the package.
    if name == "S3Store":
        from .s3_store import S3Store

        return S3Store
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BandwidthLimiter",
    "Check",
    "FsspecStore",
    "HttpStore",
    "InvalidPath",
    "InvalidRange",
    "LocalStore",
    "ObjectInfo",
    "OriginStats",
    "RangeSink",
    "RetryPolicy",
    "S3Store",
    "Store",
    "UnsupportedOperation",
    "Upload",
    "open_store",
    "validate_path",
]
