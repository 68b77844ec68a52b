"""A small HTTP/1.1 client for object stores: answer bodies land straight in our buffers.

The HTTP and S3 stores move every shard byte through here, so the client is
built for that one job. The socket is read with ``recv_into`` into fresh
1 MiB buffers (an :class:`asyncio.BufferedProtocol`) and the body is handed
on as memoryviews of them, never copied in Python and never written again,
so a consumer may keep what it is given. A general client (aiohttp) copies
each byte twice into new ``bytes`` before we see it, and costs a fifth of a
second to import, about a tenth of staging a gigabyte.

The buffers are page-aligned, and a body of known length is received so that
its byte ``k`` sits at an address congruent to ``k`` modulo :data:`PAGE`
(a few bytes of a buffer are skipped to get there). A body asked for from an
aligned offset of a file can then be written to that file with ``O_DIRECT``
straight from the views handed on, without a copy (see
:mod:`stager.cache.direct`). Only the body bytes that arrive with the headers
are not placed so; the first read of an answer is kept short for that reason.

What object stores need and no more: one request at a time per connection,
kept alive and pooled per origin; bodies by ``Content-Length``, chunked, or
until the connection closes; redirects for GET and HEAD when asked; TLS
with the system's certificates; request bodies from a buffer. There are no
timeouts here: each attempt runs under the retry policy's timeout, and a
cancelled exchange drops its connection.

Failures are :class:`OSError` subclasses, for :mod:`stager.store.translate`: a
reset, early close or malformed answer is a :class:`ConnectionError`
(retried); a redirect loop a plain :class:`OSError` (not retried).
"""

from __future__ import annotations

import asyncio
import mmap
import socket
import sys
import time
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any, Mapping
from urllib.parse import urljoin, urlsplit

from . import held

if TYPE_CHECKING:
    import ssl

#: Size of each receive buffer; a new one is started when less than MIN_RECV is left.
RECV_BUFFER = 1 << 20
MIN_RECV = 64 * 1024
#: Body bytes are placed at addresses congruent to their offset in the body modulo this.
PAGE = mmap.PAGESIZE
#: The most read while the answer's headers are awaited (the body bytes read with them are not aligned).
HEAD_RECV = 8 * 1024
#: Longest status line plus headers, and longest chunk-size or trailer line, accepted.
MAX_HEAD = 64 * 1024
MAX_LINE = 8 * 1024
#: Body bytes received but not yet taken before the socket stops being read (and resumes at half).
HIGH_WATER = 2 << 20
#: While a body of known length arrives, the kernel wakes us once this many of its bytes are in (or the
#: rest of the body, if less; ``SO_RCVLOWAT``): on a link that is slow per connection, each read then
#: takes a quarter MiB instead of whatever a few packets brought, and every read costs the same.
RECV_LOWAT = 256 * 1024
#: Bytes of receive buffers one session's connections may hold at once, views on their way to the disk
#: included. A connection that needs a buffer past this gets a small one of its own for one read, then
#: stops reading (its bytes wait in the kernel, the origin is slowed by TCP) until a buffer comes free.
RECV_BUDGET = 96 << 20
#: The size of that buffer of its own (room for a read of MIN_RECV after the skip that aligns a body).
PAST_BUDGET_RECV = MIN_RECV + PAGE
#: While connections wait for a buffer, the pool looks for one come free this often (seconds): a buffer
#: is freed where its last view is dropped, on a disk thread, which tells nobody.
BUFFER_POLL = 0.002
#: If no buffer has come free for this long while connections wait, the first of them reads on anyway
#: (once per this long), into a small buffer past the budget: whatever pins the buffers, nothing stalls.
BUFFER_STUCK = 0.25
#: Request bodies are handed to the transport in slices this large, waiting whenever it is full.
SEND_SLICE = 1 << 20
MAX_REDIRECTS = 10
REDIRECTS = frozenset({301, 302, 303, 307, 308})

_HEAD, _LENGTH, _UNTIL_CLOSE, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _DONE = range(8)


class ProtocolError(ConnectionError):
    """The answer broke HTTP/1.1 or ended early; the connection is dropped and the request may be retried."""


class RedirectLoop(OSError):
    """More than :data:`MAX_REDIRECTS` redirects: a configuration problem, not retried."""


class Headers(dict):
    """Answer headers, looked up case-insensitively (stored lower-case; repeated fields joined by ``", "``)."""

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return dict.get(self, name.lower(), default)

    def __getitem__(self, name: str) -> str:
        return dict.__getitem__(self, name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and dict.__contains__(self, name.lower())


class Response:
    """One answer: status and headers once :meth:`WireSession.request` yields it, then its body.

    ``content`` is the response itself, so code written for aiohttp's
    ``resp.content.readchunk()`` and ``resp.content.read(n)`` reads it too.
    """

    def __init__(self, connection: _Connection, method: str, url: str) -> None:
        self.method = method
        self.url = url
        self.status = 0
        self.reason = ""
        self.headers = Headers()
        self.content_length: int | None = None
        self.content = self
        self.reusable = False  # the connection may carry another request once this body has ended
        self.started = False  # a byte of the answer has arrived
        self._connection = connection
        self._state = _HEAD
        self._head = bytearray()
        self._line = bytearray()
        self._remaining = 0
        self._chunks: deque[list[Any]] = deque()  # [buffer, start, end], in order, contiguous ones merged
        self._queued = 0
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._head_done = asyncio.get_running_loop().create_future()
        self.target: memoryview | None = None  # where the rest of a body of known length is received
        self.urgent = held.urgency()  # a consumer waits on it (asked live): it never waits for a buffer

    @property
    def done(self) -> bool:
        """The whole body has been received (not necessarily taken)."""
        return self._state == _DONE

    # -- taking the body -------------------------------------------------------------------

    async def readchunk(self) -> tuple[memoryview | bytes, bool]:
        """The next received bytes as ``(view, False)``; ``(b"", False)`` at the end of the body.

        Raises :class:`ProtocolError` (or the connection's error) if the body
        was cut short, once the bytes before the cut have been taken.
        """
        entry = await self._take()
        if entry is None:
            return b"", False
        buffer, start, end = entry
        return memoryview(buffer)[start:end], False

    async def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes of the body (all of it if ``n < 0``); fewer only at its end."""
        parts: list[memoryview] = []
        got = 0
        while n < 0 or got < n:
            entry = await self._take()
            if entry is None:
                break
            buffer, start, end = entry
            if n >= 0 and got + end - start > n:
                keep = start + n - got
                self._chunks.appendleft([buffer, keep, end])
                self._queued += end - keep
                end = keep
            parts.append(memoryview(buffer)[start:end])
            got += end - start
        return b"".join(parts)

    async def _take(self) -> list[Any] | None:
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self._state == _DONE:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        entry = self._chunks.popleft()
        self._queued -= entry[2] - entry[1]
        if self._queued <= HIGH_WATER // 2:
            self._connection.resume()
        return entry

    def receive_into(self, target: memoryview) -> None:
        """Receive the rest of this body of known length straight into ``target`` (as long as the body):
        body byte ``k`` lands at ``target[k]``, and the chunks taken are views of ``target``."""
        if self._state == _LENGTH and self.content_length == len(target):
            self.target = memoryview(target).cast("B")

    def close(self) -> None:
        """Drop the connection: the rest of the body is not wanted."""
        self.reusable = False
        self._connection.close()

    # -- receiving (called by the connection) ------------------------------------------------

    @property
    def body_offset(self) -> int | None:
        """Body bytes received so far, while the body of known length arrives; else None."""
        if self._state == _LENGTH:
            assert self.content_length is not None
            return self.content_length - self._remaining
        return None

    @property
    def awaiting_head(self) -> bool:
        return self._state == _HEAD

    def feed(self, buffer: mmap.mmap | memoryview, pos: int, end: int) -> None:
        """Parse ``buffer[pos:end]``, just received."""
        self.started = True
        try:
            while pos < end and self._state != _DONE:
                state = self._state
                if state == _LENGTH or state == _CHUNK_DATA:
                    take = min(end - pos, self._remaining)
                    self._push(buffer, pos, pos + take)
                    pos += take
                    self._remaining -= take
                    if not self._remaining:
                        if state == _LENGTH:
                            self._finish()
                        else:
                            self._state = _CHUNK_END
                elif state == _UNTIL_CLOSE:
                    self._push(buffer, pos, end)
                    pos = end
                elif state == _HEAD:
                    pos = self._feed_head(buffer, pos, end)
                else:
                    pos = self._feed_line(buffer, pos, end)
        except ProtocolError as exc:
            self.fail(exc)
            self._connection.close()
            return
        if pos < end:  # bytes after the end of the answer: the connection cannot be trusted again
            self.reusable = False
        self._wake()

    def _feed_head(self, buffer: mmap.mmap, pos: int, end: int) -> int:
        before = len(self._head)
        self._head += memoryview(buffer)[pos:end]
        at = self._head.find(b"\r\n\r\n", max(0, before - 3))
        if at < 0:
            if len(self._head) > MAX_HEAD:
                raise ProtocolError(f"{self.url}: answer headers longer than {MAX_HEAD} bytes")
            return end
        head = bytes(self._head[:at])
        self._head.clear()
        self._parse_head(head)
        return pos + at + 4 - before

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        version, _, rest = lines[0].decode("latin-1").partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
            raise ProtocolError(f"{self.url}: not an HTTP/1.x status line: {lines[0][:80]!r}")
        headers = Headers()
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or not name or name != name.strip():
                raise ProtocolError(f"{self.url}: malformed header line {line[:80]!r}")
            key = name.decode("latin-1").lower()
            text = value.strip().decode("latin-1")
            headers[key] = f"{dict.__getitem__(headers, key)}, {text}" if dict.__contains__(headers, key) else text
        status = int(code)
        if 100 <= status < 200:
            if status == 101:
                raise ProtocolError(f"{self.url}: unexpected protocol switch")
            return  # informational: the real answer follows
        self.status, self.reason, self.headers = status, reason.strip(), headers
        length = headers.get("content-length")
        if length is not None:
            values = {v.strip() for v in length.split(",")}
            if len(values) != 1 or not next(iter(values)).isdigit():
                raise ProtocolError(f"{self.url}: invalid Content-Length {length!r}")
            self.content_length = int(values.pop())
        connection = {t.strip().lower() for t in headers.get("connection", "").split(",")}
        self.reusable = version == "HTTP/1.1" and "close" not in connection
        encoding = headers.get("transfer-encoding")
        if self.method == "HEAD" or status in (204, 304):
            self._finish()
        elif encoding is not None:
            if encoding.strip().lower() != "chunked":
                raise ProtocolError(f"{self.url}: unsupported Transfer-Encoding {encoding!r}")
            self.content_length = None
            self._state = _CHUNK_SIZE
        elif self.content_length is not None:
            self._remaining = self.content_length
            self._state = _LENGTH
            if not self._remaining:
                self._finish()
        else:
            self.reusable = False
            self._state = _UNTIL_CLOSE
        if not self._head_done.done():
            self._head_done.set_result(None)

    def _feed_line(self, buffer: mmap.mmap, pos: int, end: int) -> int:
        newline = buffer.find(b"\n", pos, end)
        stop = end if newline < 0 else newline + 1
        self._line += memoryview(buffer)[pos:stop]
        if len(self._line) > MAX_LINE:
            raise ProtocolError(f"{self.url}: chunked body line longer than {MAX_LINE} bytes")
        if newline < 0:
            return end
        line = bytes(self._line).rstrip(b"\r\n")
        self._line.clear()
        if self._state == _CHUNK_SIZE:
            size = line.partition(b";")[0].strip()
            if not size or len(size) > 16 or size.strip(b"0123456789abcdefABCDEF"):
                raise ProtocolError(f"{self.url}: invalid chunk size {line[:40]!r}")
            self._remaining = int(size, 16)
            self._state = _CHUNK_DATA if self._remaining else _TRAILER
        elif self._state == _CHUNK_END:
            if line:
                raise ProtocolError(f"{self.url}: chunk not followed by CRLF")
            self._state = _CHUNK_SIZE
        elif not line:  # _TRAILER: trailer fields are ignored up to the empty line
            self._finish()
        return stop

    def _push(self, buffer: mmap.mmap | memoryview, start: int, end: int) -> None:
        if start == end:
            return
        last = self._chunks[-1] if self._chunks else None
        if last is not None and last[0] is buffer and last[2] == start:
            last[2] = end
        else:
            self._chunks.append([buffer, start, end])
        self._queued += end - start
        if self._queued > HIGH_WATER:
            self._connection.pause()

    def _finish(self) -> None:
        self._state = _DONE
        self._connection.answered(self)
        if not self._head_done.done():
            self._head_done.set_result(None)

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def fail(self, exc: BaseException) -> None:
        """The connection broke (or the answer was malformed): end the answer with ``exc``."""
        if self._state == _DONE or self._error is not None:
            return
        self.reusable = False
        self._error = exc
        if not self._head_done.done():
            self._head_done.set_exception(exc)
            self._head_done.exception()  # retrieved here; raised to whoever awaits it
        self._wake()

    def ended_by_close(self) -> None:
        """The server closed the connection: the end of an until-close body, else a cut."""
        if self._state == _UNTIL_CLOSE:
            self._finish()
            self._wake()
        elif self._state != _DONE:
            where = "before answering" if self._state == _HEAD else "inside the body"
            self.fail(ProtocolError(f"{self.url}: the server closed the connection {where}"))

    async def head_received(self) -> None:
        await asyncio.shield(self._head_done)


#: Receive buffers are private anonymous memory: ``mmap``'s default for anonymous maps is shared,
#: which the kernel backs with shmem pages, slower to fault in and to free.
_PRIVATE_MEMORY = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS


class BufferPool:
    """Receive buffers, each used again only once nothing refers to it any more, within a budget.

    A body is handed on as views of the buffer it was received into, and a
    consumer may keep those as long as it likes (until its disk write is
    done), so a buffer cannot simply be returned after use. Instead it is
    taken again when its reference count says that no view, and nothing
    else, holds it. A new buffer would cost as much as the receiving itself:
    the kernel hands back fresh pages, zeroed and faulted in one by one.
    Buffers are anonymous memory maps, so they start on a page boundary.

    The pool keeps up to ``budget`` bytes of buffers. Past that, a connection
    is given a small buffer of its own (freed with its last view) for one
    read and told to wait: :meth:`wait_for_buffer` pauses it until one of the kept
    buffers comes free. So the bytes a session holds for its requests stay
    near the budget however many requests are in flight and however far the
    disk or the CPU falls behind the network; the rest waits in the kernel.

    Each pool registers with :mod:`.held`, which tells what every pool of the
    process holds in buffers that something still refers to: the memory that
    requests in flight cost, which the engine keeps within a budget.
    """

    def __init__(self, size: int = RECV_BUFFER, budget: int = RECV_BUDGET) -> None:
        self.size = size
        self._keep = max(1, budget // size)
        self._buffers: deque[mmap.mmap] = deque()
        self._waiting: deque[_Connection] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._handed_at = 0.0  # when a waiter was last told to read on
        self.stuck = 0  # times a waiter read on past the budget because nothing came free
        held.register_pool(self)

    def take(self) -> tuple[mmap.mmap, bool]:
        """A buffer, and whether it is within the budget (if not, the taker is to :meth:`wait_for_buffer`
        before it takes another)."""
        buffers = self._buffers
        for _ in range(len(buffers)):  # the oldest first: the likeliest to be free
            buffer = buffers[0]
            buffers.rotate(-1)
            if sys.getrefcount(buffer) <= 3:  # the deque, ``buffer`` and getrefcount's argument
                return buffer, True
        if len(buffers) < self._keep:
            buffer = mmap.mmap(-1, self.size, flags=_PRIVATE_MEMORY)
            buffers.append(buffer)
            return buffer, True
        # past the budget: a small one for one read, not kept (alive only while a view of it is)
        size = min(self.size, PAST_BUDGET_RECV)
        buffer = mmap.mmap(-1, size, flags=_PRIVATE_MEMORY)
        held.BYTES.grow(size)
        weakref.finalize(buffer, held.BYTES.grow, -size)
        return buffer, False

    def bytes_in_use(self) -> int:
        """Bytes of the kept buffers that something refers to (a connection filling it, or views)."""
        return self.size * (len(self._buffers) - self._free())

    def wait_for_buffer(self, connection: "_Connection") -> None:
        """Call ``connection.buffer_free()`` once a kept buffer is free (in turn with other waiters)."""
        if not self._waiting:
            self._handed_at = time.monotonic()
        self._waiting.append(connection)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(BUFFER_POLL, self._hand_out)

    def stop_waiting(self, connection: "_Connection") -> None:
        try:
            self._waiting.remove(connection)
        except ValueError:
            pass

    def _hand_out(self) -> None:
        self._timer = None
        free = self._free()
        now = time.monotonic()
        if not free and now - self._handed_at >= BUFFER_STUCK:
            free = 1  # nothing came free for a while: one reads on past the budget
            self.stuck += 1
        if free:
            self._handed_at = now
        while free and self._waiting:
            self._waiting.popleft().buffer_free()
            free -= 1
        if self._waiting:
            self._timer = asyncio.get_running_loop().call_later(BUFFER_POLL, self._hand_out)

    def _free(self) -> int:
        # getrefcount's own argument and the loop variable hold it too, besides the deque
        return sum(1 for buffer in self._buffers if sys.getrefcount(buffer) <= 3)


class _Connection(asyncio.BufferedProtocol):
    """One kept-alive connection; receives into pooled buffers and feeds the answer in progress."""

    def __init__(self, pool: BufferPool) -> None:
        self._pool = pool
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._buffer: mmap.mmap | bytearray = bytearray()
        self._filled = 0
        self._into: memoryview | None = None  # the last get_buffer gave this view of an answer's target
        self._response: Response | None = None
        self._paused = False  # for the answer's consumer, whose queue is full
        self._starved = False  # for a receive buffer, the pool's budget being spent
        self._over_budget = False  # the buffer being filled is past the pool's budget
        self._stopped = False  # reading is paused (for either reason)
        self._writable: asyncio.Future[None] | None = None
        self._socket: Any = None  # the TCP socket, for its low-water mark (None: not settable)
        self._lowat = 1  # the socket's SO_RCVLOWAT now

    def expect(self, response: Response) -> None:
        self._response = response
        self._set_lowat()  # the answer's head comes at once

    def answered(self, response: Response) -> None:
        if self._response is response:
            self._response = None

    def let_go_of_buffer(self) -> None:
        """Idle: stop pinning the receive buffer (what is left of it goes back with the views' end)."""
        if self._buffer:
            held.RECEIVING.grow(-1)
        self._buffer = bytearray()
        self._filled = 0

    # -- asyncio protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if transport.get_extra_info("ssl_object") is None:  # TLS reads ahead of what it hands on
                self._socket = sock

    def get_buffer(self, sizehint: int) -> memoryview:
        response = self._response
        body_offset = response.body_offset if response is not None else None
        if body_offset is not None and response.target is not None:  # type: ignore[union-attr]
            self.let_go_of_buffer()  # what it holds stays alive while queued views of it do
            self._into = response.target[body_offset:]  # type: ignore[union-attr]
            return self._into
        # Bytes skipped so that body byte k lands at an address congruent to k modulo PAGE.
        skip = (body_offset - self._filled) % PAGE if body_offset is not None else 0
        if len(self._buffer) - self._filled - skip < MIN_RECV:
            # Never the rest of a buffer given up: views of what it holds may still be kept.
            if not self._buffer:
                held.RECEIVING.grow(1)
            self._buffer, within = self._pool.take()
            self._over_budget = not within
            self._filled = 0
            skip = body_offset % PAGE if body_offset is not None else 0
        self._filled += skip
        view = memoryview(self._buffer)[self._filled:]
        if response is None or response.awaiting_head:
            return view[:HEAD_RECV]
        return view

    def buffer_updated(self, nbytes: int) -> None:
        if self._into is not None:  # into the answer's own target, at the body's offset
            assert self._response is not None and self._response.target is not None
            start = len(self._response.target) - len(self._into)
            self._into = None
            self._response.feed(self._response.target, start, start + nbytes)
            self._set_lowat()
            return
        start = self._filled
        self._filled += nbytes
        if self._response is None:  # bytes nobody asked for: this connection cannot be trusted
            self.close()
            return
        self._response.feed(self._buffer, start, self._filled)
        self._set_lowat()
        if self._over_budget and not self.closed:  # read once into a buffer of its own: now wait for one
            self._over_budget = False
            if self._response is None or self._response.urgent():
                return  # the answer has ended, or a consumer waits on it (it reads on, a small buffer at a time)
            self.let_go_of_buffer()  # what it holds stays alive while queued views of it do
            self._starved = True
            self._pool.wait_for_buffer(self)
            self._set_reading()

    def _set_lowat(self) -> None:
        """Wake for ``RECV_LOWAT`` of the body at a time, or for its rest; for anything else, at once."""
        response = self._response
        offset = response.body_offset if response is not None else None
        want = 1 if offset is None else max(1, min(RECV_LOWAT, response.content_length - offset))  # type: ignore
        if want != self._lowat and self._socket is not None and not self.closed:
            try:
                self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
                self._lowat = want
            except OSError:  # not settable here: reads go as they come
                self._socket = None

    def idle(self) -> None:
        """Kept alive for a later request: no buffer pinned, and read (to see the server close it), whatever
        it was waiting for."""
        self.let_go_of_buffer()
        was_stopped = self._stopped
        self._forget_pauses()
        if was_stopped and self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def buffer_free(self) -> None:
        """A kept buffer came free (told by the pool): read again, unless the consumer's queue is full."""
        self._starved = False
        self._set_reading()

    def eof_received(self) -> bool:
        self.closed = True
        if self._response is not None:
            self._response.ended_by_close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.let_go_of_buffer()
        self._forget_pauses()
        if self._response is not None:
            if exc is None:
                self._response.ended_by_close()
            else:
                self._response.fail(exc)
        if self._writable is not None and not self._writable.done():
            self._writable.set_exception(exc or ProtocolError("the connection closed while sending"))
            self._writable.exception()

    def pause_writing(self) -> None:
        if self._writable is None or self._writable.done():
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    # -- used by the session -----------------------------------------------------------------

    async def send(self, head: bytes, body: bytes | memoryview | None) -> None:
        assert self.transport is not None
        self.transport.write(head)
        if body:
            view = memoryview(body)
            for at in range(0, len(view), SEND_SLICE):
                if self.closed:
                    raise ProtocolError("the connection closed while sending")
                self.transport.write(view[at:at + SEND_SLICE])
                if self._writable is not None:
                    await asyncio.shield(self._writable)

    def pause(self) -> None:
        """Stop reading: the answer's consumer has a full queue."""
        if not self._paused:
            self._paused = True
            self._set_reading()

    def resume(self) -> None:
        """Read again (unless waiting for a buffer): the consumer took from its queue."""
        if self._paused:
            self._paused = False
            self._set_reading()

    def _set_reading(self) -> None:
        stop = self._paused or self._starved
        if stop == self._stopped or self.transport is None or self.closed:
            return
        self._stopped = stop
        held.PAUSED.grow(1 if stop else -1)
        if stop:
            self.transport.pause_reading()
        else:
            self.transport.resume_reading()

    def _forget_pauses(self) -> None:
        if self._starved:
            self._pool.stop_waiting(self)
        self._paused = self._starved = False
        if self._stopped:
            self._stopped = False
            held.PAUSED.grow(-1)

    def close(self) -> None:
        self._forget_pauses()
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


_Key = tuple[str, str, int]


class WireSession:
    """A pool of kept-alive connections, at most ``limit`` in use at once, and the requests over them.

    Create it anywhere; it binds to the event loop that first uses it.
    Its connections hold about ``recv_budget`` bytes of receive buffers at
    most (see :class:`BufferPool`). ``headers`` go with every request (``Accept-Encoding: identity``: we
    verify the bytes the origin stores, so bodies are never decompressed).
    """

    def __init__(self, limit: int, headers: Mapping[str, str] | None = None, *,
                 recv_budget: int | None = None) -> None:
        self._limit = max(1, limit)
        self._slots: asyncio.Semaphore | None = None
        self._idle: dict[_Key, list[_Connection]] = {}
        self._headers = {"Accept-Encoding": "identity", "User-Agent": "stager", **(headers or {})}
        self._ssl: ssl.SSLContext | None = None
        self._pool = BufferPool(budget=RECV_BUDGET if recv_budget is None else recv_budget)
        self.closed = False

    def get(self, url: Any, headers: Mapping[str, str] | None = None, *,
            allow_redirects: bool = False) -> _Exchange:
        """``async with session.get(url) as resp``: the answer's status and headers, then its body."""
        return _Exchange(self, "GET", str(url), headers, None, allow_redirects)

    def head(self, url: Any, headers: Mapping[str, str] | None = None, *, allow_redirects: bool = False) -> _Exchange:
        return _Exchange(self, "HEAD", str(url), headers, None, allow_redirects)

    def put(self, url: Any, data: bytes | memoryview, headers: Mapping[str, str] | None = None) -> _Exchange:
        return _Exchange(self, "PUT", str(url), headers, data, False)

    def request(self, method: str, url: Any, headers: Mapping[str, str] | None = None,
                body: bytes | memoryview | None = None) -> _Exchange:
        """Any other method (``POST``, ``DELETE``); a ``body`` (even empty) goes with its Content-Length."""
        return _Exchange(self, method, str(url), headers, body, False)

    async def close(self) -> None:
        """Close the idle connections; those in use close when their exchange ends."""
        self.closed = True
        for pool in self._idle.values():
            for connection in pool:
                connection.close()
        self._idle.clear()

    # -- internals ---------------------------------------------------------------------------

    async def acquire_slot(self) -> None:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._limit)
        await self._slots.acquire()

    def release_slot(self) -> None:
        assert self._slots is not None
        self._slots.release()

    async def connection(self, key: _Key, *, fresh: bool = False) -> tuple[_Connection, bool]:
        """A connection to ``key``: an idle one (True), or a new one (False) if none or ``fresh``."""
        pool = self._idle.get(key)
        while pool and not fresh:
            connection = pool.pop()
            if not connection.closed:
                return connection, True
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        if scheme == "https":
            _, connection = await loop.create_connection(lambda: _Connection(self._pool), host, port,
                                                         ssl=self._ssl_context(), server_hostname=host)
        else:
            _, connection = await loop.create_connection(lambda: _Connection(self._pool), host, port)
        return connection, False

    def drop_idle(self, key: _Key) -> None:
        """Close the idle connections to ``key`` (one turned out closed by the server: so may the rest)."""
        for connection in self._idle.pop(key, []):
            connection.close()

    def give_back(self, key: _Key, connection: _Connection) -> None:
        pool = self._idle.setdefault(key, [])
        if self.closed or connection.closed or len(pool) >= self._limit:
            connection.close()
        else:
            connection.idle()
            pool.append(connection)

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            import ssl

            self._ssl = ssl.create_default_context()
        return self._ssl

    def request_head(self, method: str, url: str, headers: Mapping[str, str] | None,
                     body: bytes | memoryview | None) -> tuple[_Key, bytes]:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url}: not an http(s) URL")
        port = parts.port or (443 if scheme == "https" else 80)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        fields = {"host": ("Host", parts.netloc.rpartition("@")[2])}  # replaced by a Host given (signed)
        for name, value in (*self._headers.items(), *(headers or {}).items()):
            fields[name.lower()] = (name, str(value))
        if body is not None:
            fields["content-length"] = ("Content-Length", str(len(body)))
        lines = [f"{method} {target} HTTP/1.1"]
        for name, value in fields.values():
            if not name or any(c in name or c in value for c in "\r\n\0") or ":" in name:
                raise ValueError(f"{url}: header {name!r} has a forbidden character")
            lines.append(f"{name}: {value}")
        text = "\r\n".join(lines) + "\r\n\r\n"
        return (scheme, parts.hostname, port), text.encode("latin-1")


class _Exchange:
    """``async with``: one request (following redirects if asked) and its answer, then the connection's fate."""

    def __init__(self, session: WireSession, method: str, url: str, headers: Mapping[str, str] | None,
                 body: bytes | memoryview | None, allow_redirects: bool) -> None:
        self._session = session
        self._method = method
        self._url = url
        self._headers = dict(headers or {})
        self._body = body
        self._allow_redirects = allow_redirects
        self._connection: _Connection | None = None
        self._key: _Key | None = None
        self._response: Response | None = None

    async def __aenter__(self) -> Response:
        await self._session.acquire_slot()
        try:
            for _ in range(MAX_REDIRECTS + 1):
                response = await self._once()
                location = response.headers.get("location")
                if not (self._allow_redirects and response.status in REDIRECTS and location):
                    return response
                self._end(keep=False)
                self._follow(urljoin(self._url, location), response.status)
            raise RedirectLoop(f"{self._url}: more than {MAX_REDIRECTS} redirects")
        except BaseException:
            self._end(keep=False)
            self._session.release_slot()
            raise

    async def __aexit__(self, *exc_info: object) -> None:
        response = self._response
        keep = (exc_info[0] is None and response is not None and response.done and response.reusable
                and not response._chunks)
        self._end(keep)
        self._session.release_slot()

    async def _once(self) -> Response:
        key, head = self._session.request_head(self._method, self._url, self._headers, self._body)
        fresh = False
        while True:  # at most twice: a kept-alive connection, then a new one
            connection, reused = await self._session.connection(key, fresh=fresh)
            self._connection, self._key = connection, key
            response = Response(connection, self._method, self._url)
            self._response = response
            connection.expect(response)
            try:
                await connection.send(head, self._body)
                await response.head_received()
                return response
            except ConnectionError:
                self._end(keep=False)
                # A kept-alive connection the server had already closed: once more on a new one.
                if not reused or response.started:
                    raise
                self._session.drop_idle(key)
                fresh = True

    def _follow(self, url: str, status: int) -> None:
        before, after = urlsplit(self._url), urlsplit(url)
        if (before.scheme, before.netloc) != (after.scheme, after.netloc):
            self._headers = {k: v for k, v in self._headers.items() if k.lower() not in ("authorization", "cookie")}
        self._url = url
        if status == 303:
            self._method, self._body = "GET", None

    def _end(self, keep: bool) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if keep and self._key is not None:
            self._session.give_back(self._key, connection)
        else:
            connection.close()
