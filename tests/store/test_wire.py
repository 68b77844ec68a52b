"""The HTTP/1.1 client under the HTTP and S3 stores, against raw loopback servers that send exact bytes."""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
import subprocess
from typing import Awaitable, Callable

import numpy as np
import pytest
import uvloop

from stager.errors import OriginError, TransientOriginError
from stager.store.translate import origin_error
from stager.store.held import held_bytes, paused_connections, receiving_requests
from stager.store.wire import (HEAD_RECV, HIGH_WATER, PAGE, PAST_BUDGET_RECV, RECV_BUFFER, BufferPool, ProtocolError,
                               RedirectLoop, WireSession)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


class RawServer:
    """A loopback server running ``handler(reader, writer, connection_number)`` for each connection."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.server: asyncio.AbstractServer | None = None

    async def __aenter__(self) -> RawServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    @property
    def url(self) -> str:
        assert self.server is not None
        host, port = self.server.sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer, self.connections)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


async def read_request(reader: asyncio.StreamReader) -> tuple[str, dict[str, str], bytes]:
    """One request: its request line, headers (lower-case names) and body (by Content-Length)."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    headers = {}
    for line in head[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return head[0], headers, body


def answer(body: bytes, status: str = "200 OK", **headers: str) -> bytes:
    lines = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}"]
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def answering_in_turn(bodies: list[bytes]) -> Handler:
    """A handler answering the requests on a connection with ``bodies``, in turn."""
    async def handler(reader, writer, n):
        for body in bodies:
            await read_request(reader)
            writer.write(answer(body))
            await writer.drain()

    return handler


async def get_body(session: WireSession, url: str, **kwargs) -> tuple[int, bytes]:
    async with session.get(url, **kwargs) as resp:
        return resp.status, await resp.read()


async def test_requests_share_one_kept_alive_connection():
    async def handler(reader, writer, n):
        for i in range(3):
            line, headers, _ = await read_request(reader)
            assert headers["host"].startswith("127.0.0.1:") and headers["accept-encoding"] == "identity"
            writer.write(answer(f"answer {i} to {line}".encode()))

    async with RawServer(handler) as server:
        session = WireSession(4)
        try:
            bodies = [await get_body(session, f"{server.url}/x?n={i}") for i in range(3)]
        finally:
            await session.close()
    assert bodies == [(200, f"answer {i} to GET /x?n={i} HTTP/1.1".encode()) for i in range(3)]
    assert server.connections == 1


async def test_a_pooled_connection_the_server_closed_is_replaced_without_an_error():
    async def handler(reader, writer, n):
        await read_request(reader)
        writer.write(answer(f"connection {n}".encode()))
        await writer.drain()
        if n == 1:  # an idle timeout racing the next request: read it, close without answering
            await read_request(reader)

    async with RawServer(handler) as server:
        session = WireSession(4)
        try:
            assert await get_body(session, server.url + "/a") == (200, b"connection 1")
            assert await get_body(session, server.url + "/b") == (200, b"connection 2")
            await asyncio.sleep(0.05)  # connection 2 was closed after its answer: the pool notices
            assert await get_body(session, server.url + "/c") == (200, b"connection 3")
        finally:
            await session.close()
    assert server.connections == 3


async def test_a_new_connection_closed_before_answering_is_an_error_not_a_loop():
    async def handler(reader, writer, n):
        await read_request(reader)

    async with RawServer(handler) as server:
        session = WireSession(4)
        try:
            with pytest.raises(ConnectionError, match="before answering"):
                await get_body(session, server.url)
        finally:
            await session.close()
    assert server.connections == 1


async def test_chunked_body_split_anywhere_with_extensions_and_trailers():
    data = os.urandom(70_000)
    wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    for at in range(0, len(data), 9000):
        piece = data[at:at + 9000]
        wire += f"{len(piece):X};name=value\r\n".encode() + piece + b"\r\n"
    wire += b"0\r\nX-Trailer: t\r\n\r\n"

    async def handler(reader, writer, n):
        for _ in range(2):
            await read_request(reader)
            for at in range(0, len(wire), 997):  # boundaries fall inside sizes, data and CRLFs
                writer.write(wire[at:at + 997])
                await writer.drain()
                await asyncio.sleep(0)

    async with RawServer(handler) as server:
        session = WireSession(1)
        try:
            assert await get_body(session, server.url) == (200, data)
            assert await get_body(session, server.url) == (200, data)  # framing ended exactly: reused
        finally:
            await session.close()
    assert server.connections == 1


async def test_a_body_until_close_is_read_to_the_end_and_the_connection_not_reused():
    async def handler(reader, writer, n):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n\r\nno length, ends at close")

    async with RawServer(handler) as server:
        session = WireSession(2)
        try:
            assert await get_body(session, server.url) == (200, b"no length, ends at close")
            assert await get_body(session, server.url) == (200, b"no length, ends at close")
        finally:
            await session.close()
    assert server.connections == 2


@pytest.mark.parametrize("cut", ["inside_body", "before_answer"])
async def test_a_connection_cut_short_is_a_retryable_connection_error(cut):
    async def handler(reader, writer, n):
        await read_request(reader)
        if cut == "inside_body":
            writer.write(answer(b"x" * 1000)[:-400])

    async with RawServer(handler) as server:
        session = WireSession(2)
        try:
            with pytest.raises(ConnectionError):
                await get_body(session, server.url)
        finally:
            await session.close()


@pytest.mark.parametrize("bad", [
    b"HTTP/1.1 2000 OK\r\n\r\n",
    b"ICY 200 OK\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (70 * 1024),
])
async def test_malformed_answers_are_protocol_errors(bad):
    async def handler(reader, writer, n):
        await read_request(reader)
        writer.write(bad)
        await writer.drain()
        await asyncio.sleep(1)

    async with RawServer(handler) as server:
        session = WireSession(1)
        try:
            with pytest.raises(ProtocolError):
                await asyncio.wait_for(get_body(session, server.url), 5)
        finally:
            await session.close()


async def test_informational_answers_are_skipped_and_head_has_no_body():
    async def handler(reader, writer, n):
        line, _, _ = await read_request(reader)
        assert line.startswith("HEAD ")
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 12345\r\n\r\n")
        line, _, _ = await read_request(reader)
        writer.write(answer(b"after head"))

    async with RawServer(handler) as server:
        session = WireSession(1)
        try:
            async with session.head(server.url) as resp:
                assert (resp.status, resp.content_length, await resp.read()) == (200, 12345, b"")
            assert await get_body(session, server.url) == (200, b"after head")
        finally:
            await session.close()
    assert server.connections == 1


async def test_redirects_followed_only_when_asked_and_credentials_stay_with_their_origin():
    seen: list[tuple[int, str, dict[str, str]]] = []

    async def other(reader, writer, n):
        line, headers, _ = await read_request(reader)
        seen.append((2, line, headers))
        writer.write(answer(b"moved here"))

    async with RawServer(other) as target:
        async def first(reader, writer, n):
            for _ in range(100):
                line, headers, _ = await read_request(reader)
                seen.append((1, line, headers))
                if "/loop" in line:
                    writer.write(answer(b"", "302 Found", Location="/loop"))
                elif "/rel" in line:
                    writer.write(answer(b"", "301 Moved", Location="/abs"))
                elif "/abs" in line:
                    writer.write(answer(b"", "307 Temporary", Location=target.url + "/there"))
                else:
                    writer.write(answer(b"?"))

        async with RawServer(first) as server:
            session = WireSession(2)
            try:
                auth = {"Authorization": "secret"}
                async with session.get(server.url + "/rel", headers=auth) as resp:
                    assert resp.status == 301  # not asked to follow
                    await resp.read()
                assert await get_body(session, server.url + "/rel", headers=auth, allow_redirects=True) == \
                    (200, b"moved here")
                with pytest.raises(RedirectLoop):
                    await get_body(session, server.url + "/loop", allow_redirects=True)
            finally:
                await session.close()
    followed = [(s, line.split()[1], h.get("authorization")) for s, line, h in seen[1:4]]
    assert followed == [(1, "/rel", "secret"), (1, "/abs", "secret"), (2, "/there", None)]


async def test_kept_body_views_are_never_overwritten_by_later_answers():
    bodies = [os.urandom(3 * RECV_BUFFER + 12345) for _ in range(4)]

    handler = answering_in_turn(bodies)

    async with RawServer(handler) as server:
        session = WireSession(1)
        kept: list[list[memoryview]] = []
        try:
            for _ in bodies:
                async with session.get(server.url) as resp:
                    views = []
                    while chunk := (await resp.readchunk())[0]:
                        views.append(chunk)
                    kept.append(views)
        finally:
            await session.close()
    assert [b"".join(views) for views in kept] == bodies


async def test_body_bytes_are_placed_congruent_to_their_offset_for_direct_writes():
    """Body byte k sits at an address congruent to k modulo the page, except what came with the headers."""
    bodies = [os.urandom(n) for n in (5 * RECV_BUFFER + 4321, 123_457, 2 * RECV_BUFFER)]

    async def handler(reader, writer, n):
        for body in bodies:
            await read_request(reader)
            writer.write(answer(body))
            await writer.drain()
            await asyncio.sleep(0.01)  # the next answer's head in a read of its own, as from an object store

    async with RawServer(handler) as server:
        session = WireSession(1)
        try:
            for body in bodies:
                async with session.get(server.url) as resp:
                    at, placed, views = 0, 0, []
                    while chunk := (await resp.readchunk())[0]:
                        address = np.frombuffer(chunk, dtype=np.uint8).ctypes.data
                        if (address - at) % PAGE == 0:
                            placed += len(chunk)
                        else:
                            assert at < HEAD_RECV, f"bytes {at}.. of the body are not placed for a direct write"
                        views.append(chunk)
                        at += len(chunk)
                assert b"".join(views) == body
                assert placed >= len(body) - HEAD_RECV
        finally:
            await session.close()


async def test_receive_buffers_count_as_in_use_while_an_answer_or_a_view_of_it_holds_them():
    """What the engine's memory bound reads: the buffers a request or its kept views hold, and who receives."""
    bodies = [os.urandom(3 * RECV_BUFFER + 4321) for _ in range(2)]

    handler = answering_in_turn(bodies)

    base_bytes, base_receiving = held_bytes(), receiving_requests()
    async with RawServer(handler) as server:
        session = WireSession(1)
        try:
            kept: list[memoryview] = []
            async with session.get(server.url) as resp:
                while chunk := (await resp.readchunk())[0]:
                    kept.append(chunk)
                assert receiving_requests() - base_receiving == 1
            assert b"".join(kept) == bodies[0]
            # idle now: the connection let go of its buffer, the views still hold all four
            assert receiving_requests() - base_receiving == 0
            assert held_bytes() - base_bytes == 4 * RECV_BUFFER
            kept.clear()
            assert held_bytes() - base_bytes == 0
            status, body = await get_body(session, server.url)  # the same buffers serve the next answer
            assert (status, body) == (200, bodies[1])
            assert held_bytes() - base_bytes == 0 and receiving_requests() - base_receiving == 0
        finally:
            await session.close()


async def test_a_body_received_into_the_consumers_memory_lands_in_place_and_holds_no_buffer():
    body = os.urandom(3 * RECV_BUFFER + 777)

    async def handler(reader, writer, n):
        await read_request(reader)
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode())
        await writer.drain()
        await asyncio.sleep(0.05)  # the body after the head, as from an object store
        for at in range(0, len(body), 100_000):
            writer.write(body[at:at + 100_000])
            await writer.drain()

    target = bytearray(len(body))
    async with RawServer(handler) as server:
        session = WireSession(1)
        try:
            async with session.get(server.url) as resp:
                resp.receive_into(memoryview(target))
                base_bytes = held_bytes()
                in_place = 0
                while chunk := (await resp.readchunk())[0]:
                    if chunk.obj is target:
                        in_place += len(chunk)
                    assert held_bytes() <= base_bytes  # no receive buffer taken for the body
            assert bytes(target) == body
            assert in_place == len(body)  # every byte arrived where it belongs: nothing to copy
        finally:
            await session.close()


def test_buffers_beyond_those_kept_count_until_their_last_view_goes():
    pool = BufferPool(size=RECV_BUFFER, budget=RECV_BUFFER)
    base = held_bytes()
    (kept, within), (spare, past) = pool.take(), pool.take()
    assert within and not past  # the second is past the budget: its taker is to wait before the next
    view = memoryview(spare)[:10]
    del spare
    assert held_bytes() - base == RECV_BUFFER + PAST_BUDGET_RECV  # the kept one (held here), and the view's
    view.release()
    del view
    assert held_bytes() - base == RECV_BUFFER
    del kept
    assert held_bytes() - base == 0


async def test_a_slow_reader_pauses_the_socket_instead_of_buffering_the_body():
    body = os.urandom(64 << 20)

    async def handler(reader, writer, n):
        await read_request(reader)
        writer.write(answer(body))
        await writer.drain()

    async with RawServer(handler) as server:
        session = WireSession(1)
        try:
            base_paused = paused_connections()
            async with session.get(server.url) as resp:
                await asyncio.sleep(0.5)  # nothing taken: receiving must stop near the high-water mark
                assert resp._queued <= HIGH_WATER + RECV_BUFFER
                assert paused_connections() - base_paused == 1  # what tells the engine this host is the bottleneck
                got = bytearray()
                while chunk := (await resp.readchunk())[0]:
                    got += chunk
            assert bytes(got) == body
            assert paused_connections() - base_paused == 0
        finally:
            await session.close()


async def test_put_sends_its_body_with_its_length():
    data = os.urandom(5 * 1024 * 1024 + 7)
    received = []

    async def handler(reader, writer, n):
        line, headers, body = await read_request(reader)
        received.append((line.split()[0], headers["content-length"], body))
        writer.write(answer(b"", ETag='"e"'))

    async with RawServer(handler) as server:
        session = WireSession(1)
        try:
            async with session.put(server.url + "/obj", data, headers={"X-Meta": "m"}) as resp:
                assert resp.status == 200 and resp.headers.get("etag") == '"e"'
        finally:
            await session.close()
    assert received == [("PUT", str(len(data)), data)]


async def test_a_cancelled_exchange_drops_its_connection():
    async def handler(reader, writer, n):
        for _ in range(2):
            line, _, _ = await read_request(reader)
            if "/slow" in line:
                writer.write(answer(b"s" * 1000)[:-500])  # half the body, then nothing
                await writer.drain()
                await asyncio.sleep(10)
                return
            writer.write(answer(b"fast"))

    async with RawServer(handler) as server:
        session = WireSession(1)
        try:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.3):
                    await get_body(session, server.url + "/slow")
            # The one slot is free again, and the half-read connection was not pooled.
            assert await asyncio.wait_for(get_body(session, server.url + "/fast"), 5) == (200, b"fast")
        finally:
            await session.close()
    assert server.connections == 2


async def test_header_injection_is_refused():
    session = WireSession(1)
    with pytest.raises(ValueError, match="forbidden character"):
        await get_body(session, "http://127.0.0.1:9/x", headers={"X-A": "v\r\nX-B: injected"})
    await session.close()


def _self_signed(folder) -> tuple[str, str]:
    """A certificate for 127.0.0.1 and its key, made with the openssl command."""
    cert, key = str(folder / "cert.pem"), str(folder / "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return cert, key


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_tls_bodies_arrive_whole_and_an_unknown_certificate_is_refused(tmp_path, monkeypatch, loop_kind):
    cert, key = _self_signed(tmp_path)
    body = os.urandom(3 * RECV_BUFFER + 999)

    async def handler(reader, writer, n):
        for _ in range(2):
            await read_request(reader)
            writer.write(answer(body))
            await writer.drain()

    async def scenario() -> None:
        server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_tls.load_cert_chain(cert, key)
        server = RawServer(handler)
        server.server = await asyncio.start_server(server._serve, "127.0.0.1", 0, ssl=server_tls)
        url = server.url.replace("http://", "https://")
        try:
            untrusting = WireSession(1)
            with pytest.raises(ssl.SSLCertVerificationError) as refused:
                await get_body(untrusting, url)
            await untrusting.close()
            assert isinstance(origin_error(refused.value, "x"), OriginError)
            assert not isinstance(origin_error(refused.value, "x"), TransientOriginError), "not retried"

            monkeypatch.setenv("SSL_CERT_FILE", cert)  # the default context trusts it now
            trusting = WireSession(1)
            try:
                assert await get_body(trusting, url + "/a") == (200, body)
                assert await get_body(trusting, url + "/b") == (200, body)
            finally:
                await trusting.close()
        finally:
            server.server.close()
            await server.server.wait_closed()

    loop = uvloop.new_event_loop() if loop_kind == "uvloop" else asyncio.new_event_loop()
    try:
        loop.run_until_complete(asyncio.wait_for(scenario(), 60))
    finally:
        loop.close()


def _vm_flags(address: int) -> set[str]:
    """The kernel's flags of the mapping of this process that holds ``address`` (from smaps)."""
    region = None
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                start, end = (int(x, 16) for x in head.split("-"))
                region = start <= address < end
            elif region and line.startswith("VmFlags:"):
                return set(line.split()[1:])
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs /proc/self/smaps")
def test_receive_buffers_are_private_memory_not_shmem():
    # An anonymous mmap is shared by default, and the kernel backs shared anonymous memory with
    # shmem pages: at a hundred connections, faulting fresh ones in cost more kernel time than
    # receiving into them (measured), where private pages are plain process memory.
    buffer, _ = BufferPool().take()
    address = np.frombuffer(buffer, dtype=np.uint8).ctypes.data
    flags = _vm_flags(address)
    assert "sh" not in flags and "mr" in flags and "mw" in flags


async def _peak_held_by_slow_consumers(recv_budget: int, requests: int, body: bytes) -> tuple[int, int, bool]:
    """``requests`` GETs at once of ``body``, each chunk kept 50 ms after it is taken (a slow disk):
    the most bytes held at once, the most connections paused at once, and whether every body came whole."""
    async def handler(reader, writer, n):
        await read_request(reader)
        writer.write(answer(body))
        await writer.drain()

    base, base_paused = held_bytes(), paused_connections()
    peak, most_paused = 0, 0
    loop = asyncio.get_running_loop()
    async with RawServer(handler) as server:
        session = WireSession(requests, recv_budget=recv_budget)

        async def one() -> bool:
            got = bytearray()
            async with session.get(server.url) as resp:
                while True:
                    chunk, _ = await resp.content.readchunk()
                    if not chunk:
                        return bytes(got) == body
                    got += chunk
                    loop.call_later(0.05, lambda kept=chunk: kept)  # the view lives until its write is done
                    nonlocal peak, most_paused
                    peak = max(peak, held_bytes() - base)
                    most_paused = max(most_paused, paused_connections() - base_paused)
                    await asyncio.sleep(0)

        try:
            whole = await asyncio.wait_for(asyncio.gather(*(one() for _ in range(requests))), 60)
        finally:
            await session.close()
    return peak, most_paused, all(whole)


async def test_connections_wait_for_a_buffer_once_the_budget_is_spent_and_every_body_arrives_whole():
    """However many requests are in flight and however slow their consumers, a session's receive
    buffers stay near its budget: past it, a connection reads once into a buffer of its own, then
    waits (paused, its bytes in the kernel) for a kept buffer to come free."""
    body = os.urandom(6 << 20)
    unbounded, _, whole = await _peak_held_by_slow_consumers(1 << 40, 16, body)
    assert whole
    budget = 4 * RECV_BUFFER
    bounded, paused, whole = await _peak_held_by_slow_consumers(budget, 16, body)
    assert whole
    assert paused > 0
    assert unbounded > 24 * RECV_BUFFER  # without a budget, slow consumers hold a couple of MiB each
    assert bounded < unbounded / 2


async def test_a_connection_kept_alive_while_it_waited_for_a_buffer_is_idle_and_reused():
    """An answer that ends within the read past the budget leaves its connection waiting for a buffer;
    kept alive, it must stop waiting (and stop counting as paused) and serve the next request."""
    async with RawServer(answering_in_turn([b"first", b"second"])) as server:
        session = WireSession(1, recv_budget=RECV_BUFFER)
        try:
            (pinned, within) = session._pool.take()  # the one kept buffer, held as a slow disk write would
            assert within
            base_paused = paused_connections()
            async with session.get(server.url) as resp:
                assert await resp.read() == b"first"
            assert paused_connections() == base_paused
            assert not session._pool._waiting
            del pinned
            async with session.get(server.url) as resp:
                assert await resp.read() == b"second"
            assert server.connections == 1  # the same connection, kept alive
        finally:
            await session.close()


async def test_a_request_a_consumer_waits_on_never_waits_for_a_buffer(monkeypatch):
    """Past the budget, prefetch waits for a buffer to come free, but the bytes a consumer is blocked on
    keep coming: such a request reads on, a small buffer at a time."""
    from stager.store import wire
    from stager.store.held import urgent_while

    monkeypatch.setattr(wire, "BUFFER_STUCK", 1e9)  # no last resort: only urgency lets it read on
    body = os.urandom(4 << 20)
    async with RawServer(answering_in_turn([body, body])) as server:
        session = WireSession(1, recv_budget=RECV_BUFFER)
        try:
            pinned, _ = session._pool.take()  # the one kept buffer, held as a slow disk write would
            urgent = [False]
            with urgent_while(lambda: urgent[0]):
                async with session.get(server.url) as resp:
                    first, _ = await resp.content.readchunk()  # the first read, past the budget
                    await asyncio.sleep(0.1)
                    assert session._pool._waiting  # prefetch: waiting for a buffer
                    urgent[0] = True  # a consumer caught up with it
                    del pinned  # (nothing else frees a buffer; the poll hands it out)
                    rest = await asyncio.wait_for(resp.read(), 10)
                    assert bytes(first) + rest == body
                assert not session._pool._waiting
                pinned, _ = session._pool.take()  # pinned again: only urgency gets the next body through
                async with session.get(server.url) as resp:
                    assert await asyncio.wait_for(resp.read(), 10) == body
                    assert not session._pool._waiting
        finally:
            await session.close()


async def test_a_trickling_body_is_read_a_quarter_mib_at_a_time_and_its_tail_is_not_waited_for(monkeypatch):
    """A body that trickles in (an object store's per-connection cap) is read when RECV_LOWAT of it is
    in, not packet by packet; a rest shorter than that wakes the reader too, and the next answer's
    head on the kept-alive connection comes at once."""
    from stager.store import wire

    body = os.urandom((1 << 20) + 5000)  # four low-water marks and a short tail

    async def handler(reader, writer, n):
        for answer_body in (body, b"next"):
            await read_request(reader)
            head, rest = answer(answer_body)[:-len(answer_body)], answer_body
            writer.write(head)
            for at in range(0, len(rest), 8192):
                writer.write(rest[at:at + 8192])
                await writer.drain()
                await asyncio.sleep(0.0005)

    reads = [0]
    real = wire._Connection.buffer_updated

    def counting(self, nbytes):
        reads[0] += 1
        real(self, nbytes)

    monkeypatch.setattr(wire._Connection, "buffer_updated", counting)
    async with RawServer(handler) as server:
        session = WireSession(1)
        try:
            async with session.get(server.url) as resp:
                assert await asyncio.wait_for(resp.read(), 20) == body
            assert reads[0] <= 16  # packet by packet, it took over a hundred
            async with session.get(server.url) as resp:
                assert await asyncio.wait_for(resp.read(), 10) == b"next"
            assert server.connections == 1
        finally:
            await session.close()
