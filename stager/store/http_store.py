"""A read-only store over a plain HTTP(S) server (``https://host/dataset/``).

Objects are ``ROOT/PATH`` (percent-encoded). Sizes come from ``HEAD`` (or,
where HEAD is refused, from the ``Content-Range`` of a one-byte GET); ranges
from ``GET`` with a ``Range`` header, checked by
:func:`~stager.store.range_body.read_range_body` so a server that ignores
Range, or answers with other bytes, never yields wrong data. HTTP cannot
list a directory or write, so :meth:`HttpStore.list` and the write methods
raise :class:`~stager.store.base.UnsupportedOperation`; datasets on HTTP are
found through their manifest.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping
from urllib.parse import quote

from ..config import RetryConfig
from ..errors import ConfigError, TransientOriginError
from .bandwidth import BandwidthLimiter
from .base import (Check, ObjectInfo, RangeSink, Store, UnsupportedOperation, Upload, run_check, validate_path,
                   validate_range)
from .http_client import error_from_response, fetch_all, fetch_range, last_modified, new_session, stream_range
from .range_body import parse_content_range, range_header
from .retry import RetryPolicy
from .stats import OriginStats
from .translate import translated
from .wire import WireSession

#: Storage options an HTTP store understands.
HTTP_OPTIONS = frozenset({"headers"})


class HttpStore(Store):
    """A :class:`~stager.store.base.Store` over ``url``, an HTTP(S) directory.

    Args:
        url: the root, ``http(s)://host[:port]/path``.
        storage_options: ``{"headers": {...}}`` sent with every request (e.g. a token).
        retry, bandwidth, stats, concurrency: see :func:`stager.store.open_store`.
    """

    def __init__(
        self,
        url: str,
        storage_options: Mapping[str, Any] | None = None,
        *,
        retry: RetryConfig | None = None,
        bandwidth: BandwidthLimiter | None = None,
        stats: OriginStats | None = None,
        concurrency: int = 16,
    ) -> None:
        options = dict(storage_options or {})
        unknown = set(options) - HTTP_OPTIONS
        if unknown:
            raise ConfigError(f"{url}: storage options {sorted(unknown)} are not understood by the HTTP store")
        self._base = url.rstrip("/")
        self._headers = dict(options.get("headers") or {})
        self._concurrency = concurrency
        self._session: WireSession | None = None
        self.stats = stats if stats is not None else OriginStats()
        self.retry = RetryPolicy(retry, stats=self.stats, concurrency=concurrency)
        self.bandwidth = bandwidth

    @property
    def url(self) -> str:
        return self._base

    @property
    def session(self) -> WireSession:
        if self._session is None:
            self._session = new_session(self._concurrency, self._headers)
        return self._session

    def _object_url(self, path: str) -> str:
        return f"{self._base}/{quote(validate_path(path), safe='/')}"

    async def list(self) -> list[ObjectInfo]:
        raise UnsupportedOperation(
            f"{self.url}: an HTTP origin cannot be listed; index the dataset where it can be "
            "listed and serve its manifest beside the data"
        )

    async def info(self, path: str) -> ObjectInfo:
        url = self._object_url(path)

        async def attempt() -> ObjectInfo:
            with translated(path):
                async with self.session.head(url, allow_redirects=True) as resp:
                    if resp.status in (405, 501):  # HEAD refused: ask for one byte instead
                        return await self._info_by_get(url, path)
                    if resp.status >= 300:
                        raise await error_from_response(resp, path)
                    if resp.content_length is None:
                        return await self._info_by_get(url, path)
                    return ObjectInfo(path, resp.content_length, last_modified(resp))

        return await self.retry.run(attempt, what=path)

    async def _info_by_get(self, url: str, path: str) -> ObjectInfo:
        async with self.session.get(url, headers={"Range": "bytes=0-0"}, allow_redirects=True) as resp:
            if resp.status >= 300:
                raise await error_from_response(resp, path)
            parsed = parse_content_range(resp.headers.get("Content-Range", ""))
            if parsed is not None and parsed[2] is not None:
                size = parsed[2]
            elif resp.status == 200 and resp.content_length is not None:
                size = resp.content_length
            else:
                raise TransientOriginError(f"{path}: the server gives no size (no Content-Length or Content-Range)")
            resp.close()
            return ObjectInfo(path, size, last_modified(resp))

    async def read_range(self, path: str, start: int, end: int, *, check: Check | None = None) -> bytes:
        url = self._object_url(path)
        validate_range(path, start, end)
        what = f"{path} [{start}, {end})"
        if start == end:
            await self.info(path)  # still fail on a missing object
            await run_check(check, b"")
            return b""
        headers = {"Range": range_header(start, end)}

        async def attempt() -> bytes:
            if self.bandwidth is not None:
                await self.bandwidth.acquire(end - start)
            data = await fetch_range(self.session, url, headers, start, end, what, self.stats, allow_redirects=True)
            await run_check(check, data)
            return data

        return await self.retry.run(attempt, what=what)

    async def read_range_into(self, path: str, start: int, end: int, open_sink: Callable[[], RangeSink]) -> None:
        url = self._object_url(path)
        validate_range(path, start, end)
        if start == end:
            await super().read_range_into(path, start, end, open_sink)
            return
        what = f"{path} [{start}, {end})"
        headers = {"Range": range_header(start, end)}

        async def attempt() -> None:
            if self.bandwidth is not None:
                await self.bandwidth.acquire(end - start)
            await stream_range(self.session, url, headers, start, end, what, self.stats, open_sink,
                               allow_redirects=True)

        await self.retry.run(attempt, what=what)

    async def read(self, path: str) -> bytes:
        url = self._object_url(path)

        async def attempt() -> bytes:
            return await fetch_all(self.session, url, None, path, self.stats, allow_redirects=True)

        return await self.retry.run(attempt, what=path)

    def _read_only(self, path: str) -> UnsupportedOperation:
        return UnsupportedOperation(f"{self.url}/{path}: an HTTP origin is read-only")

    async def write(self, path: str, data: bytes) -> None:
        raise self._read_only(path)

    async def delete(self, path: str) -> None:
        raise self._read_only(path)

    async def open_upload(self, path: str, *, part_size: int) -> Upload:
        raise self._read_only(path)

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
