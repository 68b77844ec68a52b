"""The HTTP family's reads: ranged, streamed and whole-object GETs, for stores that differ only in signing.

:class:`SignedHttpStore` is the one read path of the stores that talk HTTP
through :mod:`stager.store.wire` (:class:`~stager.store.http_store.HttpStore`
and :class:`~stager.store.s3_store.S3Store`): a kept-alive connection pool,
``Range`` GETs whose bodies are checked by :mod:`stager.store.range_body` (a
server that ignores Range, or answers with other bytes, never yields wrong
data), streamed into a sink or read whole, each attempt under the store's
retry policy and bandwidth cap. A store says only how a request for an
object is addressed and signed (:meth:`SignedHttpStore._sign`, called for
every attempt, so a signature never outlives its credentials) and whether
redirects are followed.
"""

from __future__ import annotations

import abc
from typing import Callable, Mapping

from .bandwidth import BandwidthLimiter
from .base import Check, RangeSink, Store, run_check, validate_path, validate_range
from .http_client import fetch_all, fetch_range, new_session, stream_range
from .range_body import range_header
from .retry import RetryPolicy
from .stats import OriginStats
from .wire import WireSession


class SignedHttpStore(Store):
    """Reads of a store over HTTP; subclasses sign (:meth:`_sign`) and may set :attr:`follow_redirects`."""

    follow_redirects = False
    stats: OriginStats
    retry: RetryPolicy
    bandwidth: BandwidthLimiter | None

    def _wire(self, concurrency: int, headers: Mapping[str, str] | None = None) -> None:
        """Set up the connection pool (opened on first use): ``concurrency`` connections, ``headers`` on each."""
        self._concurrency = concurrency
        self._wire_headers = dict(headers or {})
        self._session: WireSession | None = None

    @abc.abstractmethod
    async def _sign(self, method: str, path: str, headers: dict[str, str]) -> tuple[str, Mapping[str, str]]:
        """The URL and headers of a ``method`` request for object ``path`` (already validated)."""

    @property
    def session(self) -> WireSession:
        if self._session is None:
            self._session = new_session(self._concurrency, self._wire_headers or None)
        return self._session

    async def read_range(self, path: str, start: int, end: int, *, check: Check | None = None) -> bytes:
        validate_path(path)

        async def get(what: str) -> bytes:
            url, headers = await self._sign("GET", path, {"Range": range_header(start, end)})
            return await fetch_range(self.session, url, headers, start, end, what, self.stats,
                                     allow_redirects=self.follow_redirects)

        return await self._read_range_by(path, start, end, check, get)

    async def read_range_into(self, path: str, start: int, end: int, open_sink: Callable[[], RangeSink]) -> None:
        validate_path(path)
        validate_range(path, start, end)
        if start == end:
            await super().read_range_into(path, start, end, open_sink)
            return
        what = f"{path} [{start}, {end})"

        async def attempt() -> None:
            await self._pace(end - start)
            url, headers = await self._sign("GET", path, {"Range": range_header(start, end)})
            await stream_range(self.session, url, headers, start, end, what, self.stats, open_sink,
                               allow_redirects=self.follow_redirects)

        await self.retry.run(attempt, what=what)

    async def read(self, path: str, *, check: Check | None = None) -> bytes:
        validate_path(path)

        async def attempt() -> bytes:
            url, headers = await self._sign("GET", path, {})
            data = await fetch_all(self.session, url, headers, path, self.stats, allow_redirects=self.follow_redirects)
            await run_check(check, data)
            return data

        return await self.retry.run(attempt, what=path)

    async def _close_session(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
