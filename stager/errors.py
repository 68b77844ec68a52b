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
    │   ├── CorruptData (ValueError)            bytes that do not match their digest
    │   │   └── OriginChanged                   the origin keeps serving other bytes than the manifest says
    │   ├── InvalidPath (ValueError)            a store path that is empty, absolute or climbs out (..)
    │   ├── InvalidRange (ValueError)           a byte range that is negative, reversed or past the end
    │   ├── UnsupportedOperation                the origin cannot do this at all (list or write over HTTP)
    │   ├── DestinationGone                     replicate: the destination's bucket or folder is gone
    │   └── UploadLost                          replicate: a multipart upload vanished before it completed
    ├── CacheError (OSError)                the node-local cache tier
    │   ├── CacheFull                       no room in the capacity even after eviction
    │   │   └── DiskFull                    the disk holding the cache has no room (ENOSPC): not waited for
    │   ├── BlobTooLarge                    a blob larger than the whole capacity
    │   └── CacheCorrupt                    bytes on the cache disk that no longer match their digest
    ├── DaemonError (ConnectionError)       the node daemon's socket or API
    │   ├── DaemonUnavailable               nobody answers, the connection broke, or it is stopping
    │   └── DaemonRequestError (ValueError) the daemon refused the request (HTTP 4xx)
    │       ├── UnknownPlan (LookupError)       it holds no such plan: register it again
    │       ├── ConsumerKeyMismatch (PermissionError)  another consumer's key
    │       └── ManifestVersionGone (ManifestError)    a manifest version the daemon no longer holds
    ├── NotAtDestination (FileNotFoundError)  replicate --finalize: an object missing or different there
    ├── ReplicationBusy (BlockingIOError)   another process runs the same replication shard
    ├── JournalError (OSError)              replicate's journal database cannot be opened or written
    ├── MountError (OSError)                FUSE cannot work here, or the mount point cannot be used
    ├── BlobSourceError (ConnectionError)   one place a blob's bytes come from failed (the next is tried)
    │   └── PeerError                       a peer node: down, too slow, refused, or sent bad bytes
    └── CheckpointError (OSError)           a checkpoint's staging, drain or stores
        ├── StagingFull                     the staging directory has no room for a save, even after waiting
        └── CheckpointIncomplete            no store holds a complete, verified copy of a checkpoint's file

Outside the tree: :class:`S3ServerError` (a ``RuntimeError``, defined here
too), raised by the test origins of ``stager.testing`` when the test harness
itself fails, not stager; and signals that never leave the module raising them
(the store's HTTP client's ``ProtocolError`` and ``RedirectLoop`` and the retry
loop's ``_AttemptTimedOut``, all translated at the store's edge; ``DirectRefused``
in the cache's direct writes).

Errors from lower libraries (botocore, aiohttp, OSError) are translated once, at
the store's and the cache's edge, with ``raise ... from exc``. Only the CLI turns
a ``StagerError`` into a one-line message; only ``fuse/`` turns one into errno.

Work fanned out with ``asyncio.TaskGroup`` fails with an ``ExceptionGroup``;
:func:`leaf_errors`, :func:`first_error` and :func:`group_message` are the one
place that looks inside one (for code that re-raises a single error, and for
the CLI's one line).
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


class InvalidPath(OriginError, ValueError):
    """A path given to a store is empty, absolute, or climbs out of the root (``..``)."""


class InvalidRange(OriginError, ValueError):
    """A byte range is negative, reversed, or reaches past the end of the object. Never retried."""


class UnsupportedOperation(OriginError):
    """The origin cannot do this at all (listing an HTTP server, writing to it)."""


class DestinationGone(OriginError):
    """A write to the destination answered "not found": its bucket or folder is gone. Stops the run."""


class UploadLost(OriginError):
    """A multipart upload vanished before it completed (aborted, expired): that object is copied again next run."""


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


class CacheCorrupt(CacheError):
    """Bytes read back from the cache disk do not match their digest (rotted since they were verified).

    The commit raises it after forgetting the bad blocks; fetching them again
    brings good bytes. ``blocks`` names the bad
    blocks (empty: the whole file is bad, or it is not known which block).
    A reader that finds bad bytes raises it with the file's ``identity``
    before anything is dropped; it drops them through the cache's API.
    """

    def __init__(self, message: str, blocks: tuple[int, ...] = (), identity: tuple[int, int] | None = None) -> None:
        super().__init__(message)
        self.blocks = blocks
        self.identity = identity  # (device, inode) of the bad file, when a reader found it


class DaemonError(StagerError, ConnectionError):
    """The node daemon cannot be reached, or its API answered with an error."""


class DaemonUnavailable(DaemonError):
    """Nobody answers on the socket, the connection broke, or the daemon is stopping."""


class DaemonRequestError(DaemonError, ValueError):
    """The daemon answered and refused the request as invalid (HTTP 4xx)."""


class UnknownPlan(DaemonRequestError, LookupError):
    """The daemon holds no such plan (it restarted, or the consumer's lease expired): register it again."""


class ConsumerKeyMismatch(DaemonRequestError, PermissionError):
    """The request does not carry the key of the consumer it names (another process's plans)."""


class ManifestVersionGone(DaemonRequestError, ManifestError):
    """The consumer's manifest is neither the origin's current one nor a version the daemon still holds."""


class NotAtDestination(StagerError, FileNotFoundError):
    """``--finalize`` found an object missing or different at the destination."""


class ReplicationBusy(StagerError, BlockingIOError):
    """Another process is running the same replication shard with this state directory."""


class JournalError(StagerError, OSError):
    """The journal database cannot be opened or written (disk full, corrupt file)."""


class MountError(StagerError, OSError):
    """FUSE cannot work here, or the mount point cannot be used or unmounted."""


class BlobSourceError(StagerError, ConnectionError):
    """A source of a blob's bytes other than the origin failed; the engine goes on with the next one."""


class PeerError(BlobSourceError):
    """A peer node could not give the bytes asked for.

    ``kind`` says why, for the failure counters: ``down`` (no connection), ``timeout`` (slower than the
    deadline), ``refused`` (401: the cluster secrets differ), ``missing`` (it neither holds nor fetches
    the blob), ``corrupt`` (bytes that failed verification) or ``protocol`` (an answer that makes no sense).
    """

    def __init__(self, message: str, kind: str = "protocol") -> None:
        super().__init__(message)
        self.kind = kind


class CheckpointError(StagerError, OSError):
    """A checkpoint cannot be staged, drained, verified or loaded as asked."""


class StagingFull(CheckpointError):
    """A save needs more room than the staging directory has, and the drain did not free it in time.

    Nothing is dropped to make room: only checkpoints already verified at every
    store are removed from staging, oldest first.
    """


class CheckpointIncomplete(CheckpointError):
    """A file of a checkpoint is missing or damaged at every store that should hold it."""


class S3ServerError(RuntimeError):
    """A test origin (the rclone S3 server of ``stager.testing``) could not be started or refused an admin
    request. Not a :class:`StagerError`: it is the test harness failing, not stager."""


def leaf_errors(group: BaseException) -> list[BaseException]:
    """The errors inside ``group`` (nested groups flattened, in order); ``[group]`` if it is not a group."""
    if not isinstance(group, BaseExceptionGroup):
        return [group]
    leaves: list[BaseException] = []
    stack: list[BaseException] = [group]
    while stack:  # depth-first, keeping the order the group lists them in
        exc = stack.pop()
        if isinstance(exc, BaseExceptionGroup):
            stack.extend(reversed(exc.exceptions))
        else:
            leaves.append(exc)
    return leaves


def first_error(group: BaseException) -> BaseException:
    """The error to report for ``group``: its first :class:`StagerError`, else its first error of any kind."""
    leaves = leaf_errors(group)
    return next((e for e in leaves if isinstance(e, StagerError)), leaves[0])


def group_message(group: BaseException) -> str | None:
    """One line for a group whose every error is a :class:`StagerError`; None if any is not (a bug).

    The line is the first error's, then ``(and N other errors)`` when there are more.
    Cancellations that the first failure caused in its sibling tasks are not counted.
    """
    import asyncio

    leaves = [e for e in leaf_errors(group) if not isinstance(e, asyncio.CancelledError)]
    if not leaves or not all(isinstance(e, StagerError) for e in leaves):
        return None
    others = len(leaves) - 1
    suffix = f" (and {others} other error{'s' if others > 1 else ''})" if others else ""
    return f"{leaves[0]}{suffix}"


__all__ = [
    "AccessDenied",
    "BlobSourceError",
    "BlobTooLarge",
    "CacheCorrupt",
    "CacheError",
    "CacheFull",
    "CheckpointError",
    "CheckpointIncomplete",
    "ConfigError",
    "ConsumerKeyMismatch",
    "CorruptData",
    "DaemonError",
    "DaemonRequestError",
    "DaemonUnavailable",
    "DestinationGone",
    "DiskFull",
    "InvalidPath",
    "InvalidRange",
    "JournalError",
    "ManifestError",
    "ManifestVersionGone",
    "MountError",
    "NotAtDestination",
    "OriginChanged",
    "OriginError",
    "OriginUnavailable",
    "PeerError",
    "ReplicationBusy",
    "S3ServerError",
    "ShardNotFound",
    "StagerError",
    "StagingFull",
    "Throttled",
    "TransientOriginError",
    "UnknownPlan",
    "UnsupportedOperation",
    "UploadLost",
    "first_error",
    "group_message",
    "leaf_errors",
]
