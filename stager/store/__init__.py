"""The store layer: every origin (object store, HTTP server, file system) behind one small interface.

A :class:`Store` is rooted at a URL and reads, writes and lists objects by
relative ``/``-separated paths, which it validates (no ``..``, nothing
absolute): manifest paths are untrusted input. :func:`open_store` picks the
implementation from the URL:

- a bare path or ``file://`` -> :class:`LocalStore`: ``os.pread`` in a
  bounded thread pool, atomic writes by temp file + fsync + rename;
- ``http(s)://`` -> :class:`HttpStore`: read-only Range GETs;
- ``s3://`` -> :class:`S3Store`: SigV4-signed requests for reads and
  HEADs (botocore's per-request overhead would cost more CPU than the
  bytes), s3fs/aiobotocore for listing, multipart uploads and the rest.
  Both read through one HTTP-family path (``signed_http.py``, on the
  client of ``wire.py``) and differ only in how a request is signed;
- any other fsspec protocol -> :class:`FsspecStore`.

The origins this is built for throttle, reset connections, stall, and
sometimes send short or corrupted bodies. So every operation runs under a
:class:`RetryPolicy` (exponential backoff with full jitter, a per-attempt
timeout and an overall deadline) and the libraries' own retries are turned
off, so that there is one budget, one set of counters and one place to
reason about. A store runs at most ``concurrency`` requests at once, and a
request waiting for its turn is not yet timed, so queueing behind the
caller's own requests never looks like a slow origin. Those settings (retry,
bandwidth cap, counters, concurrency) are one frozen :class:`StoreOptions`
value, given to :func:`open_store` and every store's constructor.

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

from dataclasses import replace
from typing import Any

from ..config import SourceConfig
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
from .options import StoreOptions
from .retry import RetryPolicy
from .stats import OriginStats


def open_store(source: SourceConfig, options: StoreOptions | None = None, **fields: Any) -> Store:
    """Open the store for ``source``, chosen by its URL scheme.

    Args:
        source: the URL (or bare path) and storage options.
        options: retry, bandwidth, stats and concurrency (:class:`StoreOptions`; its defaults if None).
        fields: any of those four by name, over ``options`` (``open_store(source, retry=...)``).

    Raises:
        ConfigError: unknown protocol, options the store does not understand, a concurrency below 1.
    """
    options = replace(options or StoreOptions(), **fields) if fields else (options or StoreOptions())
    url = source.url
    protocol, _ = split_protocol(url)
    protocol = (protocol or "file").lower()
    given = dict(source.storage_options)
    if protocol in ("file", "local"):
        if given:
            raise ConfigError(f"{url}: a local path takes no storage options, got {sorted(given)}")
        return LocalStore(url if protocol == "file" else url.split("://", 1)[1], options=options)
    if protocol in ("http", "https"):
        return HttpStore(url, given, options=options)
    if protocol in ("s3", "s3a"):
        try:
            from .s3_store import S3Store
        except ImportError as exc:
            raise ConfigError(f"{url}: S3 support needs the s3 extra (pip install 'stager[s3]')") from exc
        return S3Store(url, given, options=options)
    try:
        return FsspecStore(url, given, options=options)
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
    "StoreOptions",
    "UnsupportedOperation",
    "Upload",
    "open_store",
    "validate_path",
]
