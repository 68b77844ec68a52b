"""What the HTTP and S3 stores share: their session, one ranged or whole GET, error answers.

One :class:`~stager.store.wire.WireSession` per store, bound to the loop that
first uses it. The pool allows ``concurrency`` connections (more would only
queue on the server); bodies are never decompressed (we verify the bytes the
origin stores) and arrive as views of the session's receive buffers. There is
no timeout here: each attempt runs under the
:class:`~stager.store.retry.RetryPolicy`'s ``asyncio.timeout``.
"""

from __future__ import annotations

import contextlib
import email.utils
import re
from typing import AsyncIterator, Callable, Mapping

from ..errors import OriginError, TransientOriginError
from .base import RangeSink, feed_sink
from .range_body import range_chunks, read_range_body
from .stats import OriginStats
from .translate import error_for_status, translated
from .wire import Response, WireSession

#: Error bodies longer than this are not read (only their status counts).
MAX_ERROR_BODY = 64 * 1024

_XML_CODE = re.compile(rb"<Code>\s*([^<]{1,128}?)\s*</Code>")
_XML_MESSAGE = re.compile(rb"<Message>\s*([^<]{0,512}?)\s*</Message>")


def new_session(concurrency: int, headers: dict[str, str] | None = None) -> WireSession:
    """A session with a pool of ``concurrency`` connections."""
    return WireSession(concurrency, headers)


async def error_from_response(resp: Response, what: str) -> OriginError:
    """The stager error for a non-2xx answer, using the S3 error code in its body if there is one."""
    code = detail = None
    declared = resp.content_length
    if resp.method != "HEAD" and (declared is None or declared <= MAX_ERROR_BODY):
        try:
            body = await resp.content.read(MAX_ERROR_BODY)
        except OSError:
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
async def _good_answer(session: WireSession, url: str, headers: Mapping[str, str] | None,
                       what: str, allow_redirects: bool) -> AsyncIterator[Response]:
    """One GET whose answer is 2xx (else its stager error is raised); errors translated."""
    with translated(what):
        async with session.get(url, headers=headers, allow_redirects=allow_redirects) as resp:
            if resp.status >= 300:
                raise await error_from_response(resp, what)
            yield resp


async def fetch_range(session: WireSession, url: str, headers: Mapping[str, str], start: int, end: int, what: str,
                      stats: OriginStats, *, allow_redirects: bool = False) -> bytes:
    """One GET of ``[start, end)`` (``headers`` must carry the Range); errors translated."""
    async with _good_answer(session, url, headers, what, allow_redirects) as resp:
        return await read_range_body(resp, start, end, what, stats)


async def stream_range(session: WireSession, url: str, headers: Mapping[str, str], start: int, end: int, what: str,
                       stats: OriginStats, sink: Callable[[], RangeSink], *, allow_redirects: bool = False) -> None:
    """One GET of ``[start, end)`` streamed into a new ``sink()`` as it arrives; errors translated.

    The sink is opened once the answer's status is known good, and aborted if
    the body turns out wrong (see :func:`~stager.store.range_body.range_chunks`).
    A sink that offers memory of its own (:meth:`RangeSink.receive_into`) has
    the body received straight into it.
    """
    async with _good_answer(session, url, headers, what, allow_redirects) as resp:
        opened = sink()
        target = opened.receive_into()
        if target is not None and resp.content_length == end - start == len(target):
            resp.receive_into(target)  # (range_chunks still checks the headers before the first chunk)
        async with contextlib.aclosing(range_chunks(resp, start, end, what, stats)) as chunks:
            await feed_sink(opened, chunks)


async def fetch_all(
    session: WireSession, url: str, headers: Mapping[str, str] | None, what: str, stats: OriginStats,
    *, allow_redirects: bool = False,
) -> bytes:
    """One GET of a whole object, its length checked against Content-Length; errors translated."""
    async with _good_answer(session, url, headers, what, allow_redirects) as resp:
        data = await resp.read()
    stats.bytes_read += len(data)
    if resp.content_length is not None and len(data) != resp.content_length:
        raise TransientOriginError(f"{what}: body has {len(data)} bytes, expected {resp.content_length}")
    return data


def last_modified(resp: Response) -> float | None:
    """The Last-Modified header as epoch seconds, or None."""
    value = resp.headers.get("Last-Modified")
    if not value:
        return None
    try:
        return email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
