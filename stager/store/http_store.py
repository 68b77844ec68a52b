"""A read-only store over a plain HTTP(S) server (``https://host/dataset/``).

Objects are ``ROOT/PATH`` (percent-encoded), requested unsigned with the
storage options' headers. Sizes come from ``HEAD`` (or, where HEAD is
refused, from the ``Content-Range`` of a one-byte GET); reads are the HTTP
family's (:mod:`stager.store.signed_http`), redirects followed. HTTP cannot
list a directory or write, so :meth:`HttpStore.list` and the write methods
raise :class:`~stager.store.base.UnsupportedOperation`; datasets on HTTP are
found through their manifest.
"""

from __future__ import annotations

from typing import Any, Mapping
from urllib.parse import quote

from ..errors import ConfigError, TransientOriginError
from .base import ObjectInfo, UnsupportedOperation, Upload, validate_path
from .endpoint import check_http_url
from .http_client import error_from_response, last_modified
from .options import StoreOptions
from .range_body import parse_content_range
from .signed_http import SignedHttpStore
from .translate import translated

#: Storage options an HTTP store understands.
HTTP_OPTIONS = frozenset({"headers"})


class HttpStore(SignedHttpStore):
    """A :class:`~stager.store.base.Store` over ``url``, an HTTP(S) directory.

    Args:
        url: the root, ``http(s)://host[:port]/path``.
        storage_options: ``{"headers": {...}}`` sent with every request (e.g. a token).
        options: retry, bandwidth, stats and concurrency (see :class:`~stager.store.options.StoreOptions`).
    """

    follow_redirects = True

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None, *,
                 options: StoreOptions = StoreOptions()) -> None:
        given = dict(storage_options or {})
        unknown = set(given) - HTTP_OPTIONS
        if unknown:
            raise ConfigError(f"{url}: storage options {sorted(unknown)} are not understood by the HTTP store")
        check_http_url(url)
        self._base = url.rstrip("/")
        self.options = options
        self.stats, self.retry, self.bandwidth = options.machinery()
        self._wire(options.concurrency, given.get("headers"))

    @property
    def url(self) -> str:
        return self._base

    def _object_url(self, path: str) -> str:
        return f"{self._base}/{quote(validate_path(path), safe='/')}"

    async def _sign(self, method: str, path: str, headers: dict[str, str]) -> tuple[str, Mapping[str, str]]:
        return self._object_url(path), headers  # plain HTTP: the headers of the storage options, on every request

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

    def _read_only(self, path: str) -> UnsupportedOperation:
        return UnsupportedOperation(f"{self.url}/{path}: an HTTP origin is read-only")

    async def write(self, path: str, data: bytes) -> None:
        raise self._read_only(path)

    async def delete(self, path: str) -> None:
        raise self._read_only(path)

    async def open_upload(self, path: str, *, part_size: int) -> Upload:
        raise self._read_only(path)

    async def close(self) -> None:
        await self._close_session()
