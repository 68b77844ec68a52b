"""A blob being filled, block by block, then committed: :class:`PartialBlob`.

Each block is written at ``index * block_size`` (its whole pages with
``O_DIRECT`` where the filesystem allows, see :mod:`.direct`), made durable
with ``fdatasync`` (unless the caller opts out) and only then recorded as
verified in the index, so the index never claims a byte that is not on disk.
Threads may write different blocks of one blob at once. ``commit`` re-hashes
the whole file against the blob's digest (a verified block may have changed on
the disk since; it is then forgotten, to be fetched again), fsyncs the file
(unless its blocks were recorded without fdatasync), makes it read-only and
renames it into ``blobs/`` before the index transaction that marks it
complete.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from ..diskio import write_in_pieces
from ..errors import CacheError
from ..hashing import block_count, block_range
from .direct import DirectRefused
from .fileio import os_error, pread_exact

if TYPE_CHECKING:
    from .blob_files import BlobFiles


class PartialBlob:
    """A handle on one blob while it is being filled (also given for a blob already complete).

    ``verified`` is the set of blocks on disk and verified, which a restarted
    process does not fetch again. For a blob that is already complete, every
    block is verified, writes are no-ops and :meth:`commit` returns its path.
    Close it when done (or use it as a context manager).
    """

    def __init__(self, files: "BlobFiles", digest: str, size: int, block_size: int, gen: str | None,
                 path: Path, fd: int, verified: set[int], direct_fd: int | None = None) -> None:
        self._files = files
        self.digest = digest
        self.size = size
        self.block_size = block_size
        self.block_count = block_count(size, block_size)
        self._gen = gen  # None: the blob is complete
        self.path = path
        self._fd: int | None = fd
        self._direct_fd = direct_fd  # O_DIRECT, for the aligned pages of writes (None: all buffered)
        self._verified = verified
        self._lock = threading.Lock()

    # -- state --------------------------------------------------------------------------------

    @property
    def complete(self) -> bool:
        """Whether the blob is complete (committed now or before)."""
        return self._gen is None

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (the handle's file is closed)."""
        return self._fd is None

    @property
    def gen(self) -> str | None:
        """The generation of the partial file (None once the blob is complete)."""
        return self._gen

    @property
    def writes_direct(self) -> bool:
        """Whether whole pages of writes go ``O_DIRECT`` (past the page cache)."""
        return self._direct_fd is not None

    @property
    def verified(self) -> frozenset[int]:
        """Indexes of the blocks on disk and verified."""
        with self._lock:
            return frozenset(self._verified)

    def missing_blocks(self) -> list[int]:
        """Indexes of the blocks still to write, in order."""
        with self._lock:
            return [i for i in range(self.block_count) if i not in self._verified]

    def block_range(self, index: int) -> tuple[int, int]:
        """The ``[start, end)`` byte range of block ``index``."""
        self._check_index(index)
        return block_range(index, self.size, self.block_size)

    def _check_index(self, index: int) -> None:
        if not 0 <= index < self.block_count:
            raise ValueError(f"blob {self.digest}: block {index} out of range (it has {self.block_count})")

    def _require_fd(self) -> int:
        fd = self._fd
        if fd is None:
            raise CacheError(f"blob {self.digest}: the partial blob handle is closed")
        return fd

    # -- writing ------------------------------------------------------------------------------

    def write_block(self, index: int, data: bytes | bytearray | memoryview, *, durable: bool = True) -> None:
        """Write block ``index`` (already verified by the caller) and record it as verified.

        With ``durable`` the bytes are fdatasync'ed before the index records
        them (safe against power loss); without, they are safe against a
        process crash, and a reboot forgets them (see the package docstring).
        A block already verified is not written again.

        Raises:
            ValueError: ``index`` out of range, or ``data`` not the block's length.
            CacheFull: the disk is full (the block is not recorded).
            CacheError: the partial blob was evicted or removed meanwhile, or an I/O error.
        """
        start, end = self.block_range(index)
        length = memoryview(data).nbytes
        if length != end - start:
            raise ValueError(f"blob {self.digest}: block {index} must be {end - start} bytes, got {length}")
        self.write_into_block(index, start, [data])
        self.mark_verified(index, durable=durable)

    def write_into_block(self, index: int, offset: int, buffers: Sequence[bytes | bytearray | memoryview]) -> None:
        """Write ``buffers`` at ``offset`` of the blob, inside block ``index``, without recording anything.

        For a block that streams in: its bytes are written as they arrive and
        count for nothing until :meth:`mark_verified` (a crash before leaves
        bytes the index does not claim, fetched again). A block already
        verified is never written over.

        Raises:
            ValueError: the bytes reach outside block ``index``.
            CacheFull: the disk is full.
            CacheError: the partial blob was evicted or removed meanwhile, or an I/O error.
        """
        start, end = self.block_range(index)
        length = sum(memoryview(b).nbytes for b in buffers)
        if not start <= offset <= offset + length <= end:
            raise ValueError(f"blob {self.digest}: bytes [{offset}, {offset + length}) are not inside block {index} "
                             f"[{start}, {end})")
        with self._lock:
            if index in self._verified:
                return
        fd = self._require_fd()
        try:
            direct_fd = self._direct_fd
            if direct_fd is not None and (writer := self._files.direct) is not None:
                try:
                    writer.write(direct_fd, fd, [memoryview(b).cast("B") for b in buffers], offset)
                    return
                except DirectRefused:
                    self._files.refuse_direct()
            write_in_pieces(fd, buffers, offset)
        except OSError as exc:
            raise os_error(exc, f"writing block {index} of blob {self.digest} in {self._files.directory}") from exc

    def write_verified(self, index: int, offset: int, buffers: Sequence[bytes | bytearray | memoryview], *,
                       durable: bool = True) -> None:
        """:meth:`write_into_block` then :meth:`mark_verified`: the last bytes of a block the caller verified."""
        self.write_into_block(index, offset, buffers)
        self.mark_verified(index, durable=durable)

    def mark_verified(self, index: int, *, durable: bool = True) -> None:
        """Record block ``index``, whose bytes the caller wrote and verified, as verified.

        With ``durable`` the file is fdatasync'ed first (see :meth:`write_block`).

        Raises:
            CacheFull, CacheError: as :meth:`write_block`.
        """
        self._check_index(index)
        with self._lock:
            if index in self._verified:
                return
        fd = self._require_fd()
        if durable:
            try:
                os.fdatasync(fd)
            except OSError as exc:
                raise os_error(exc, f"syncing block {index} of blob {self.digest} in {self._files.directory}") from exc
        self._files.record_block(self, index, durable)
        with self._lock:
            self._verified.add(index)

    def read_block(self, index: int) -> bytes:
        """The bytes of block ``index``, which must be verified (here or by another process).

        Raises:
            CacheError: the block is not verified, or an I/O error.
        """
        start, end = self.block_range(index)
        with self._lock:
            known = index in self._verified
        if not known:
            if self._gen is None or not self._files.is_verified(self.digest, self._gen, index):
                raise CacheError(f"blob {self.digest}: block {index} is not verified in the cache")
            with self._lock:
                self._verified.add(index)
        fd = self._require_fd()
        try:
            return pread_exact(fd, end - start, start)
        except OSError as exc:
            raise os_error(exc, f"reading block {index} of blob {self.digest}") from exc

    def commit(self) -> Path:
        """Make the blob complete: re-hash the whole file, fsync (unless its blocks were recorded
        without fdatasync), read-only, atomic rename into ``blobs/``; returns its path.

        The re-hash (xxh3-128 of the whole file against the blob's digest) catches a
        verified block that changed on disk since it was written: such blocks are
        forgotten (:attr:`verified` loses them) and nothing is committed.

        Raises:
            CacheCorrupt: a verified block changed on disk (it is forgotten: write it again).
            ManifestError: the blocks match their digests but the whole file does not match the blob's.
            CacheError: blocks are missing, the blob was evicted or removed, or an I/O error.
        """
        if self._gen is None:
            return self.path
        fd = self._require_fd()
        path = self._files.commit(self, fd, self._gen)
        self._gen = None
        self._close_direct()
        self.path = path
        with self._lock:
            self._verified = set(range(self.block_count))
        return path

    def forget_blocks(self, indexes: Sequence[int]) -> None:
        """Blocks found bad on disk (the tier forgot them in the index): to be written again."""
        with self._lock:
            self._verified.difference_update(indexes)

    def close(self) -> None:
        """Release the file handle (the partial blob stays in the cache, resumable)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            self._close_direct()
            os.close(fd)
            self._files.forget(self)

    def _close_direct(self) -> None:
        direct_fd, self._direct_fd = self._direct_fd, None
        if direct_fd is not None:
            os.close(direct_fd)

    def __enter__(self) -> "PartialBlob":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "complete" if self.complete else f"{len(self._verified)}/{self.block_count} blocks"
        return f"PartialBlob({self.digest}, {state})"
