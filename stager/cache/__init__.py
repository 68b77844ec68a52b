"""The node-local cache tier: verified blobs on local disk, safe against kill -9 at any point.

A blob (a shard's bytes, named by its xxh3-128 digest) is ABSENT, PARTIAL or
COMPLETE. On disk (see ``layout.py``)::

    CACHE/stager-cache.toml       format name and version; an unknown version is refused
    CACHE/index.sqlite            the index (WAL): rows per blob, verified blocks, pins, holds, datasets
    CACHE/blobs/ab/abcdef...      COMPLETE blobs: read-only, every block verified
    CACHE/index.reserve           room the index takes when the disk is full (reserve.py)
    CACHE/partial/<digest>.<gen>  PARTIAL blobs: files of full size (allocated), filled block by block
    CACHE/locks/blobs.ranges      the blobs' cross-process locks, a byte each (one fetcher per blob)

How a blob gets there. ``begin`` reserves the blob's size against the capacity
and against the room left on the disk (the capacity follows the disk where the
disk is smaller) in one ``BEGIN IMMEDIATE`` transaction of the index, which is
also the cross-process lock for every capacity decision; the partial file,
with its blocks allocated, is made just before that transaction where the
blob looks as if it fits (the transaction checks the file is still there),
else inside it. A disk with no room left even
after eviction is :class:`~stager.errors.DiskFull` at once, never waited on.
``write_block`` pwrites a block the engine has verified, fdatasyncs it, and
only then records it as verified. ``commit`` re-hashes the whole file against
the blob's digest (a recorded block that rotted on the disk is forgotten and
fetched again, never committed), fsyncs the file unless its blocks were
recorded without fdatasync (then the row keeps the boot id), makes it
read-only, renames it into ``blobs/`` and fsyncs that directory (same
condition), then marks the blob complete in a transaction of its own. The
file system work of a begin and a commit stays out of the index's lock,
which every other begin and commit of the cache waits for (with many small
shards, that work held the lock for most of the time). Eviction and removal unlink the file inside the
transaction that drops the row; a reader that already opened or mapped the
file keeps reading it (POSIX).

Why a crash at any point leaves a consistent cache:

- a file under ``blobs/`` only ever appears by renaming a partial file whose
  every block was verified and whose whole bytes were re-hashed just before,
  so it is complete and correct (when renamed: readers check again what they
  read, see ``reader.py``); one committed without fsync carries the boot id,
  and after a reboot its commit stamp is taken off, so every reader hashes it
  before serving it (``reconcile.py``);
- a block is recorded only after its bytes are on disk, so the index never
  claims a byte that is not there (blocks written with ``durable=False`` are
  safe against a process crash; after a reboot they are forgotten and fetched
  again, recognised by the boot id recorded with them);
- the partial file's name carries a random generation also kept in its row,
  so a row can never describe a newer file of the same digest;
- each transition (file system change + index change) leaves, between its
  two halves, only states that start-up reconciliation (``reconcile.py``,
  stat only) repairs and that every process meeting them reads right: a row
  without its file is dropped (unlinks happen under the index's write lock),
  a partial file without its row is removed (a begin checks, in its
  transaction, that the file it made beforehand is still there), a partial
  row whose file was already renamed into ``blobs/`` is promoted (and read as
  complete by :meth:`CacheTier.open_partial` meanwhile). A power loss
  with ``synchronous=NORMAL`` only loses the latest index transactions, which
  lands in one of the same cases.

Across processes: the index is shared through sqlite's own locking, blob
fetches exclude each other through a lock on one byte each of one file
(released by the kernel when a holder dies, see ``locks.py``), and holds
protecting a process's prefetch window are ignored once that process is
dead (pid + start time + boot id). Within a process, every method is
thread-safe (the async engine runs the slow ones in a thread
pool). A ``CacheTier`` must not cross a ``fork()``: each process (a data
loader worker too) opens its own, with ``reconcile=False`` if another process
of the job already reconciled.
"""

from .blob_index import SCHEMA_VERSION
from .layout import FORMAT_VERSION
from .locks import BlobLock
from .partial import PartialBlob
from .reconcile import ReconcileReport
from .records import BadBlob, BlobRecord, BlobState, CacheUsage, DatasetSummary, VerifyReport
from .tier import CacheTier

__all__ = [
    "FORMAT_VERSION",
    "SCHEMA_VERSION",
    "BadBlob",
    "BlobLock",
    "BlobRecord",
    "BlobState",
    "CacheTier",
    "CacheUsage",
    "DatasetSummary",
    "PartialBlob",
    "ReconcileReport",
    "VerifyReport",
]
