"""A fault-injecting HTTP reverse proxy to put in front of a test origin.

How it works: an aiohttp server (on a `ThreadedWebServer`: own loop and
thread, 127.0.0.1, OS-chosen port) takes every request and forwards it with
one shared aiohttp ``ClientSession`` to ``upstream_url``: same method, the
path and query exactly as received (``encoded=True``: no re-quoting), the body
streamed through, and all end-to-end headers, including the client's ``Host``
(SigV4 signs the host the client connected to, so a signed S3 request stays
valid). The upstream response streams back in chunks.

For each request matching the live `FaultPlan` a seeded `FaultDecider` picks
the faults (see fault_plan.py), which are then applied here:

* latency/jitter/spike: a sleep before forwarding;
* slowdown / error500: answered at once with an S3-style XML error body;
* ignore_range: the ``Range`` header is dropped, so the origin returns 200 and
  the whole object; a SigV4-signed request is re-signed (`sigv4.resign_headers`)
  with the secret from ``credentials`` (access key -> secret), and if the key
  is unknown the fault is not injected;
* reset: part of the body, then a TCP RST (SO_LINGER 0 + abort); with no
  2xx body to cut (HEAD, PUT, errors) the connection is reset before any
  response, after the request reached the origin;
* truncate: part of the body, then a clean close before Content-Length;
* flip: one byte of the body XOR 0xFF (same length);
* bandwidth caps: each chunk, both directions, waits on the transfer's own
  limiter (``connection_bps``) and on one shared by all (``bandwidth_bps``);
* request-rate limit: a matching request over ``rate_limit_rps`` on its key
  prefix is answered ``503 SlowDown`` after the first-byte latency, as S3 does.

The proxy also counts matching requests in flight (now and at the peak), so a
test can assert how many requests a client kept open.

Truncate and flip only hit 2xx responses with a non-empty body (else they are
not counted); an upstream body of unknown length is read whole first so the
cut point is known. ``plan.down``
overrides everything for every request. Counters are guarded by a lock.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, fields

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from ..store import sigv4
from .bandwidth import BandwidthLimiter, TransferShaper
from .fault_plan import Decision, Fault, FaultDecider, FaultEvent, FaultPlan
from .rate_limit import PrefixRateLimiter
from .web_thread import ServedApp, abort_with_rst

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "expect",  # the proxy answers 100-continue itself
    }
)
_SKIP_AUTO = frozenset({"Accept", "Accept-Encoding", "User-Agent", "Content-Type"})
_BODY_FAULTS = (Fault.RESET, Fault.TRUNCATE, Fault.FLIP)
_NUMBER = web.RequestKey("fault_proxy_number", int)
_ERRORS = {
    503: ("SlowDown", "Please reduce your request rate."),
    500: ("InternalError", "We encountered an internal error. Please try again."),
}


@dataclass(frozen=True, slots=True)
class ProxyStats:
    """A snapshot of the proxy's counters."""

    requests: int
    faults: dict[str, int]
    bytes_down: int  # response body bytes sent to clients
    bytes_up: int  # request body bytes sent upstream
    in_flight: int = 0  # matching requests being handled now
    peak_in_flight: int = 0  # the most at once since start (or reset_peak)

    @property
    def bytes_forwarded(self) -> int:
        return self.bytes_down + self.bytes_up

    @property
    def total_faults(self) -> int:
        return sum(self.faults.values())


def s3_error_body(code: str, message: str, resource: str = "", request_id: str = "") -> bytes:
    """An S3-style ``<Error>`` XML document."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<Resource>{resource}</Resource><RequestId>{request_id}</RequestId>"
        "</Error>"
    ).encode()


class FaultProxy(ServedApp):
    """Reverse proxy from ``url`` to ``upstream_url`` that injects faults.

    Args:
        upstream_url: ``http://host:port`` (optionally with a path prefix).
        plan: the live fault plan (default: no faults).
        seed: seed of the fault decider.
        credentials: access key -> secret key, to re-sign SigV4 requests the
            proxy changes (ignore_range).
    """

    def __init__(
        self,
        upstream_url: str,
        plan: FaultPlan | None = None,
        *,
        seed: int = 0,
        credentials: Mapping[str, str] | None = None,
    ) -> None:
        self.upstream_url = upstream_url.rstrip("/")
        self.plan = plan if plan is not None else FaultPlan()
        self.plan.validate()
        self.credentials = dict(credentials or {})
        self._decider = FaultDecider(seed)
        self._limiter = BandwidthLimiter()
        self._rate = PrefixRateLimiter()
        self._in_flight = 0
        self._peak_in_flight = 0
        self._lock = threading.Lock()
        self._requests = 0
        self._bytes_down = 0
        self._bytes_up = 0
        self._session: aiohttp.ClientSession | None = None
        self._refusing = False
        app = web.Application(client_max_size=0)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        app.cleanup_ctx.append(self._session_ctx)
        self._start_serving(app, "fault-proxy")

    # -- public API ----------------------------------------------------------

    def update(self, **changes: object) -> FaultPlan:
        """Change plan fields atomically (validated); applies "refuse" at once.

        Raises:
            ValueError: unknown field or invalid plan; nothing is changed.
        """
        known = {f.name for f in fields(FaultPlan)}
        unknown = set(changes) - known
        if unknown:
            raise ValueError(f"unknown FaultPlan fields: {sorted(unknown)}")
        with self._lock:
            candidate = self.plan.copy(**changes)  # validates
            for name, value in changes.items():
                setattr(self.plan, name, value)
        self._sync_listener(candidate)
        return self.plan

    def set_down(self, down: bool = True, mode: str = "503") -> None:
        """Take the origin down (mode "503", "reset" or "refuse") or bring it back."""
        self.update(down=down, down_mode=mode)

    def reseed(self, seed: int) -> None:
        """Restart the fault sequence from ``seed`` and zero every counter and event."""
        with self._lock:
            self._decider.reseed(seed)
            self._requests = self._bytes_down = self._bytes_up = 0
            self._peak_in_flight = self._in_flight

    def stats(self) -> ProxyStats:
        with self._lock:
            return ProxyStats(self._requests, self._decider.counts, self._bytes_down, self._bytes_up,
                              self._in_flight, self._peak_in_flight)

    @property
    def in_flight(self) -> int:
        """Matching requests being handled now."""
        with self._lock:
            return self._in_flight

    @property
    def peak_in_flight(self) -> int:
        """The most matching requests handled at once since start, ``reseed`` or ``reset_peak``."""
        with self._lock:
            return self._peak_in_flight

    def reset_peak(self) -> int:
        """Start measuring the peak anew (from the requests in flight now); return the old peak."""
        with self._lock:
            old, self._peak_in_flight = self._peak_in_flight, self._in_flight
            return old

    @property
    def requests(self) -> int:
        with self._lock:
            return self._requests

    @property
    def faults(self) -> dict[str, int]:
        """Injected faults by kind (`Fault` values as keys)."""
        return self._decider.counts

    @property
    def bytes_forwarded(self) -> int:
        with self._lock:
            return self._bytes_down + self._bytes_up

    @property
    def events(self) -> list[FaultEvent]:
        """Every matching request in order, with the faults injected into it."""
        return self._decider.events

    def __repr__(self) -> str:
        return f"FaultProxy({self.url} -> {self.upstream_url})"

    # -- internals -----------------------------------------------------------

    async def _session_ctx(self, _app: web.Application) -> AsyncIterator[None]:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=60)
        connector = aiohttp.TCPConnector(limit=0, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=timeout, auto_decompress=False
        )
        yield
        await self._session.close()

    def _begin_request(self) -> tuple[FaultPlan, int]:
        with self._lock:
            plan = self.plan.copy()
            self._requests += 1
            return plan, self._requests

    def _count(self, down: int = 0, up: int = 0) -> None:
        with self._lock:
            self._bytes_down += down
            self._bytes_up += up

    def _sync_listener(self, plan: FaultPlan) -> None:
        refuse = plan.down and plan.down_mode == "refuse"
        if refuse and not self._refusing:
            self._refusing = True
            self._server.close_listener(abort_connections=True)
        elif not refuse and self._refusing:
            self._refusing = False
            self._server.reopen_listener()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        plan, request[_NUMBER] = self._begin_request()
        if plan.down:
            return await self._down(request, plan)
        if not plan.matches(request.method, request.path):
            return await self._serve(request, plan, None)
        self._enter()
        try:
            now = asyncio.get_running_loop().time()
            if not self._rate.admit(request.path, now, plan.rate_limit_rps, plan.rate_limit_burst):
                self._decider.record(Fault.RATE_LIMIT)
                if plan.latency_s > 0:
                    await asyncio.sleep(plan.latency_s)
                return self._error(request, 503)
            decision = self._decider.decide(plan, request.method, request.path)
            return await self._serve(request, plan, decision)
        finally:
            self._leave()

    def _enter(self) -> None:
        with self._lock:
            self._in_flight += 1
            self._peak_in_flight = max(self._peak_in_flight, self._in_flight)

    def _leave(self) -> None:
        with self._lock:
            self._in_flight -= 1

    async def _serve(self, request: web.Request, plan: FaultPlan, decision: Decision | None) -> web.StreamResponse:
        if decision is not None:
            if decision.delay_s > 0:
                await asyncio.sleep(decision.delay_s)
        fault = decision.fault if decision else None
        if fault is Fault.SLOWDOWN:
            return self._error(request, 503)
        if fault is Fault.ERROR_500:
            return self._error(request, 500)
        headers = self._forward_headers(request)
        if fault is Fault.IGNORE_RANGE:
            headers = self._drop_range(request, headers)
            if headers is None:
                self._decider.refund(decision)
                decision, fault = None, None
                headers = self._forward_headers(request)
        shaped = decision is not None
        try:
            upstream = await self._session.request(
                request.method,
                URL(self.upstream_url + request.raw_path, encoded=True),
                headers=headers,
                data=self._request_body(request, plan, shaped) if request.body_exists else None,
                allow_redirects=False,
                skip_auto_headers=_SKIP_AUTO,
            )
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            if decision is not None:
                self._decider.refund(decision)
            return web.Response(status=502, text=f"fault proxy: upstream error: {exc!r}\n")
        try:
            return await self._relay(request, upstream, plan, decision, shaped)
        finally:
            upstream.close()

    async def _down(self, request: web.Request, plan: FaultPlan) -> web.StreamResponse:
        self._decider.record_down()
        if plan.down_mode == "503":
            return self._error(request, 503)
        if request.transport is not None:
            abort_with_rst(request.transport)
        if plan.down_mode == "refuse" and not self._refusing:
            # The plan was mutated directly: refuse from now on (update() lifts it).
            self._refusing = True
            await self._server.aclose_listener(abort_connections=True)
        return web.Response(status=503)  # never reaches the client

    def _error(self, request: web.Request, status: int) -> web.Response:
        code, message = _ERRORS[status]
        # Deterministic id (the request's number) so that runs can be compared.
        request_id = f"FAULTPROXY{request[_NUMBER]:06X}"
        return web.Response(
            status=status,
            body=s3_error_body(code, message, request.path, request_id),
            headers={"Content-Type": "application/xml", "x-amz-request-id": request_id},
        )

    @staticmethod
    def _forward_headers(request: web.Request) -> CIMultiDict:
        return CIMultiDict(
            (k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP
        )

    def _drop_range(self, request: web.Request, headers: CIMultiDict) -> CIMultiDict | None:
        """Headers without Range (re-signed if needed), or None if not possible."""
        if "Range" not in headers:
            return None
        auth = headers.get("Authorization")
        if auth is None:
            headers.popall("Range")
            return headers
        parsed = sigv4.parse_authorization(auth)
        if parsed is None or parsed[0] not in self.credentials:
            return None
        path, _, query = request.raw_path.partition("?")
        resigned = sigv4.resign_headers(
            request.method,
            path,
            query,
            dict(headers),
            secret_key=self.credentials[parsed[0]],
            removed=("range",),
        )
        return CIMultiDict(resigned) if resigned is not None else None

    def _shaper(self, plan: FaultPlan, shaped: bool) -> TransferShaper:
        if not shaped:
            return TransferShaper(self._limiter, None, None)
        return TransferShaper(self._limiter, plan.bandwidth_bps, plan.connection_bps)

    async def _request_body(
        self, request: web.Request, plan: FaultPlan, shaped: bool
    ) -> AsyncIterator[bytes]:
        shaper = self._shaper(plan, shaped)
        async for chunk in request.content.iter_chunked(shaper.chunk_size):
            await shaper.consume(len(chunk))
            self._count(up=len(chunk))
            yield chunk

    async def _relay(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        plan: FaultPlan,
        decision: Decision | None,
        shaped: bool,
    ) -> web.StreamResponse:
        fault = decision.fault if decision else None
        has_body = request.method != "HEAD" and upstream.status not in (204, 304)
        length = upstream.content_length if has_body else None
        buffered: bytes | None = None
        if fault in _BODY_FAULTS:
            cuttable = has_body and 200 <= upstream.status < 300
            if cuttable and length is None:
                buffered = await upstream.read()
                length = len(buffered)
            if not (cuttable and length):
                if fault is Fault.RESET:  # no body to cut: drop the connection instead
                    abort_with_rst(request.transport)
                    return web.Response(status=502)  # never reaches the client
                self._decider.refund(decision)
                fault = None
        headers = CIMultiDict(
            (k, v)
            for k, v in upstream.headers.items()
            if k.lower() not in HOP_BY_HOP and k.lower() != "content-length"
        )
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)
        if request.method == "HEAD" and upstream.content_length is not None:
            response.content_length = upstream.content_length
        elif has_body and length is not None:
            response.content_length = length
        try:
            await response.prepare(request)
        except ConnectionError:  # the client went away before the headers: nothing more to send
            return response
        if not has_body:
            await response.write_eof()
            return response
        cut = min(int(decision.position * length), length - 1) if fault in _BODY_FAULTS else None
        try:
            await self._stream(response, upstream, buffered, fault, cut, self._shaper(plan, shaped))
        except (ConnectionError, aiohttp.ClientError, asyncio.TimeoutError):
            # The client went away, or the upstream broke mid-body: pass the break on.
            abort_with_rst(request.transport)
            return response
        if fault is Fault.RESET:
            abort_with_rst(request.transport)
        elif fault is Fault.TRUNCATE:
            request.transport.close()  # flushes what was written, then FIN
        else:
            await response.write_eof()
        return response

    async def _stream(
        self,
        response: web.StreamResponse,
        upstream: aiohttp.ClientResponse,
        buffered: bytes | None,
        fault: Fault | None,
        cut: int | None,
        shaper: TransferShaper,
    ) -> None:
        """Write the body, flipping the byte at ``cut`` or stopping there."""
        stops = fault in (Fault.RESET, Fault.TRUNCATE)
        sent = 0
        async for chunk in self._iter_chunks(upstream, buffered, shaper.chunk_size):
            if fault is Fault.FLIP and sent <= cut < sent + len(chunk):
                flipped = bytearray(chunk)
                flipped[cut - sent] ^= 0xFF
                chunk = bytes(flipped)
            elif stops and sent + len(chunk) > cut:
                chunk = chunk[: cut - sent]
            if chunk:
                await shaper.consume(len(chunk))
                # counted before the write: the client may hold every byte (and the test read the
                # counter) before this thread runs again after write() returns
                self._count(down=len(chunk))
                try:
                    await response.write(chunk)
                except BaseException:
                    self._count(down=-len(chunk))
                    raise
                sent += len(chunk)
            if stops and sent >= cut:
                return

    @staticmethod
    async def _iter_chunks(
        upstream: aiohttp.ClientResponse, buffered: bytes | None, size: int
    ) -> AsyncIterator[bytes]:
        if buffered is not None:
            for start in range(0, len(buffered), size):
                yield buffered[start : start + size]
            return
        async for chunk in upstream.content.iter_chunked(size):
            yield chunk
