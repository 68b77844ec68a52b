"""Reading bytes back from cache files, checked against their digests before anyone is served them.

The cache does not trust its own disk. Bytes were verified when they arrived,
but a disk (or a person, or a bug elsewhere) can change them later; a file
under ``blobs/`` proves that its bytes *were* right, not that they still are.
So every reader of a cache file goes through this module, which hashes what
it reads before handing it out:

- a commit re-hashes the whole partial file (xxh3-128, the blob's own digest)
  before the rename into ``blobs/`` (:func:`file_digest`, used by the tier);
- the iterator maps a whole shard and hashes the map before any sample is
  cut from it (:meth:`VerifiedReads.map_blob`): the hash pass is also the
  pass that faults the pages in, which the samples would otherwise pay;
- the mount hashes each block (xxh3-64, the manifest's block digest) the
  first time the kernel asks for it (:meth:`VerifiedReads.check_block`).

"First time" is per process and per file: a :class:`VerifiedReads` keeps the
identities (device, inode) of the files, and for the mount the blocks, this
process already checked, so re-maps and re-reads do not hash again. A file
that is dropped and fetched again is a new inode, checked anew.

What is checked is what comes from the *disk*. Re-hashing a shard that is
already in the page cache, in every new process (each epoch of a job that
restarts, every benchmark run), would cost as much as reading it: for a warm
shard, the hash pass was most of the price of mapping it. So the iterator
skips the hash of a file whose every page is in the page cache (``mincore``)
and which was not written to since its commit checked it: the commit stamps
the file's mtime (a fixed nanoseconds field, :func:`stamp_checked`), and any
write through the file system moves the mtime off the stamp. Those bytes are
the ones the commit hashed (or, brought in from the disk later, by a reader
that checked them). Rot on the disk reaches a reader only through a read from
the disk, which the first map of a non-resident file in each process hashes.
What stays unchecked: pages evicted and read from the disk again while a
process that already checked the file keeps it mapped, or by a tool reading
the cache files directly; ``stager verify`` scrubs those. A file committed
without fsync keeps its stamp only within its boot: after a reboot the
cache's start-up takes it off (``reconcile.py``), since the disk may not hold
all it was, and every reader hashes it.

The policy is ``CacheConfig.verify_reads``: ``"first"`` (the default) as
above, ``"off"`` trusts the disk (the commit check stays). A mismatch raises
:class:`~stager.errors.CacheCorrupt`; the caller drops the bad blob or blocks
through :meth:`CacheTier.drop_corrupt` and has them fetched again, or fails
the read: a wrong byte is never handed out.

xxh3 hashes at several GB/s a core, so checking once per process costs a
small share of reading the bytes at all (see the README for measured costs).
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import xxhash

from ..errors import CacheCorrupt, CacheError
from .fileio import os_error

if TYPE_CHECKING:
    from .tier import CacheTier

log = logging.getLogger(__name__)

#: The nanoseconds of a committed file's mtime, set by the commit once it hashed the whole file. Any
#: later write sets the mtime to the clock; a file system without nanosecond times cannot keep it (its
#: files are then always hashed). Not a multiple of a microsecond, so no coarse clock lands on it.
STAMP_NS = 271_828_183
#: Bytes of a file re-hashed (and resident in this process) at a time; a multiple of every page size.
REHASH_WINDOW = 8 << 20
_HASH_CHUNK = 64 * 1024 * 1024  # bytes per hash update over a map (lets other threads run in between)

FileIdentity = tuple[int, int]  # (st_dev, st_ino): one cache file, even after a rename into blobs/


def file_digest(fd: int, size: int, *, drop_cache: bool = False) -> str:
    """The xxh3-128 (hex) of the first ``size`` bytes of the open file ``fd``.

    Hashed through a read-only map, sequentially: no copy into a buffer, which
    cost several times the hash itself (measured). The map is hashed in windows
    of :data:`REHASH_WINDOW`, and each window's pages leave this process once
    hashed (``MADV_DONTNEED`` on the map), so the resident memory it costs is a
    window, not the file: the engine re-hashes several blobs at once before
    their commits, and whole-file maps of them once made up a third of its peak
    RSS (measured). ``drop_cache`` also asks the kernel to drop each window from
    the page cache, for files written past it (``O_DIRECT``) that nobody will
    read soon.

    Raises:
        CacheError: the file cannot be mapped or is shorter than ``size``.
    """
    if size == 0:
        return xxhash.xxh3_128_hexdigest(b"")
    if os.fstat(fd).st_size < size:
        raise CacheError(f"the file is {os.fstat(fd).st_size} bytes, shorter than its {size} bytes")
    try:
        mapped = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise os_error(exc, "mapping a cache file to hash it") from exc
    try:
        if hasattr(mmap, "MADV_SEQUENTIAL"):
            mapped.madvise(mmap.MADV_SEQUENTIAL)
        hasher = xxhash.xxh3_128()
        view = memoryview(mapped)
        try:
            for start in range(0, size, REHASH_WINDOW):
                length = min(REHASH_WINDOW, size - start)
                hasher.update(view[start:start + length])
                _forget_window(mapped, fd, start, length, drop_cache)
        finally:
            view.release()
    finally:
        mapped.close()
    return hasher.hexdigest()


def _forget_window(mapped: mmap.mmap, fd: int, start: int, length: int, drop_cache: bool) -> None:
    """Unmap a hashed window's pages from this process (and, with ``drop_cache``, from the page cache)."""
    advice = getattr(mmap, "MADV_DONTNEED", None)
    try:
        if advice is not None:
            mapped.madvise(advice, start, length)
        if drop_cache and hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, start, length, os.POSIX_FADV_DONTNEED)
    except (OSError, ValueError):
        pass  # only memory is at stake: the bytes hashed are what they are


def stamp_checked(fd: int) -> None:
    """Stamp a file whose whole bytes were just hashed good: its mtime's nanoseconds become STAMP_NS.

    Best effort: a file system that refuses leaves the file unstamped, and readers then hash it.
    """
    try:
        st = os.fstat(fd)
        os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns // 1_000_000_000 * 1_000_000_000 + STAMP_NS))
    except OSError:
        pass


def clear_stamp(path: str | os.PathLike[str]) -> bool:
    """Take a file's commit stamp off (its mtime moves a nanosecond), so every reader hashes it again;
    whether the file is now unstamped (False: it could not be changed, e.g. another user's file)."""
    try:
        st = os.stat(path, follow_symlinks=False)
        if stamp_intact(st):
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1), follow_symlinks=False)
    except OSError:
        return False
    return True


def stamp_intact(st: os.stat_result) -> bool:
    """Whether nothing was written to the file since its commit stamped it."""
    return st.st_mtime_ns % 1_000_000_000 == STAMP_NS


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)  # the process's own symbols, libc's among them (see fileio.py)
    except OSError:
        return None


_LIBC = _libc()  # read-only after import: the library handle, not state


_RESIDENT = bytes(i for i in range(256) if i & 1)  # mincore's vector bytes of a page in memory


def fully_resident(fd: int, size: int) -> bool:
    """Whether every page of the file's first ``size`` bytes is in the page cache (mincore(2) on a
    private map, which faults nothing in); False where that cannot be asked."""
    if _LIBC is None or size == 0:
        return False
    try:
        mapped = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
    except OSError:
        return False
    try:
        vec = (ctypes.c_ubyte * (-(-size // mmap.PAGESIZE)))()
        anchor = ctypes.c_char.from_buffer(mapped)
        try:
            if _LIBC.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(size), vec) != 0:
                return False
        finally:
            del anchor  # a map cannot close while a ctypes view of it lives
        return not bytes(vec).translate(None, _RESIDENT)
    finally:
        mapped.close()


def buffer_digest(data: bytes | bytearray | memoryview) -> str:
    """The xxh3-128 (hex) of a buffer (a memory map: hashed in pieces, so other threads get the GIL)."""
    view = memoryview(data).cast("B")
    if len(view) <= _HASH_CHUNK:
        return xxhash.xxh3_128_hexdigest(view)
    hasher = xxhash.xxh3_128()
    for start in range(0, len(view), _HASH_CHUNK):
        hasher.update(view[start:start + _HASH_CHUNK])
    return hasher.hexdigest()


def prefer_large_pages(mapped: "mmap.mmap | None") -> None:
    """Let page faults on this map bring the file into the page cache in huge pages.

    The cache may write blobs past the page cache (``O_DIRECT``), so the first
    reader of a blob brings it in, through this map's page faults. Brought in
    that way it lands in small pages, and every later process mapping the file
    slices samples out of it up to 1.5x slower (measured) than out of a file
    brought in by a read or a write. With ``MADV_HUGEPAGE`` the faults read
    ahead in 2 MiB pages instead. Where the kernel declines (no transparent
    huge pages), nothing changes.
    """
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if mapped is None or advice is None:
        return
    try:
        mapped.madvise(advice)
    except (OSError, ValueError):
        pass


class VerifiedReads:
    """What this process has checked of the cache's files, and the checks themselves. Thread-safe.

    Args:
        level: ``"first"`` (check each file or block the first time this
            process reads it) or ``"off"`` (trust the disk).
    """

    def __init__(self, level: str = "first") -> None:
        self.enabled = level != "off"
        self._lock = threading.Lock()
        self._files: set[FileIdentity] = set()  # whole files checked
        self._blocks: dict[FileIdentity, set[int]] = {}  # blocks checked, per file
        self.files_checked = 0  # counters, for stats and tests
        self.files_resident = 0  # files taken unhashed: all in the page cache, unchanged since their commit
        self.blocks_checked = 0
        self.bytes_checked = 0
        self.mismatches = 0

    # -- whole files (the iterator) ------------------------------------------------------------

    def map_blob(self, path: Path, digest: str, size: int) -> tuple[memoryview | bytes, FileIdentity]:
        """A read-only map of the complete blob file at ``path``, checked against ``digest`` unless this
        process already checked that file, or the file is all in the page cache and unchanged since its
        commit checked it (see the module docstring); and the file's identity.

        Raises:
            FileNotFoundError: the file is gone (evicted or dropped meanwhile).
            CacheCorrupt: the file is not ``size`` bytes, or its bytes do not hash to ``digest``
                (``identity`` set; nothing is dropped here).
            CacheError: another I/O error.
        """
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            if isinstance(exc, FileNotFoundError):
                raise  # evicted or dropped meanwhile: the caller asks again
            raise os_error(exc, f"opening blob {digest}") from exc
        try:
            st = os.fstat(fd)
            identity = (st.st_dev, st.st_ino)
            if st.st_size != size:
                self._mismatch()
                raise CacheCorrupt(f"blob {digest} in the cache is {st.st_size} bytes, not {size}",
                                   identity=identity)
            if size == 0:
                return b"", identity
            checking = self.enabled and not self.file_checked(identity)
            # In the page cache, as the commit checked it: nothing of it would come from the disk.
            resident = checking and stamp_intact(st) and fully_resident(fd, size)
            try:
                mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            except OSError as exc:
                raise os_error(exc, f"mapping blob {digest}") from exc
        finally:
            os.close(fd)  # the map keeps the file
        prefer_large_pages(mapped)
        view = memoryview(mapped)
        if resident:
            with self._lock:
                self._files.add(identity)
                self.files_resident += 1
        elif checking:
            if buffer_digest(view) != digest:
                self._mismatch()
                view.release()
                mapped.close()
                raise CacheCorrupt(f"blob {digest} changed on the cache disk since it was verified "
                                   f"(its bytes no longer hash to its digest)", identity=identity)
            with self._lock:
                self._files.add(identity)
                self.files_checked += 1
                self.bytes_checked += size
        return view, identity

    def file_checked(self, identity: FileIdentity) -> bool:
        """Whether this process already checked the whole file."""
        with self._lock:
            return identity in self._files

    # -- blocks (the mount) --------------------------------------------------------------------

    def block_checked(self, identity: FileIdentity, index: int) -> bool:
        """Whether block ``index`` of the file (or the whole file) was checked by this process."""
        if not self.enabled:
            return True
        with self._lock:
            if identity in self._files:
                return True
            blocks = self._blocks.get(identity)
            return blocks is not None and index in blocks

    def check_block(self, identity: FileIdentity, index: int, data: bytes | bytearray | memoryview,
                    expected: int, block_count: int) -> bool:
        """Hash ``data`` (all of block ``index``, read from the file) against the manifest's ``expected``
        xxh3-64; True and remembered if it matches. Once every one of the file's ``block_count`` blocks
        is checked, the whole file counts as checked."""
        if not self.enabled:
            return True
        if xxhash.xxh3_64_intdigest(data) != expected:
            self._mismatch()
            return False
        with self._lock:
            blocks = self._blocks.setdefault(identity, set())
            blocks.add(index)
            self.blocks_checked += 1
            self.bytes_checked += memoryview(data).nbytes
            if len(blocks) >= block_count:
                self._files.add(identity)
                del self._blocks[identity]
        return True

    def forget(self, identity: FileIdentity, blocks: list[int] | None = None) -> None:
        """Forget checks of a file (or of some of its blocks), e.g. once it was found bad."""
        with self._lock:
            if blocks is None:
                self._files.discard(identity)
                self._blocks.pop(identity, None)
            elif identity in self._blocks:
                self._blocks[identity].difference_update(blocks)

    def _mismatch(self) -> None:
        with self._lock:
            self.mismatches += 1

    def stats(self) -> dict[str, int]:
        """Files and blocks checked, bytes hashed, mismatches found by this process."""
        with self._lock:
            return {"read_checks_files": self.files_checked, "read_checks_resident": self.files_resident,
                    "read_checks_blocks": self.blocks_checked,
                    "read_checks_bytes": self.bytes_checked, "read_checks_failed": self.mismatches}


@dataclass(frozen=True, slots=True)
class CacheFile:
    """A read-only descriptor on a blob's cache file (the caller closes it), whether the file is complete,
    and the blocks verified in it when it is partial."""

    fd: int
    complete: bool
    verified: frozenset[int]


class BlockReads:
    """One block's verified bytes out of a cache directory, for the engine, the daemon's client and the mount.

    The complete-file probe (a file under ``blobs/`` is complete: no index look-up needed), a block read
    back from a complete file or from a partial one (its verified blocks), each hashed against the
    manifest's block digest before it is handed out, and the retry when the file is evicted under the
    reader. A block that changed on the disk since it was verified is dropped through the cache's API
    (the whole blob if complete, that block if partial), so it is fetched again; never served. Readers
    that keep a blob's file open and check its blocks themselves (the mount) take the open file from
    :meth:`open_complete` or :meth:`open_any` and report bad bytes to :meth:`drop`.

    Args:
        complete_path: where a blob's complete file is (``CacheTier.complete_path`` or the layout's).
        tier: the cache tier that opens partial files and drops bad bytes (called when first needed: a
            consumer of the daemon opens its read-only view of the index only then).
        on_corrupt: called with the digest each time a block read back did not match.
    """

    #: reads of a block whose blob is evicted under the reader, again and again, before giving up
    ATTEMPTS = 4

    def __init__(self, complete_path: Callable[[str], Path], tier: Callable[[], CacheTier], *,
                 on_corrupt: Callable[[str], None] | None = None) -> None:
        self._complete_path = complete_path
        self._tier = tier
        self._on_corrupt = on_corrupt

    def complete(self, digest: str) -> Path | None:
        """The blob's complete (verified) file, or None if it is not complete in the cache now."""
        path = self._complete_path(digest)
        return path if path.exists() else None

    def open_complete(self, digest: str) -> int | None:
        """A read-only descriptor on the blob's complete file (the caller closes it), or None if it is not
        complete now. One open(2) and no index look-up: cheap enough for an event loop."""
        try:
            return os.open(self._complete_path(digest), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None

    def open_any(self, digest: str) -> CacheFile | None:
        """The blob's cache file as the index has it, complete or partial with its verified blocks; again
        while the file is committed (renamed) or evicted between the look-up and the open; None if the
        cache does not have the blob (blocking: call in a thread).

        Raises:
            CacheError: the cache index cannot be read, or the file cannot be opened.
        """
        tier = self._tier()
        for _ in range(self.ATTEMPTS):
            handle = tier.open_partial(digest)
            if handle is None:
                return None
            try:
                complete, verified, path = handle.complete, handle.verified, handle.path
            finally:
                handle.close()
            try:
                return CacheFile(os.open(path, os.O_RDONLY | os.O_CLOEXEC), complete, verified)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise os_error(exc, f"opening blob {digest}") from exc
        return None

    def read_complete(self, digest: str, path: Path, start: int, end: int, expected: int) -> bytes | None:
        """Bytes ``[start, end)`` (one block) of the complete file at ``path``, checked against the
        block's xxh3-64 ``expected`` (blocking: call in a thread); None if the file is gone, or changed
        on the disk (then the blob is dropped, to be fetched again)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            data = os.pread(fd, end - start, start)
            if len(data) == end - start and xxhash.xxh3_64_intdigest(data) == expected:
                return data
            st = os.fstat(fd)
        finally:
            os.close(fd)
        self.drop(digest, (st.st_dev, st.st_ino))
        return None

    def read_verified(self, digest: str, block: int, expected: int) -> bytes | None:
        """A verified block of a blob that may still be partial (complete ones too: the open file
        survives eviction), checked against ``expected`` (blocking: call in a thread); None if the blob
        went away meanwhile (evicted, or dropped and begun again) or the block changed on the disk (then
        it is dropped, to be fetched again)."""
        tier = self._tier()
        handle = tier.open_partial(digest)
        if handle is None:
            return None
        try:
            data = handle.read_block(block)
            if xxhash.xxh3_64_intdigest(data) == expected:
                return data
            st = os.stat(handle.path)
            bad = None if handle.complete else [block]
        except (CacheError, FileNotFoundError):
            return None
        finally:
            handle.close()
        self.drop(digest, (st.st_dev, st.st_ino), bad, where=f" block {block}")
        return None

    async def read(self, digest: str, block: int, start: int, end: int, expected: int,
                   fetch: Callable[[], Awaitable[bytes | Path | None]],
                   in_thread: Callable[..., Awaitable[Any]], *, what: str) -> bytes:
        """The verified bytes of one block: from the complete file when there is one, else from what
        ``fetch()`` brings (the bytes themselves; the path of the complete file; or None: verified in the
        cache's files now), again while the blob is evicted under the reader.

        Args:
            in_thread: runs a blocking read off the event loop (``in_thread(fn, *args)``).
            what: names the block in the error.

        Raises:
            CacheError: the block kept being evicted before it could be read.
            whatever ``fetch`` raises.
        """
        for _ in range(self.ATTEMPTS):
            path = self.complete(digest)
            if path is not None:
                data = await in_thread(self.read_complete, digest, path, start, end, expected)
                if data is not None:
                    return data
                continue  # evicted between the probe and the open, or dropped as bad: ask again
            found = await fetch()
            if isinstance(found, Path):
                data = await in_thread(self.read_complete, digest, found, start, end, expected)
            elif found is None:
                data = await in_thread(self.read_verified, digest, block, expected)
            else:
                data = found
            if data is not None:
                return data  # else gone, or changed on the disk and dropped: fetched again
        raise CacheError(f"{what} kept being evicted from the cache before it could be read; "
                         "the cache is too small for its readers")

    def drop(self, digest: str, identity: FileIdentity, blocks: list[int] | None = None, *, where: str = "") -> None:
        """Bytes of the file ``identity`` no longer match their digest: drop the blob (or those ``blocks`` of
        a partial one) through the cache's API, so they are fetched again (blocking: call in a thread)."""
        log.warning("blob %s%s changed on the cache disk since it was verified; dropping it", digest, where)
        if self._on_corrupt is not None:
            self._on_corrupt(digest)
        self._tier().drop_corrupt(digest, identity, blocks)
