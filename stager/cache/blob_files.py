"""The files of blobs being filled: their handles, each block's record, and the commit.

:class:`BlobFiles` is what a :class:`~.partial.PartialBlob` uses of the
cache: the index (a block recorded as verified, with the boot id when it was
not synced; a block another process verified), the layout (where the
complete file goes), the direct writer (``O_DIRECT`` until the filesystem
refuses it) and the table of open handles, closed with the tier. The commit
re-hashes the whole file against the blob's digest (blocks that rotted on the
disk since they were recorded are forgotten, to be fetched again), fsyncs it
(unless its blocks were recorded without fdatasync: the row then keeps the
boot id), makes it read-only and renames it into ``blobs/``, then marks it complete
in the index (a partial row whose complete file is in place counts as
committed wherever it is met, as after a crash between the two).
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from pathlib import Path

from ..diskio import fsync_dir
from ..errors import CacheCorrupt, CacheError, ManifestError
from .blob_index import BlobIndex
from .direct import DirectWriter, open_direct
from .fileio import os_error
from .layout import CacheLayout, make_shard_dir
from .partial import PartialBlob
from .reader import file_digest, stamp_checked
from .reconcile import disk_charge, repair_partial
from .records import BlobState
from .verify import check_blocks

log = logging.getLogger(__name__)


class BlobFiles:
    """Handles on the blob files of one cache directory, and what writing and committing them needs."""

    def __init__(self, index: BlobIndex, layout: CacheLayout, boot: str, *, direct_writes: bool) -> None:
        self._index = index
        self._layout = layout
        self._boot = boot
        self._directory = layout.root
        self._handles: weakref.WeakSet[PartialBlob] = weakref.WeakSet()
        self._direct: DirectWriter | None = DirectWriter() if direct_writes else None

    @property
    def directory(self) -> Path:
        return self._directory

    def handle(self, digest: str, size: int, block_size: int, gen: str | None, path: Path, fd: int,
               verified: set[int], *, writable: bool = True) -> PartialBlob:
        """A handle on the open file ``fd`` of a blob (``gen`` None: complete), kept until closed."""
        direct_fd = open_direct(path) if writable and gen is not None and self._direct is not None else None
        handle = PartialBlob(self, digest, size, block_size, gen, path, fd, verified, direct_fd)
        self._handles.add(handle)
        return handle

    def forget(self, handle: PartialBlob) -> None:
        """``handle`` was closed."""
        self._handles.discard(handle)

    def close_all(self) -> None:
        for handle in list(self._handles):
            handle.close()

    @property
    def direct(self) -> DirectWriter | None:
        """The writer of ``O_DIRECT`` pages; None once the filesystem refused one (or if turned off)."""
        return self._direct

    def refuse_direct(self) -> None:
        """The filesystem refused a direct write: every later write of this cache goes buffered."""
        if self._direct is not None:
            self._direct = None
            log.info("cache %s: the filesystem refuses O_DIRECT writes; writing through the page cache",
                     self._directory)

    def record_block(self, handle: PartialBlob, index: int, durable: bool) -> None:
        """Record block ``index`` of ``handle`` as verified (with the boot id unless ``durable``).

        Raises:
            CacheError: the partial blob was evicted, removed or restarted meanwhile.
        """
        gen = handle.gen
        if gen is None:
            return
        if not self._index.record_block(handle.digest, gen, index, None if durable else self._boot):
            raise CacheError(f"blob {handle.digest}: the partial blob was evicted, removed or restarted "
                             "while being written; begin() it again")

    def is_verified(self, digest: str, gen: str, index: int) -> bool:
        """Whether the index has block ``index`` of generation ``gen`` verified (maybe by another process)."""
        return self._index.is_verified(digest, gen, index)

    def commit(self, handle: PartialBlob, fd: int, gen: str) -> Path:
        """Commit ``handle`` (its file ``fd``, generation ``gen``): see :meth:`PartialBlob.commit`."""
        digest = handle.digest
        if self._index.state(digest) is BlobState.COMPLETE:
            return self._layout.complete_path(digest)  # another handle committed it
        missing = handle.block_count - self._index.verified_count(digest)
        if missing:
            raise CacheError(f"blob {digest}: cannot commit, {missing} of {handle.block_count} blocks "
                             "are not verified")
        self._check_before_commit(handle, fd, gen)
        dest = self._layout.complete_path(digest)
        row = self._index.get(digest)
        if row is not None and row.state is BlobState.COMPLETE:
            return dest  # another handle committed it
        if row is None or row.gen != gen:
            raise _gone_before_commit(digest)
        # A blob whose blocks were recorded without fdatasync (durable=False) is committed without an
        # fsync too: it stays marked with this boot, like its blocks were, and the kernel writes it back
        # in its own time. Waiting for the disk here made a slow disk the pace of every stage.
        synced = row.volatile_boot != self._boot
        try:
            if synced:
                os.fsync(fd)
            os.fchmod(fd, 0o444)  # before the rename: a file under blobs/ is never writable
            make_shard_dir(self._layout, digest)
        except OSError as exc:
            self._restore_writable(fd)
            raise os_error(exc, f"committing blob {digest}") from exc
        # The rename and the directory's fsync happen before the transaction that records them, so
        # other blobs' begins and commits do not wait for this file system work: a partial row whose
        # file is complete under blobs/ is what a crash here leaves too, and any process that meets it
        # (reconcile, open_partial, a resume) takes it for committed. Holding the blob's lock, no
        # other process fills or commits this blob meanwhile; one that removes it is seen below.
        try:
            os.rename(self._layout.partial_path(digest, gen), dest)
        except FileNotFoundError:
            # Renamed by an earlier commit() that failed after it: repairing promotes it.
            with self._index.write():
                row = self._index.get(digest)
                if row is not None and row.state is BlobState.COMPLETE:
                    return dest
                if row is None or row.gen != gen:
                    raise _gone_before_commit(digest) from None
                repaired = repair_partial(self._index, self._layout, row, self._boot)
                if repaired is None or repaired.state is not BlobState.COMPLETE:
                    raise CacheError(f"blob {digest}: the partial file vanished before its commit; "
                                     "begin() it again") from None
            return dest
        except OSError as exc:
            self._restore_writable(fd)
            raise os_error(exc, f"committing blob {digest}") from exc
        try:
            if synced:
                fsync_dir(dest.parent)
            with self._index.write():
                row = self._index.get(digest)
                if row is not None and row.state is BlobState.COMPLETE:
                    return dest  # promoted by another process's reconcile meanwhile
                if row is None or row.gen != gen:
                    _unlink_quietly(dest)  # removed meanwhile; the file is this handle's (its lock)
                    raise CacheError(f"blob {digest}: the partial blob was removed during its commit; "
                                     "begin() it again")
                self._index.mark_complete(digest, disk_charge(os.fstat(fd), row.charged), time.time(),
                                          None if synced else self._boot)
        except OSError as exc:
            if isinstance(exc, CacheError):
                raise
            raise os_error(exc, f"committing blob {digest}") from exc
        return dest

    def _check_before_commit(self, handle: PartialBlob, fd: int, gen: str) -> None:
        """Re-hash the whole partial file against the blob's digest: a block recorded as verified may
        have rotted on the disk since (or been written over). The bad blocks are forgotten, so the
        next fetch brings them again, and :class:`CacheCorrupt` names them.

        Raises:
            CacheCorrupt: the file does not hash to the digest (bad blocks forgotten).
            ManifestError: every block matches its digest but the whole file does not match the
                blob's: the manifest's digests disagree with each other.
            CacheError: a read error.
        """
        digest = handle.digest
        try:
            actual = file_digest(fd, handle.size, drop_cache=handle.writes_direct)
        except OSError as exc:
            if isinstance(exc, CacheError):
                raise
            raise os_error(exc, f"re-reading blob {digest} before its commit") from exc
        if actual == digest:
            stamp_checked(fd)  # readers may take its pages in the page cache as they are (see reader.py)
            return
        row = self._index.get(digest)
        if row is None or row.gen != gen:
            raise _gone_before_commit(digest)
        try:
            bad, _ = check_blocks(self._layout.partial_path(digest, gen), row.size, row.block_size,
                                  row.block_digests)
        except OSError as exc:
            raise os_error(exc, f"re-reading blob {digest} before its commit") from exc
        if not bad:
            raise ManifestError(f"blob {digest}: every block matches the manifest's block digests but the "
                                "whole file does not match the blob digest; the manifest is inconsistent")
        self._index.forget_blocks(digest, bad)
        handle.forget_blocks(bad)
        log.warning("cache %s: blob %s: %d verified block(s) changed on disk before the commit (%s); "
                    "they are fetched again", self._directory, digest, len(bad), ", ".join(map(str, bad[:8])))
        raise CacheCorrupt(f"blob {digest}: block(s) {', '.join(map(str, bad[:8]))} changed on the cache disk "
                           "after they were verified; not committed, they must be fetched again", tuple(bad))

    @staticmethod
    def _restore_writable(fd: int) -> None:
        try:
            os.fchmod(fd, 0o644)
        except OSError:
            pass


def _gone_before_commit(digest: str) -> CacheError:
    return CacheError(f"blob {digest}: the partial blob was evicted or removed before its commit; begin() it again")


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
