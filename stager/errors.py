"""The exceptions stager raises, as one small tree.

Every error that stager means to report derives from :class:`StagerError`, and
each subclass also inherits the builtin it resembles, so callers that only know
the standard library can still catch it (``except FileNotFoundError``)::

    StagerError
    ├── ConfigError (ValueError)            bad flag, environment value or config file
    ├── ManifestError (ValueError)          missing, unreadable or invalid manifest
    ├── OriginError (OSError)               the source (object store, HTTP, file://)
    │   ├── ShardNotFound (FileNotFoundError)   404: not retried
    │   ├── AccessDenied (PermissionError)      401/403: not retried
    │   ├── OriginUnavailable (ConnectionError) transient failures outlasted the retry budget
    │   │   ├── TransientOriginError            one transient failure (5xx, reset, short body)
    │   │   └── Throttled                       503 SlowDown / 429
    │   └── CorruptData (ValueError)            bytes that do not match their digest
    │       └── OriginChanged                   the origin keeps serving other bytes than the manifest says
    ├── CacheError (OSError)                the node-local cache tier
    │   ├── CacheFull                       no room in the capacity even after eviction
    │   │   └── DiskFull                    the disk holding the cache has no room (ENOSPC): not waited for
    │   └── BlobTooLarge                    a blob larger than the whole capacity
    └── DaemonError (ConnectionError)       the node daemon's socket or API

Errors from lower libraries (botocore, aiohttp, OSError) are translated once, at
the store's and the cache's edge, with ``raise ... from exc``. Only the CLI turns
a ``StagerError`` into a one-line message; only ``fuse/`` turns one into errno.
"""

from __future__ import annotations

import errno as _errno


class StagerError(Exception):
    """Root of every error stager reports on purpose."""


class ConfigError(StagerError, ValueError):
    """A flag, an environment variable or a config file holds a bad value."""


class ManifestError(StagerError, ValueError):
    """A manifest is missing, unreadable, of an unknown version, or invalid."""


class OriginError(StagerError, OSError):
    """Reading or writing the origin (object store, HTTP server, file system) failed."""


class ShardNotFound(OriginError, FileNotFoundError):
    """The origin says the object does not exist (404). Never retried."""


class AccessDenied(OriginError, PermissionError):
    """The origin refuses access (401/403). Never retried."""


class OriginUnavailable(OriginError, ConnectionError):
    """The origin failed in a way that may pass; raised for good once retries run out."""


class TransientOriginError(OriginUnavailable):
    """One transient failure: a 5xx, a reset connection, a short body, a timeout."""


class Throttled(TransientOriginError):
    """The origin asks us to slow down (503 SlowDown, 429)."""


class CorruptData(OriginError, ValueError):
    """Bytes whose digest does not match the manifest. Retried, never committed."""


class OriginChanged(CorruptData):
    """The origin keeps returning bytes that differ from the manifest (changed or corrupt at rest)."""


class CacheError(StagerError, OSError):
    """The cache tier cannot do what was asked (disk error, bad layout, inconsistency)."""


class CacheFull(CacheError):
    """No room for a blob in the capacity even after eviction (see :class:`DiskFull` for ENOSPC)."""


class DiskFull(CacheFull):
    """The disk holding the cache has no room left (ENOSPC), whatever the capacity says.

    Raised at once, never retried until a deadline: room only comes back when
    something is deleted (by eviction, which has already been tried, or by hand).
    Its ``errno`` is ENOSPC unless the cause said otherwise (EDQUOT).
    """

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        if self.errno is None:
            self.errno = _errno.ENOSPC


class BlobTooLarge(CacheError):
    """A blob is larger than the whole cache capacity; refused up front."""


class DaemonError(StagerError, ConnectionError):
    """The node daemon cannot be reached, or its API answered with an error."""


__all__ = [
    "AccessDenied",
    "BlobTooLarge",
    "CacheError",
    "CacheFull",
    "ConfigError",
    "CorruptData",
    "DaemonError",
    "DiskFull",
    "ManifestError",
    "OriginChanged",
    "OriginError",
    "OriginUnavailable",
    "ShardNotFound",
    "StagerError",
    "Throttled",
    "TransientOriginError",
]
