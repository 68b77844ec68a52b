"""A store over a local or mounted directory (bare paths and ``file://`` URLs).

Reads are ``os.pread`` calls in a bounded thread pool: no file objects, no
buffering, one allocation per range, and the event loop never blocks on a
stalled mount. Writes go to a hidden temporary file in the target's own
directory (``.NAME.stager-tmp-XXXX``), are fsynced, then renamed over the
target with ``os.replace`` and the directory fsynced, so a reader sees the
old file or the new one, never a partial one. :meth:`LocalStore.list` hides
such temporary files. Shared file systems stall and fail (EIO, ESTALE,
ETIMEDOUT); those errors are retried like network errors.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import stat
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, AsyncIterator, Callable, Mapping, TypeVar

from ..diskio import fsync_dir, pread_upto, write_in_pieces
from ..errors import ShardNotFound, TransientOriginError
from .base import Check, InvalidRange, ObjectInfo, Store, Upload, run_check, validate_path, validate_range
from .parts import PartLedger
from .options import StoreOptions
from .translate import translated

T = TypeVar("T")

#: Marks our temporary files; :meth:`LocalStore.list` skips names containing it.
TMP_MARKER = ".stager-tmp-"


def path_from_url(url: str) -> str:
    """The absolute directory for a bare path or a ``file://`` URL."""
    path = url
    if path.startswith("file://"):
        path = path[len("file://"):]
        if path.startswith("localhost/"):
            path = path[len("localhost"):]
    return os.path.abspath(os.path.expanduser(path))


class LocalStore(Store):
    """A :class:`~stager.store.base.Store` over the directory ``root``.

    Args:
        root: a directory path or ``file://`` URL; it need not exist before the first write.
        options: retry, bandwidth, stats and concurrency (the threads doing file I/O; see
            :class:`~stager.store.options.StoreOptions`).
        durable: fsync files and directories on write (turn off only in tests).
    """

    def __init__(self, root: str, *, options: StoreOptions = StoreOptions(), durable: bool = True) -> None:
        self.root = path_from_url(root)
        self.options = options
        self.stats, self.retry, self.bandwidth = options.machinery()
        self.durable = durable
        self._executor = ThreadPoolExecutor(max_workers=options.concurrency, thread_name_prefix="stager-local")

    @property
    def url(self) -> str:
        return "file://" + self.root

    def _full(self, path: str) -> str:
        return os.path.join(self.root, *validate_path(path).split("/"))

    async def _io(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, partial(fn, *args))

    async def _run(self, fn: Callable[..., T], *args: Any, what: str) -> T:
        async def attempt() -> T:
            with translated(what):
                return await self._io(fn, *args)

        return await self.retry.run(attempt, what=what)

    async def list(self) -> list[ObjectInfo]:
        return await self._run(_walk, self.root, what=self.url)

    async def scan(self) -> AsyncIterator[list[ObjectInfo]]:
        # One directory per page, depth first, so only the pending directory names are held.
        pending = [""]
        while pending:
            rel = pending.pop()
            files, dirs = await self._run(_scan_dir, self.root, rel, what=self.url)
            pending.extend(reversed(dirs))
            if files:
                yield files

    async def info(self, path: str) -> ObjectInfo:
        full = self._full(path)
        return await self._run(_stat_file, full, path, what=path)

    async def read_range(self, path: str, start: int, end: int, *, check: Check | None = None) -> bytes:
        full = self._full(path)
        validate_range(path, start, end)
        what = f"{path} [{start}, {end})"

        async def attempt() -> bytes:
            await self._pace(end - start)
            with translated(what):
                data = await self._io(_pread, full, start, end, what)
            self.stats.bytes_read += len(data)
            if len(data) != end - start:
                raise TransientOriginError(f"{what}: read {len(data)} bytes, expected {end - start} (file changing?)")
            await run_check(check, data)
            return data

        return await self.retry.run(attempt, what=what)

    async def read(self, path: str, *, check: Check | None = None) -> bytes:
        full = self._full(path)
        return await self._read_counted(path, lambda: self._io(_read_all, full, path), check)

    async def write(self, path: str, data: bytes) -> None:
        full = self._full(path)
        await self._pace(len(data))
        await self._run(_write_atomic, full, data, self.durable, what=path)
        self.stats.bytes_written += len(data)

    async def delete(self, path: str) -> None:
        await self._run(_unlink_quiet, self._full(path), what=path)

    async def open_upload(self, path: str, *, part_size: int) -> Upload:
        full = self._full(path)
        ledger = PartLedger(path, part_size)
        tmp, fd = await self._run(_open_temp, full, what=path)
        return LocalUpload(self, path, full, tmp, fd, ledger)

    async def resume_upload(self, path: str, *, part_size: int, token: str, parts: Mapping[int, int]) -> Upload:
        full = self._full(path)
        name = os.path.basename(full)
        if not token.startswith(f".{name}{TMP_MARKER}") or "/" in token or "\x00" in token:
            raise ShardNotFound(f"{path}: {token!r} is not an upload of this object")
        tmp = os.path.join(os.path.dirname(full), token)
        ledger = PartLedger(path, part_size)
        for number, size in sorted(parts.items()):
            ledger.add(number, size)
        fd = await self._run(_reopen_temp, tmp, what=path)
        return LocalUpload(self, path, full, tmp, fd, ledger)

    async def close(self) -> None:
        executor = self._executor
        await asyncio.get_running_loop().run_in_executor(None, executor.shutdown)


class LocalUpload(Upload):
    """Parts written at their offsets into one temporary file, renamed into place on complete."""

    def __init__(self, store: LocalStore, path: str, full: str, tmp: str, fd: int, ledger: PartLedger) -> None:
        self._store, self._path, self._ledger = store, path, ledger
        self._full, self._tmp = full, tmp  # the destination, and the temporary file its parts go into
        self._fd: int | None = fd

    @property
    def token(self) -> str | None:
        return os.path.basename(self._tmp) if self._fd is not None else None

    def _open_fd(self) -> int:
        if self._fd is None:
            raise ValueError(f"{self._path}: upload already completed or aborted")
        return self._fd

    async def write_part(self, part_number: int, data: bytes) -> None:
        fd = self._open_fd()
        offset = self._ledger.add(part_number, len(data))
        store = self._store
        await store._pace(len(data))
        await store._run(write_in_pieces, fd, [data], offset, what=f"{self._path} part {part_number}")
        store.stats.bytes_written += len(data)

    async def complete(self) -> None:
        fd = self._open_fd()
        size = self._ledger.total()
        self._fd = None
        # Not retried: the commit closes the fd whatever happens, so a second go has nothing to commit.
        with translated(self._path):
            await self._store._io(_commit_temp, fd, self._tmp, self._full, size, self._store.durable)

    async def abort(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            await self._store._io(_discard_temp, fd, self._tmp)


# --- blocking helpers, run in the store's thread pool ---------------------------------


def _walk(root: str) -> list[ObjectInfo]:
    if not os.path.isdir(root):
        raise FileNotFoundError(root)
    found: list[ObjectInfo] = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=_raise):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, root)
        prefix = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
        for name in filenames:
            if TMP_MARKER in name:
                continue
            try:
                st = os.stat(os.path.join(dirpath, name))
            except FileNotFoundError:
                continue  # deleted while we walked, or a dangling symlink
            if stat.S_ISREG(st.st_mode):
                found.append(ObjectInfo(prefix + name, st.st_size, st.st_mtime))
    found.sort(key=lambda o: o.path)
    return found


def _scan_dir(root: str, rel: str) -> tuple[list[ObjectInfo], list[str]]:
    """The regular files (as objects) and the subdirectories (relative) of ``root/rel``."""
    if not rel and not os.path.isdir(root):
        raise FileNotFoundError(root)
    prefix = rel + "/" if rel else ""
    files: list[ObjectInfo] = []
    dirs: list[str] = []
    try:
        entries = list(os.scandir(os.path.join(root, *rel.split("/")) if rel else root))
    except FileNotFoundError:
        if not rel:
            raise
        return files, dirs  # removed while we walked
    for entry in entries:
        if TMP_MARKER in entry.name:
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                dirs.append(prefix + entry.name)
                continue
            st = entry.stat()  # follows symlinks, as os.walk's listing does
        except FileNotFoundError:
            continue
        if stat.S_ISREG(st.st_mode):
            files.append(ObjectInfo(prefix + entry.name, st.st_size, st.st_mtime))
    dirs.sort()
    return files, dirs


def _reopen_temp(tmp: str) -> int:
    fd = os.open(tmp, os.O_WRONLY | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FileNotFoundError(tmp)
    return fd


def _raise(exc: OSError) -> None:
    raise exc


def _stat_file(full: str, path: str) -> ObjectInfo:
    st = os.stat(full)
    if not stat.S_ISREG(st.st_mode):
        raise ShardNotFound(f"{path}: not a regular file")
    return ObjectInfo(path, st.st_size, st.st_mtime)


def _open_regular(full: str, what: str) -> tuple[int, int]:
    fd = os.open(full, os.O_RDONLY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ShardNotFound(f"{what}: not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def _pread(full: str, start: int, end: int, what: str) -> bytes:
    fd, size = _open_regular(full, what)
    try:
        if end > size:
            raise InvalidRange(f"{what}: past the end of the file ({size} bytes)")
        return pread_upto(fd, end - start, start)
    finally:
        os.close(fd)


def _read_all(full: str, what: str) -> bytes:
    fd, size = _open_regular(full, what)
    try:
        return pread_upto(fd, size, 0)
    finally:
        os.close(fd)


def _temp_name(full: str) -> str:
    head, name = os.path.split(full)
    return os.path.join(head, f".{name}{TMP_MARKER}{secrets.token_hex(6)}")


def _open_temp(full: str) -> tuple[str, int]:
    os.makedirs(os.path.dirname(full), exist_ok=True)
    tmp = _temp_name(full)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    return tmp, fd


def _commit_temp(fd: int, tmp: str, full: str, size: int | None, durable: bool) -> None:
    """Finish a temporary file (fd open) and rename it over ``full``; the fd is closed either way."""
    try:
        try:
            if size is not None:
                os.ftruncate(fd, size)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, full)
    except BaseException:
        _unlink_quiet(tmp)
        raise
    if durable:
        fsync_dir(os.path.dirname(full))


def _write_atomic(full: str, data: bytes, durable: bool) -> None:
    tmp, fd = _open_temp(full)
    try:
        write_in_pieces(fd, [data], 0)
    except BaseException:
        os.close(fd)
        _unlink_quiet(tmp)
        raise
    _commit_temp(fd, tmp, full, None, durable)


def _discard_temp(fd: int, tmp: str) -> None:
    try:
        os.close(fd)
    finally:
        _unlink_quiet(tmp)


def _unlink_quiet(full: str) -> None:
    try:
        os.unlink(full)
    except FileNotFoundError:
        pass
