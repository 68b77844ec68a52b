"""A tiny HTTP/1.1 origin on 127.0.0.1:0 whose answers a test scripts one request at a time.

Written on raw asyncio streams (not aiohttp.web) so a test can send exactly
the malformed answers real origins send: a 200 that ignores Range, a 206 for
other bytes, a body cut short, a reset connection, a body without length.
Each request takes the next behaviour from ``script`` (``"ok"`` when empty).
"""

from __future__ import annotations

import asyncio
import socket
import struct
from dataclasses import dataclass, field
from urllib.parse import unquote

_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST


def status(code: int, body: bytes = b"", **headers: str) -> tuple:
    """A scripted answer with this status, body and headers (``Retry_After`` -> ``Retry-After``)."""
    return ("status", code, body, {k.replace("_", "-"): v for k, v in headers.items()})


def s3_error(code: int, s3_code: str, **headers: str) -> tuple:
    """A scripted S3-style XML error answer."""
    body = f"<Error><Code>{s3_code}</Code><Message>scripted</Message></Error>".encode()
    return status(code, body, **headers)


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    query: str = ""
    body: bytes = b""


@dataclass
class ScriptedOrigin:
    objects: dict[str, bytes] = field(default_factory=dict)
    script: list = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    head_allowed: bool = True
    server: asyncio.AbstractServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        host, port = self.server.sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    async def start(self) -> ScriptedOrigin:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            for _ in range(10_000):  # requests per connection, bounded
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                path = unquote(target.split("?", 1)[0].lstrip("/"))
                body = await reader.readexactly(int(headers.get("content-length") or 0))
                self.seen.append(Seen(method, path, headers, target.partition("?")[2], body))
                behaviour = self.script.pop(0) if self.script else "ok"
                keep = await self._answer(writer, method, path, headers, behaviour)
                await writer.drain()
                if not keep:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _answer(self, writer, method, path, headers, behaviour) -> bool:
        if isinstance(behaviour, tuple):  # status(...)
            _, status, body, extra = behaviour
            self._head(writer, status, len(body), extra)
            writer.write(body if method != "HEAD" else b"")
            return True
        if behaviour == "hang":
            await asyncio.sleep(30)
            return False
        data = self.objects.get(path)
        if data is None:
            body = b"<Error><Code>NoSuchKey</Code><Message>The key does not exist</Message></Error>"
            self._head(writer, 404, len(body), {})
            writer.write(body if method != "HEAD" else b"")
            return True
        if method == "HEAD":
            if not self.head_allowed:
                self._head(writer, 405, 0, {})
                return True
            self._head(writer, 200, len(data), {"Last-Modified": "Wed, 21 Oct 2015 07:28:00 GMT"})
            return True
        if behaviour == "chunked":  # the whole object, chunked transfer encoding
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for i in range(0, len(data), 7000):
                piece = data[i:i + 7000]
                writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            writer.write(b"0\r\n\r\n")
            return True
        rng = headers.get("range")
        if rng is None or behaviour == "ignore_range":
            self._head(writer, 200, len(data), {})
            writer.write(data)
            return True
        first, last = (int(x) if x else None for x in rng.removeprefix("bytes=").split("-"))
        if first >= len(data):
            self._head(writer, 416, 0, {"Content-Range": f"bytes */{len(data)}"})
            return True
        last = min(last if last is not None else len(data) - 1, len(data) - 1)
        part = data[first:last + 1]
        cr = {"Content-Range": f"bytes {first}-{last}/{len(data)}"}
        if behaviour == "ok":
            self._head(writer, 206, len(part), cr)
            writer.write(part)
        elif behaviour == "ok200":  # rclone serve s3 answers ranges with 200 + Content-Range
            self._head(writer, 200, len(part), cr)
            writer.write(part)
        elif behaviour == "wrong_range":
            shifted = data[first + 1:last + 2]
            self._head(writer, 206, len(shifted), {"Content-Range": f"bytes {first + 1}-{first + len(shifted)}/{len(data)}"})
            writer.write(shifted)
        elif behaviour == "no_content_range":
            self._head(writer, 206, len(part), {})
            writer.write(part)
        elif behaviour == "flip":
            flipped = bytearray(part)
            flipped[len(flipped) // 2] ^= 0xFF
            self._head(writer, 206, len(part), cr)
            writer.write(bytes(flipped))
        elif behaviour == "truncate":
            self._head(writer, 206, len(part), cr)
            writer.write(part[: len(part) // 2])
            return False
        elif behaviour == "reset":  # part of the body, then RST
            self._head(writer, 206, len(part), cr)
            writer.write(part[: len(part) // 3])
            await writer.drain()
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
            return False
        elif behaviour == "too_long":  # right Content-Range, no length, more bytes than asked
            writer.write(f"HTTP/1.1 206 Partial Content\r\nContent-Range: {cr['Content-Range']}\r\nConnection: close\r\n\r\n".encode())
            writer.write(part + b"extra")
            return False
        elif behaviour == "no_length":
            writer.write(f"HTTP/1.1 206 Partial Content\r\nContent-Range: {cr['Content-Range']}\r\nConnection: close\r\n\r\n".encode())
            writer.write(part[:-1])
            return False
        else:
            raise AssertionError(f"unknown behaviour {behaviour!r}")
        return True

    @staticmethod
    def _head(writer, status: int, length: int, extra: dict) -> None:
        lines = [f"HTTP/1.1 {status} X", f"Content-Length: {length}"] + [f"{k}: {v}" for k, v in extra.items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
