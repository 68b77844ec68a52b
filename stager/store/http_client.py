"""What the HTTP and S3 stores share: the aiohttp session, one ranged or whole GET, error answers.

One :class:`aiohttp.ClientSession` per store, created lazily on the loop that
first uses it. The pool allows ``concurrency`` connections (more would only
queue on the server); bodies are never decompressed (we verify the bytes the
origin stores); the read buffer is large so a 8 MiB body arrives in few
chunks. There is no aiohttp timeout: each attempt runs under the
:class:`~stager.store.retry.RetryPolicy`'s ``asyncio.timeout``.
"""

from __future__ import annotations

import contextlib
import email.utils
import re
from typing import AsyncIterator, Callable, Mapping

import aiohttp
import yarl

from ..errors import OriginError, TransientOriginError
from .base import RangeSink, feed_sink
from .range_body import range_chunks, read_body, read_range_body
from .stats import OriginStats
from .translate import error_for_status, translated

#: aiohttp's per-connection read buffer: larger means fewer, bigger chunks per body.
READ_BUFSIZE = 1 << 20
#: Error bodies longer than this are not read (only their status counts).
MAX_ERROR_BODY = 64 * 1024

_XML_CODE = re.compile(rb"<Code>\s*([^<]{1,128}?)\s*</Code>")
_XML_MESSAGE = re.compile(rb"<Message>\s*([^<]{0,512}?)\s*</Message>")


def new_session(concurrency: int, headers: dict[str, str] | None = None) -> aiohttp.ClientSession:
    """A session with a pool of ``concurrency`` connections. Call from a running loop."""
    connector = aiohttp.TCPConnector(limit=max(1, concurrency), ttl_dns_cache=300)
    return aiohttp.ClientSession(
        connector=connector,
        headers={"Accept-Encoding": "identity", **(headers or {})},
        auto_decompress=False,
        read_bufsize=READ_BUFSIZE,
        timeout=aiohttp.ClientTimeout(total=None),
        raise_for_status=False,
    )


async def error_from_response(resp: aiohttp.ClientResponse, what: str) -> OriginError:
    """The stager error for a non-2xx answer, using the S3 error code in its body if there is one."""
    code = detail = None
    declared = resp.content_length
    if resp.method != "HEAD" and (declared is None or declared <= MAX_ERROR_BODY):
        try:
            body = await resp.content.read(MAX_ERROR_BODY)
        except (aiohttp.ClientError, OSError):
            body = b""
        if m := _XML_CODE.search(body):
            code = m.group(1).decode("utf-8", "replace")
        if m := _XML_MESSAGE.search(body):
            detail = m.group(1).decode("utf-8", "replace")
    resp.close()  # the rest of an error body is not worth a pooled connection
    return error_for_status(
        resp.status, what, code=code, detail=detail or resp.reason, retry_after=resp.headers.get("Retry-After")
    )


@contextlib.asynccontextmanager
async def _good_answer(session: aiohttp.ClientSession, url: yarl.URL, headers: Mapping[str, str] | None,
                       what: str) -> AsyncIterator[aiohttp.ClientResponse]:
    """One GET whose answer is 2xx (else its stager error is raised); errors translated."""
    with translated(what):
        async with session.get(url, headers=headers) as resp:
            if resp.status >= 300:
                raise await error_from_response(resp, what)
            yield resp


async def fetch_range(
    session: aiohttp.ClientSession,
    url: yarl.URL,
    headers: Mapping[str, str],
    start: int,
    end: int,
    what: str,
    stats: OriginStats,
) -> bytes:
    """One GET of ``[start, end)`` (``headers`` must carry the Range); errors translated."""
    async with _good_answer(session, url, headers, what) as resp:
        return await read_range_body(resp, start, end, what, stats)


async def stream_range(
    session: aiohttp.ClientSession,
    url: yarl.URL,
    headers: Mapping[str, str],
    start: int,
    end: int,
    what: str,
    stats: OriginStats,
    sink: Callable[[], RangeSink],
) -> None:
    """One GET of ``[start, end)`` streamed into a new ``sink()`` as it arrives; errors translated.

    The sink is opened once the answer's status is known good, and aborted if
    the body turns out wrong (see :func:`~stager.store.range_body.range_chunks`).
    """
    async with _good_answer(session, url, headers, what) as resp:
        async with contextlib.aclosing(range_chunks(resp, start, end, what, stats)) as chunks:
            await feed_sink(sink(), chunks)


async def fetch_all(
    session: aiohttp.ClientSession, url: yarl.URL, headers: Mapping[str, str] | None, what: str, stats: OriginStats
) -> bytes:
    """One GET of a whole object, its length checked against Content-Length; errors translated."""
    async with _good_answer(session, url, headers, what) as resp:
        data = await read_body(resp)
    stats.bytes_read += len(data)
    if resp.content_length is not None and len(data) != resp.content_length:
        raise TransientOriginError(f"{what}: body has {len(data)} bytes, expected {resp.content_length}")
    return data


def last_modified(resp: aiohttp.ClientResponse) -> float | None:
    """The Last-Modified header as epoch seconds, or None."""
    value = resp.headers.get("Last-Modified")
    if not value:
        return None
    try:
        return email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
