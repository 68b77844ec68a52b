"""Reading the body of an HTTP answer to a ranged GET, trusting nothing about it.

Shared by the plain HTTP and the S3 stores. An answer is accepted only if it
provably holds bytes ``[start, end)`` of the object:

- ``Content-Range: bytes start-(end-1)/total`` (with 206, or with 200 as
  ``rclone serve s3`` sends), a ``Content-Length`` of ``end - start`` if
  given, and a body of exactly that length;
- ``200`` without ``Content-Range``: the server ignored the Range header and
  sends the whole object. We skip ``start`` bytes, keep ``end - start`` and
  drop the connection instead of draining the rest;
- anything else (a 206 for other bytes, a multipart answer, a short body)
  is a :class:`~stager.errors.TransientOriginError`, retried. A ``total``
  smaller than ``end`` is an :class:`~stager.store.base.InvalidRange`.
"""

from __future__ import annotations

import contextlib
import re
from typing import TYPE_CHECKING, AsyncIterator

from ..errors import TransientOriginError
from .base import InvalidRange
from .stats import OriginStats

if TYPE_CHECKING:
    from .wire import Response

_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.IGNORECASE)

#: Bytes discarded per read when skipping to ``start`` in a whole-object answer.
SKIP_CHUNK = 1 << 20


def parse_content_range(value: str) -> tuple[int, int, int | None] | None:
    """``"bytes 0-99/1000"`` -> ``(0, 99, 1000)``; None if malformed. ``*`` total -> None."""
    m = _CONTENT_RANGE.match(value)
    if not m:
        return None
    total = None if m.group(3) == "*" else int(m.group(3))
    return int(m.group(1)), int(m.group(2)), total


def range_header(start: int, end: int) -> str:
    """The Range header value for ``[start, end)``, ``end > start``."""
    return f"bytes={start}-{end - 1}"


async def read_range_body(
    resp: Response, start: int, end: int, what: str, stats: OriginStats
) -> bytes:
    """The ``end - start`` bytes of a 200/206 answer to ``Range: bytes=start-(end-1)``, in memory.

    Raises as :func:`range_chunks`.
    """
    return b"".join([chunk async for chunk in range_chunks(resp, start, end, what, stats)])


async def range_chunks(
    resp: Response, start: int, end: int, what: str, stats: OriginStats
) -> AsyncIterator[bytes]:
    """The ``end - start`` bytes of a 200/206 answer to ``Range: bytes=start-(end-1)``, as they arrive.

    The headers are checked before the first chunk; the length after the last,
    so a consumer must treat what it took as unverified until the iteration
    ends without error. connection errors (reset, truncated body) propagate for
    the caller to translate.

    Raises:
        InvalidRange: the object is shorter than ``end``.
        TransientOriginError: the answer is not provably the asked bytes.
    """
    length = end - start
    declared = resp.content_length
    content_range = resp.headers.get("Content-Range")
    skip = 0
    whole_body = True  # the body is exactly the range (its length enforced by the client and below)
    if content_range is not None:
        parsed = parse_content_range(content_range)
        if parsed is None:
            raise TransientOriginError(f"{what}: malformed Content-Range {content_range!r}")
        first, last, total = parsed
        if total is not None and end > total:
            raise InvalidRange(f"{what}: past the end of the object ({total} bytes)")
        if (first, last) != (start, end - 1):
            raise TransientOriginError(f"{what}: asked {range_header(start, end)}, got {content_range!r}")
        if declared is not None and declared != length:
            raise TransientOriginError(f"{what}: Content-Length {declared} for a {length}-byte range")
    elif resp.status == 206:
        raise TransientOriginError(f"{what}: 206 answer without Content-Range (multipart ranges?)")
    else:
        stats.range_ignored += 1
        if declared is not None and end > declared:
            raise InvalidRange(f"{what}: past the end of the object ({declared} bytes)")
        if not (start == 0 and declared == length):
            skip, whole_body = start, False
    got = 0
    if whole_body:
        content = resp.content
        while True:  # ends at EOF; the client raises if the body is cut short
            chunk, end_of_http_chunk = await content.readchunk()
            if chunk:
                got += len(chunk)
                if got > length:  # chunked and longer than the range: never hand on a byte past it
                    break
                stats.bytes_read += len(chunk)
                yield chunk
            elif not end_of_http_chunk:  # (b"", True) only marks a chunk boundary
                break
    else:
        async with contextlib.aclosing(_slice_stream(resp, skip, length)) as sliced:
            async for chunk in sliced:
                got += len(chunk)
                stats.bytes_read += len(chunk)
                yield chunk
    if got != length:
        raise TransientOriginError(f"{what}: body has {got} bytes, expected {length}")


async def _slice_stream(resp: Response, start: int, length: int) -> AsyncIterator[bytes]:
    """Skip ``start`` bytes of the body, yield up to ``length``, then close the connection."""
    content = resp.content
    try:
        skipped = 0
        while skipped < start:  # each pass consumes >= 1 byte or ends the loop
            chunk = await content.read(min(SKIP_CHUNK, start - skipped))
            if not chunk:
                return
            skipped += len(chunk)
        got = 0
        while got < length:
            chunk = await content.read(length - got)
            if not chunk:
                break
            got += len(chunk)
            yield chunk
    finally:
        resp.close()  # the rest of the object is not wanted: drop the connection
