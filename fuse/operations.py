"""The FUSE request handlers (pyfuse3), and the one place stager errors become errno values.

Metadata (lookup, getattr, readdir, statfs) comes from the :class:`~fuse.tree.Tree`
alone: listing never touches the origin. ``open`` probes the cache once per
shard; ``read`` is served by the :class:`~fuse.reader.CacheReader` and feeds
the :class:`~fuse.readahead.ReadAhead`. Files are immutable, so every open
keeps the kernel's page cache (FOPEN_KEEP_CACHE) and attributes and entries
are cached by the kernel for ``timeout`` seconds.

Read-only: every request that would change something (write, create,
mkdir, unlink, rename, setattr, setxattr...) gets EROFS. (Mounted ``ro``, the
kernel already refuses most of them before they reach us.) Extended attributes
are not implemented on purpose: the kernel then stops asking, where ``ls -l``
would otherwise cost two round trips per file (ACL and security labels); nor
are flush and fsync (nothing is ever dirty), which saves a round trip per close.

Errno values, decided here and nowhere else:

- a read that cannot be served with verified bytes gets **EIO**, whatever the
  cause: the origin stayed down past the retry budget (OriginUnavailable),
  refused us (AccessDenied), no longer has the shard (ShardNotFound: EIO, not
  ENOENT, because the file does exist in the dataset; its bytes are lost), or
  serves other bytes than the manifest says (OriginChanged); or the cache
  cannot hold the blob (CacheFull, BlobTooLarge) or read it (CacheError).
  The log says which, naming the shard, the byte range and the origin error.
- unknown names: ENOENT; a file used as a directory: ENOTDIR; a directory
  opened as a file: EISDIR; a stale handle: EBADF.
- a bug (any other exception) is logged with its traceback and gets EIO: a
  handler must always answer, or the reader would hang.

On unmount (:meth:`StagerOperations.shutdown`) reads still waiting for the
origin are cancelled and answered with EIO, so the session ends at once.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import itertools
import logging
import os
import stat
from typing import Any, Awaitable, Callable, TypeVar

import pyfuse3

from stager.errors import StagerError

from .readahead import Access, ReadAhead
from .reader import CacheReader, OpenBlob
from .tree import Tree

log = logging.getLogger(__name__)

T = TypeVar("T")

BLKSIZE = 1 << 20  # st_blksize: tells cp and friends to read in large pieces
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT


def errno_for(error: BaseException) -> int:
    """The errno a FUSE request gets for ``error`` (see the module docstring)."""
    if isinstance(error, pyfuse3.FUSEError):
        return error.errno
    return errno.EIO


def _answers(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """Every handler answers: an unexpected exception is logged and becomes EIO."""

    @functools.wraps(fn)
    async def handler(*args: Any) -> T:
        try:
            return await fn(*args)
        except (pyfuse3.FUSEError, asyncio.CancelledError):
            raise
        except StagerError as exc:
            log.error("%s: %s", fn.__name__, exc)
            raise pyfuse3.FUSEError(errno_for(exc)) from None
        except Exception:
            log.exception("%s failed (a bug); answering EIO", fn.__name__)
            raise pyfuse3.FUSEError(errno.EIO) from None

    return handler


class _Handle:
    __slots__ = ("index", "blob", "access")

    def __init__(self, index: int, blob: OpenBlob) -> None:
        self.index = index
        self.blob = blob
        self.access = Access()


class StagerOperations(pyfuse3.Operations):
    """A read-only view of one dataset: the tree from its manifest, the bytes from the verified cache.

    Args:
        tree: the inode table.
        reader: serves byte ranges.
        readahead: told about every read.
        timeout: seconds the kernel may cache entries and attributes (the tree never changes).
        on_init: called once the kernel has completed the FUSE handshake (the mount is usable).
    """

    supports_dot_lookup = False
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, tree: Tree, reader: CacheReader, readahead: ReadAhead, *, timeout: float = 3600.0,
                 on_init: Callable[[], None] | None = None) -> None:
        super().__init__()
        self.tree = tree
        self.reader = reader
        self.readahead = readahead
        self.timeout = timeout
        self._uid = os.getuid()
        self._gid = os.getgid()
        self._on_init = on_init
        self._handles: dict[int, _Handle] = {}
        self._numbers = itertools.count(1)
        self._reads: set[asyncio.Task] = set()
        self._closing = False

    def init(self) -> None:
        if self._on_init is not None:
            self._on_init()

    # -- metadata: from the tree alone -----------------------------------------------------------

    def _attr(self, inode: int) -> pyfuse3.EntryAttributes:
        try:
            node = self.tree.node(inode)
        except KeyError:
            raise pyfuse3.FUSEError(errno.ENOENT) from None
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = inode
        attr.generation = 0
        attr.entry_timeout = self.timeout
        attr.attr_timeout = self.timeout
        attr.st_mode = (stat.S_IFDIR | 0o555) if node.is_dir else (stat.S_IFREG | 0o444)
        attr.st_nlink = node.nlink
        attr.st_uid = self._uid
        attr.st_gid = self._gid
        attr.st_rdev = 0
        attr.st_size = node.size
        attr.st_blksize = BLKSIZE
        attr.st_blocks = -(-node.size // 512)
        attr.st_atime_ns = node.mtime_ns
        attr.st_mtime_ns = node.mtime_ns
        attr.st_ctime_ns = node.mtime_ns
        return attr

    @_answers
    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> pyfuse3.EntryAttributes:
        inode = self.tree.lookup(parent_inode, name)
        if inode is None:
            if not self.tree.is_dir(parent_inode):
                raise pyfuse3.FUSEError(errno.ENOTDIR)
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attr(inode)

    @_answers
    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        return self._attr(inode)

    async def forget(self, inode_list: Any) -> None:
        pass  # inodes are arithmetic: nothing to free

    @_answers
    async def opendir(self, inode: int, ctx: Any) -> int:
        if not self.tree.is_dir(inode):
            raise pyfuse3.FUSEError(errno.ENOTDIR if self.tree.file_index(inode) is not None else errno.ENOENT)
        return inode

    @_answers
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        children = self.tree.children(fh)
        for position in range(start_id, len(children)):
            child = children[position]
            if not pyfuse3.readdir_reply(token, self.tree.name(child), self._attr(child), position + 1):
                break

    async def releasedir(self, fh: int) -> None:
        pass

    @_answers
    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        st = pyfuse3.StatvfsData()
        st.f_bsize = BLKSIZE
        st.f_frsize = 4096
        st.f_blocks = -(-self.tree.manifest.total_bytes // 4096)
        st.f_bfree = st.f_bavail = 0
        st.f_files = self.tree.files + self.tree.directories
        st.f_ffree = st.f_favail = 0
        st.f_namemax = 255
        return st

    @_answers
    async def access(self, inode: int, mode: int, ctx: Any) -> bool:
        if mode & os.W_OK:
            raise pyfuse3.FUSEError(errno.EROFS)
        return True

    # -- files ---------------------------------------------------------------------------------

    @_answers
    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        if flags & _WRITE_FLAGS:
            raise pyfuse3.FUSEError(errno.EROFS)
        index = self.tree.file_index(inode)
        if index is None:
            raise pyfuse3.FUSEError(errno.EISDIR if self.tree.is_dir(inode) else errno.ENOENT)
        blob = await self.reader.open(index)
        fh = next(self._numbers)
        self._handles[fh] = _Handle(index, blob)
        # Shards never change: the page cache stays valid from one open to the next.
        return pyfuse3.FileInfo(fh=fh, keep_cache=True)

    @_answers
    async def read(self, fh: int, off: int, size: int) -> bytes | bytearray | memoryview:
        handle = self._handles.get(fh)
        if handle is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        if self._closing:
            raise pyfuse3.FUSEError(errno.EIO)
        self.readahead.on_read(handle.index, handle.access, off, size)
        blob = handle.blob
        if blob.complete:  # the warm path: no task, no bookkeeping; pyfuse3 replies as soon as this returns
            return await self.reader.read(blob, off, size, replied_at_once=True)
        work = asyncio.ensure_future(self.reader.read(blob, off, size))
        self._reads.add(work)
        try:
            return await work
        except asyncio.CancelledError:
            if self._closing and work.cancelled():
                raise pyfuse3.FUSEError(errno.EIO) from None  # unmounting: answer, do not hang
            raise
        except StagerError as exc:
            log.error("read %s bytes %d-%d: %s", blob.path, off, min(off + size, blob.size), exc)
            raise pyfuse3.FUSEError(errno_for(exc)) from None
        finally:
            self._reads.discard(work)

    @_answers
    async def release(self, fh: int) -> None:
        handle = self._handles.pop(fh, None)
        if handle is not None:
            self.reader.release(handle.blob)

    def shutdown(self) -> None:
        """Unmounting: answer the reads that wait for the origin with EIO now, and any new one too."""
        self._closing = True
        for work in list(self._reads):
            work.cancel()

    # -- everything that would write -----------------------------------------------------------

    async def _refuse(self, *_: Any) -> Any:
        raise pyfuse3.FUSEError(errno.EROFS)

    setattr = mknod = mkdir = unlink = rmdir = symlink = rename = link = write = create = _refuse
    setxattr = removexattr = fsyncdir = _refuse
