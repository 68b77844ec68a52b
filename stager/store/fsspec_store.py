"""A store over any fsspec filesystem (s3://, gs://, az://, memory://, ...).

Async filesystems (s3fs, gcsfs, adlfs) are created with ``asynchronous=True``
and their ``_verb`` coroutines are awaited on the running loop; sync ones run
in a bounded thread pool. Ranged reads call ``cat_file(path, start, end)``
directly: fsspec's buffered file objects would read ahead and cache bytes we
do not want. The filesystem instance is private to the store
(``skip_instance_cache``), so it is bound to the loop that uses it, and its
listing cache is off so :meth:`FsspecStore.list` sees what the origin has now.

Retrying belongs to :class:`~stager.store.retry.RetryPolicy`, so for s3fs
both retry layers below it are turned off: botocore's (``total_max_attempts``
1) and s3fs's own ``_error_wrapper`` loop (``retries = 1``). Whole-object
writes use the backend's single write (for S3 a PUT, or a multipart upload
that becomes visible only when completed).
"""

from __future__ import annotations

import asyncio
import base64
import os
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any, Mapping

from ..config import RetryConfig
from ..errors import ConfigError, ShardNotFound, StagerError, TransientOriginError
from .base import Check, InvalidRange, ObjectInfo, Store, Upload, split_protocol, validate_path
from .parts import PartLedger
from .options import StoreOptions
from .translate import translated

if TYPE_CHECKING:
    import fsspec

#: Name prefix of the local spool files of :class:`SpooledUpload`.
SPOOL_PREFIX = "stager-upload-"

#: Protocols served by s3fs.
S3_PROTOCOLS = ("s3", "s3a")


def s3fs_options(storage_options: Mapping[str, Any], retry: RetryConfig, concurrency: int = 10) -> dict[str, Any]:
    """Storage options for s3fs with its and botocore's retries off, timeouts from ``retry``, and a
    connection pool of ``concurrency`` (botocore's default of 10 would cap requests in flight)."""
    options = dict(storage_options)
    config = dict(options.get("config_kwargs") or {})
    config.setdefault("max_pool_connections", concurrency)
    config["retries"] = {"total_max_attempts": 1, "mode": "standard"}
    config.setdefault("connect_timeout", min(retry.request_timeout, 10.0))
    config.setdefault("read_timeout", retry.request_timeout)
    options["config_kwargs"] = config
    options.setdefault("use_listings_cache", False)
    return options


class FsspecStore(Store):
    """A :class:`~stager.store.base.Store` rooted at an fsspec URL.

    Args:
        url: ``protocol://bucket/prefix``.
        storage_options: passed to the filesystem (endpoint, credentials, ...).
        options: retry, bandwidth, stats and concurrency (see :class:`~stager.store.options.StoreOptions`).
    """

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None, *,
                 options: StoreOptions = StoreOptions()) -> None:
        concurrency = options.concurrency
        protocol, _ = split_protocol(url)
        self.protocol = protocol or "file"
        self._options = dict(storage_options or {})
        if self.protocol in S3_PROTOCOLS:
            self._options = s3fs_options(self._options, options.retry_config, concurrency)
        self._fs: fsspec.AbstractFileSystem | None = None
        self._async = self._filesystem_is_async()
        self.root = self._strip_protocol(url)
        self._url = f"{self.protocol}://{self.root}"
        self.options = options
        self.stats, self.retry, self.bandwidth = options.machinery()
        self._executor = (
            None if self._async else ThreadPoolExecutor(max(1, concurrency), thread_name_prefix="stager-fsspec")
        )
        self._open_filesystem()

    def _filesystem_class(self) -> type:
        import fsspec  # here, not at the top: the S3 store's read path never needs it

        with translated(self._url_hint()):
            return fsspec.get_filesystem_class(self.protocol)

    def _filesystem_is_async(self) -> bool:
        return bool(getattr(self._filesystem_class(), "async_impl", False))

    def _url_hint(self) -> str:
        return getattr(self, "_url", self.protocol + "://")

    def _strip_protocol(self, url: str) -> str:
        return self._filesystem_class()._strip_protocol(url).rstrip("/")

    def _open_filesystem(self) -> None:
        """Make the filesystem now, so options it refuses fail when the store is opened."""
        self.fs  # noqa: B018

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        """The fsspec filesystem (made on first use)."""
        if self._fs is None:
            options = dict(self._options)
            if self._async:
                options["asynchronous"] = True
            options["skip_instance_cache"] = True
            fs = self._filesystem_class()(**options)
            if self.protocol in S3_PROTOCOLS:
                fs.retries = 1  # s3fs's _error_wrapper: one attempt; RetryPolicy does the rest
            self._fs = fs
        return self._fs

    @property
    def url(self) -> str:
        return self._url

    def _full(self, path: str) -> str:
        return f"{self.root}/{validate_path(path)}"

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call a filesystem method: ``_method`` awaited if async, ``method`` in the pool if not.

        Raises:
            ConfigError: the filesystem refused its arguments (``ValueError``: a path it cannot
                parse, such as ``hf://x``, whose repository name is not one), which no retry mends.
        """
        try:
            if self._async:
                return await getattr(self.fs, "_" + method)(*args, **kwargs)
            fn = partial(getattr(self.fs, method), *args, **kwargs)
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn)
        except StagerError:
            raise
        except ValueError as exc:
            raise ConfigError(f"{self._url}: {self.protocol}:// refused it: {exc}") from exc

    async def _run(self, method: str, *args: Any, what: str, **kwargs: Any) -> Any:
        """One retried, translated filesystem call."""

        async def attempt() -> Any:
            with translated(what):
                return await self._call(method, *args, **kwargs)

        return await self.retry.run(attempt, what=what)

    async def list(self) -> list[ObjectInfo]:
        found = await self._run("find", self.root, detail=True, what=self.url)
        prefix = self.root + "/"
        out = []
        for name, entry in found.items():
            name = self.fs._strip_protocol(name)
            if entry.get("type", "file") != "file" or not name.startswith(prefix):
                continue
            out.append(ObjectInfo(name[len(prefix):], int(entry.get("size") or 0), _mtime(entry), vouched_md5(entry)))
        out.sort(key=lambda o: o.path)
        return out

    async def info(self, path: str) -> ObjectInfo:
        entry = await self._run("info", self._full(path), what=path)
        if entry.get("type", "file") != "file":
            raise ShardNotFound(f"{path}: not an object (a {entry.get('type')})")
        return ObjectInfo(path, int(entry.get("size") or 0), _mtime(entry), vouched_md5(entry))

    async def read_range(self, path: str, start: int, end: int, *, check: Check | None = None) -> bytes:
        full = self._full(path)

        async def get(what: str) -> bytes:
            with translated(what):
                data = await self._call("cat_file", full, start=start, end=end)
            self.stats.bytes_read += len(data)
            if len(data) != end - start:
                await self._short_body(path, what, len(data), end - start, end)
            return data

        return await self._read_range_by(path, start, end, check, get)

    async def _short_body(self, path: str, what: str, got: int, expected: int, end: int) -> None:
        """Raise InvalidRange if the object ends before ``end``, else TransientOriginError."""
        with translated(what):
            size = int((await self._call("info", self._full(path)))["size"])
        if end > size:
            raise InvalidRange(f"{what}: past the end of the object ({size} bytes)")
        raise TransientOriginError(f"{what}: got {got} bytes, expected {expected}")

    async def read(self, path: str, *, check: Check | None = None) -> bytes:
        full = self._full(path)
        return await self._read_counted(path, lambda: self._call("cat_file", full), check)

    async def write(self, path: str, data: bytes) -> None:
        full = self._full(path)
        await self._pace(len(data))
        await self._run("pipe_file", full, data, what=path)
        self.stats.bytes_written += len(data)

    async def delete(self, path: str) -> None:
        try:
            await self._run("rm_file", self._full(path), what=path)
        except ShardNotFound:
            pass

    async def open_upload(self, path: str, *, part_size: int) -> Upload:
        return SpooledUpload(self, path, self._full(path), PartLedger(path, part_size))

    async def resume_upload(self, path: str, *, part_size: int, token: str, parts: Mapping[int, int]) -> Upload:
        # The token is the spool file: resumable on the same machine, which is where the caller's journal lives.
        if not os.path.basename(token).startswith(SPOOL_PREFIX) or not os.path.isfile(token):
            raise ShardNotFound(f"{path}: upload spool {token!r} is gone")
        ledger = PartLedger(path, part_size)
        for number, size in sorted(parts.items()):
            ledger.add(number, size)
        return SpooledUpload(self, path, self._full(path), ledger, spool=token)

    async def close(self) -> None:
        client = getattr(self._fs, "_s3", None)  # s3fs: the aiobotocore client, if one was made
        if client is not None:
            await client.close()
            self._fs._s3 = None  # type: ignore[union-attr]
        if self._executor is not None:
            executor, self._executor = self._executor, None
            await asyncio.get_running_loop().run_in_executor(None, executor.shutdown)


class SpooledUpload(Upload):
    """For filesystems without a multipart API: parts go to a local temp file, uploaded once on complete."""

    def __init__(self, store: FsspecStore, path: str, full: str, ledger: PartLedger, spool: str | None = None) -> None:
        self._store = store
        self._path = path
        self._full = full
        self._ledger = ledger
        if spool is None:
            import tempfile

            fd, spool = tempfile.mkstemp(prefix=SPOOL_PREFIX)
            os.close(fd)
        self._spool = spool
        self._open = True

    @property
    def token(self) -> str | None:
        return self._spool if self._open else None

    async def write_part(self, part_number: int, data: bytes) -> None:
        offset = self._ledger.add(part_number, len(data))
        await asyncio.to_thread(_pwrite_at, self._spool, offset, data)

    async def complete(self) -> None:
        size = self._ledger.total()
        await asyncio.to_thread(os.truncate, self._spool, size)
        store = self._store
        await store._pace(size)
        try:
            await store._run("put_file", self._spool, self._full, what=self._path)
            store.stats.bytes_written += size
        finally:
            await self.abort()

    async def abort(self) -> None:
        self._open = False
        try:
            os.unlink(self._spool)
        except FileNotFoundError:
            pass


def _pwrite_at(path: str, offset: int, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            n = os.pwrite(fd, view, offset)
            view = view[n:]
            offset += n
    finally:
        os.close(fd)


def vouched_md5(entry: Mapping[str, Any]) -> str | None:
    """The MD5 (lowercase hex) of an object's bytes that its listing vouches for, or None.

    S3's ETag is the MD5 only for a single-part object (a multipart ETag has a
    ``-N`` suffix; 32 hex digits is the one shape taken); GCS lists ``md5Hash``
    (base64; none for composite objects); Azure ``content_settings.content_md5``.
    """
    etag = entry.get("ETag") or entry.get("etag")
    if isinstance(etag, str):
        etag = etag.strip().strip('"').lower()
        if len(etag) == 32 and all(c in "0123456789abcdef" for c in etag):
            return etag
        return None
    raw = entry.get("md5Hash")
    if raw is None:
        settings = entry.get("content_settings")
        raw = settings.get("content_md5") if isinstance(settings, Mapping) else getattr(settings, "content_md5", None)
    if isinstance(raw, str):
        try:
            raw = base64.b64decode(raw, validate=True)
        except ValueError:
            return None
    if isinstance(raw, (bytes, bytearray)) and len(raw) == 16:
        return bytes(raw).hex()
    return None


def _mtime(entry: Mapping[str, Any]) -> float | None:
    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = entry.get(key)
        if value is None:
            continue
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
        try:
            return float(value)
        except (TypeError, ValueError):
            continue
    return None
