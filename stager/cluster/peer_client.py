"""Asking peers: signed ranged GETs streamed into a sink, health checks, every failure a PeerError by kind.

One aiohttp session for all peers' blob requests (at most ``per_peer``
connections to each), over TLS when the cluster uses it, and a second one for
health checks alone: a relay request holds its connection for as long as
the peer's own origin fetch takes, and a check queued behind such requests
would time out and have a busy peer taken for a dead one. Every request has a deadline: a
connection within ``connect_timeout``, the first byte within ``idle_timeout``
(``first_byte_timeout`` for a request the peer may have to fetch from the
origin first, in ``relay`` or ``fetch`` mode: under a slow shared origin its
queue is long, and asking the origin ourselves instead would read the blob
twice through the same link), no pause longer than ``idle_timeout`` between
bytes after that, and the whole body within that wait plus ``deadline`` plus
the time it takes at ``min_rate``. A peer that died meanwhile is found by
its reset connection or the health checks, not by these waits: when the
health checks find a peer down (:meth:`PeerClient.abandon`), every request
still waiting on it ends at once as ``down``. aiohttp's errors are translated here, once, into
:class:`~stager.errors.PeerError` with a ``kind`` (``down``, ``timeout``,
``refused``, ``missing``, ``corrupt``, ``protocol``) that the engine's
fallback and the failure counters use.
A ``hold`` request may be answered with the start of its range alone (what
the peer holds): the blocks received are kept and the caller asks the next
source for the rest.

Which requests to a peer go first (``per_peer`` at once, the rest waiting;
:class:`~.turns.Turns`): those a consumer is blocked on (the engine's live
priority of the span, ``URGENT`` and below; they are marked ``urgent`` for
the peer), then the *first* request for each blob before the second for any,
and so on (ties by the engine's priority: nearer blobs first). So a node
asks a peer for every blob it needs from it at once, not one blob after
another, and the peer, which sends first the block with the fewest copies
outside it (``uplink.py``), spreads the first copies of all of them over its
children.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import aiohttp

from ..aio import to_the_end
from ..engine import URGENT
from ..errors import BlobSourceError, CacheError, CorruptData, PeerError
from ..store.base import RangeSink, feed_sink
from .auth import PeerAuth
from .request import BLOBS_PATH, PeerRequest
from .turns import Turns


def _no_priority() -> float:
    return 0.0


@dataclass(frozen=True, slots=True)
class PeerTimeouts:
    """How long a peer may take (seconds; ``min_rate`` in bytes per second)."""

    connect_timeout: float = 2.0
    idle_timeout: float = 10.0
    first_byte_timeout: float = 60.0
    deadline: float = 20.0
    min_rate: float = 4 << 20
    health_timeout: float = 2.0


class PeerClient:
    """Signed requests to peers. Use one per node; :meth:`close` when done."""

    def __init__(self, auth: PeerAuth, asker: Callable[[], str], *, ssl_context: ssl.SSLContext | None = None,
                 timeouts: PeerTimeouts = PeerTimeouts(), per_peer: int = 8) -> None:
        self.auth = auth
        self._asker = asker
        self._ssl = ssl_context
        self.timeouts = timeouts
        self.per_peer = per_peer
        self._session: aiohttp.ClientSession | None = None
        self._health_session: aiohttp.ClientSession | None = None
        self._gone: dict[str, asyncio.Event] = {}  # per peer: set when it is found down
        self._turns: dict[str, Turns] = {}  # per peer: its requests at once, the most urgent first
        self._asking: dict[tuple[str, str], int] = {}  # per (peer, digest): requests queued or open
        self._scheme = "https" if ssl_context is not None else "http"

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit_per_host=self.per_peer, ssl=self._ssl or False,
                                             keepalive_timeout=30)
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        return self._session

    def _health_client(self) -> aiohttp.ClientSession:
        if self._health_session is None or self._health_session.closed:
            connector = aiohttp.TCPConnector(limit_per_host=1, ssl=self._ssl or False, keepalive_timeout=30)
            self._health_session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        return self._health_session

    def url(self, peer: str, path: str) -> str:
        return f"{self._scheme}://{peer}{path}"

    async def healthy(self, peer: str) -> bool | None:
        """True if ``peer`` answers ``GET /healthz`` with 200; False if it refuses or answers otherwise;
        None if it does not answer within the health timeout (busy, or gone: the caller counts these)."""
        timeout = aiohttp.ClientTimeout(total=self.timeouts.health_timeout)
        try:
            async with self._health_client().get(self.url(peer, "/healthz"), timeout=timeout) as response:
                return response.status == 200
        except asyncio.TimeoutError:
            return None
        except (aiohttp.ClientError, OSError, ValueError):
            return False

    def _timeout(self, nbytes: int, mode: str = "hold") -> aiohttp.ClientTimeout:
        """The request's limits; ``sock_read`` bounds the wait for the answer (the server answers with the
        first block), the pauses in the body are bounded by :meth:`read_into` itself."""
        t = self.timeouts
        first = t.idle_timeout if mode == "hold" else max(t.idle_timeout, t.first_byte_timeout)
        return aiohttp.ClientTimeout(total=first + t.deadline + nbytes / t.min_rate, sock_connect=t.connect_timeout,
                                     sock_read=first)

    def abandon(self, peer: str) -> None:
        """``peer`` was found down: every request waiting on it now ends with PeerError (kind ``down``)."""
        gone = self._gone.pop(peer, None)
        if gone is not None:
            gone.set()

    async def read_into(self, peer: str, ask: PeerRequest, open_sink: Callable[[], RangeSink], *,
                        priority: Callable[[], float] = _no_priority) -> int:
        """Stream the range ``ask`` names from ``peer`` into a new sink; the bytes received.

        ``priority`` is the engine's priority of the request, read live: it orders the requests waiting for
        one of the peer's ``per_peer`` turns (see the module doc), and at ``URGENT`` or below the request is
        marked urgent for the peer.

        Raises:
            PeerError: the peer is down (or found down meanwhile), slow, refuses, lacks the blob, sends a
                short body, or bytes the sink finds corrupt (kind ``corrupt``).
        """
        gone = self._gone.setdefault(peer, asyncio.Event())
        request = asyncio.ensure_future(self._in_turn(peer, ask, open_sink, priority))
        waiter = asyncio.ensure_future(gone.wait())
        try:
            await asyncio.wait((request, waiter), return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            if not request.done():  # found down, or our caller was cancelled: the request ends here
                request.cancel()
                await asyncio.gather(request, return_exceptions=True)
        if request.cancelled():
            raise PeerError(f"peer {peer}: found down while this request waited on it", "down")
        return request.result()

    def turns(self, peer: str) -> Turns:
        """The peer's request turns (made on its first request)."""
        turns = self._turns.get(peer)
        if turns is None:
            turns = self._turns[peer] = Turns(self.per_peer, max_overtaken=4 * self.per_peer)
        return turns

    async def _in_turn(self, peer: str, ask: PeerRequest, open_sink: Callable[[], RangeSink],
                       priority: Callable[[], float]) -> int:
        """The request once it is its turn: urgent first, then by how many requests for the same blob went
        to this peer before it (its first request for each blob before the second for any), then priority."""
        asking = (peer, ask.digest)
        ordinal = self._asking.get(asking, 0)
        self._asking[asking] = ordinal + 1
        try:
            def key() -> tuple[int, int, float]:
                now = priority()
                return (0, 0, now) if now <= URGENT else (1, ordinal, now)

            async with self.turns(peer).turn(key):
                if priority() <= URGENT and not ask.urgent:
                    ask = dataclasses.replace(ask, urgent=True)
                return await self._read_into(peer, ask, open_sink)
        finally:
            left = self._asking[asking] - 1
            if left:
                self._asking[asking] = left
            else:
                del self._asking[asking]

    async def _read_into(self, peer: str, ask: PeerRequest, open_sink: Callable[[], RangeSink]) -> int:
        expected = ask.end - ask.start
        headers = {**ask.headers(), **self.auth.sign("GET", ask.digest, ask.start, ask.end, ask.context())}
        try:
            async with self._client().get(self.url(peer, BLOBS_PATH + ask.digest), params=ask.query(),
                                          headers=headers, timeout=self._timeout(expected, ask.mode)) as response:
                _check_status(peer, response.status)
                asked, expected = expected, response.content_length
                if not _answer_fits(ask, expected):
                    raise PeerError(f"peer {peer}: answered {expected} bytes for a range of {asked}"
                                    + (" (in hold mode, a block-aligned start of it)" if ask.mode == "hold" else ""),
                                    "protocol")
                received = 0

                async def chunks() -> AsyncIterator[bytes]:
                    nonlocal received
                    while True:
                        async with asyncio.timeout(self.timeouts.idle_timeout):
                            chunk = await response.content.readany()
                        if not chunk:
                            break
                        received += len(chunk)
                        if received > expected:
                            raise PeerError(f"peer {peer}: sent more than {expected} bytes", "protocol")
                        yield chunk
                    if received != expected:
                        raise PeerError(f"peer {peer}: sent {received} of {expected} bytes", "protocol")

                if expected == asked:
                    await feed_sink(open_sink(), chunks())
                    return received
                # The start of the range (hold mode): its blocks are recorded as each is verified; the sink,
                # whose span goes on, is settled without its end, and the caller asks elsewhere for the rest.
                sink = open_sink()
                try:
                    async for chunk in chunks():
                        await sink.write(chunk)
                finally:
                    await to_the_end(sink.abort())
                return received
        except (CorruptData, BlobSourceError) as exc:  # the engine's sink found bytes that fail verification
            if isinstance(exc, PeerError):
                raise
            raise PeerError(f"peer {peer}: {exc}", "corrupt") from exc
        except (CacheError, asyncio.CancelledError):
            raise  # this node's own disk, or its caller: nothing to hold against the peer
        except (asyncio.TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise _translated(peer, exc) from exc

    async def read(self, peer: str, ask: PeerRequest) -> bytes:
        """The range in memory (for the engine's hedge). Raises like :meth:`read_into` (no verification)."""
        parts: list[bytes] = []

        class _Collect(RangeSink):
            async def write(self, chunk: bytes) -> None:
                parts.append(chunk)

            async def close(self) -> None:
                pass

            async def abort(self) -> None:
                parts.clear()

        if await self.read_into(peer, ask, _Collect) != ask.end - ask.start:
            raise PeerError(f"peer {peer}: holds only the start of the range", "missing")
        return b"".join(parts)

    async def head(self, peer: str, ask: PeerRequest) -> bool:
        """True if ``peer`` holds the range verified now. Raises PeerError as :meth:`read_into`."""
        headers = {**ask.headers(), **self.auth.sign("HEAD", ask.digest, ask.start, ask.end, ask.context())}
        try:
            async with self._client().head(self.url(peer, BLOBS_PATH + ask.digest), params=ask.query(),
                                           headers=headers, timeout=self._timeout(0)) as response:
                if response.status == 404:
                    return False
                _check_status(peer, response.status)
                return True
        except PeerError:
            raise
        except (asyncio.TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise _translated(peer, exc) from exc

    async def close(self) -> None:
        for session in (self._session, self._health_session):
            if session is not None:
                await session.close()
        self._session = self._health_session = None


def _answer_fits(ask: PeerRequest, length: int | None) -> bool:
    """The whole range; or, in ``hold`` mode, a non-empty block-aligned start of it (what the peer holds)."""
    expected = ask.end - ask.start
    if length == expected:
        return True
    if ask.mode != "hold" or length is None or not 0 < length < expected:
        return False
    return (ask.start + length) % ask.block_size == 0


def _translated(peer: str, exc: BaseException) -> PeerError:
    """aiohttp's and the socket's errors as the one error of a peer request, by kind."""
    if isinstance(exc, asyncio.TimeoutError):
        return PeerError(f"peer {peer}: no answer within the deadline", "timeout")
    if isinstance(exc, aiohttp.ClientPayloadError):
        return PeerError(f"peer {peer}: the body was cut short ({exc})", "protocol")
    return PeerError(f"peer {peer}: unreachable ({exc})", "down")


def _check_status(peer: str, status: int) -> None:
    if status == 200:
        return
    if status == 404:
        raise PeerError(f"peer {peer}: neither holds the blob nor fetches it for this node", "missing")
    if status == 401:
        raise PeerError(f"peer {peer}: refused the request (401: is the cluster secret the same on both nodes, "
                        "and are their clocks within 30 s?)", "refused")
    if status == 503:
        raise PeerError(f"peer {peer}: is stopping (503)", "down")
    raise PeerError(f"peer {peer}: answered HTTP {status}", "protocol")
