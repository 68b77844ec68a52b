"""A read-only plain-HTTP origin serving a directory, for tests.

How it works: an aiohttp application with one catch-all route runs on a
`ThreadedWebServer` (own loop, own thread, 127.0.0.1, OS-chosen port), so
sync tests, async tests and subprocesses can all reach ``HttpOrigin.url``.

Semantics (what a well-behaved static origin or CDN does):

* ``GET`` streams the file; ``HEAD`` sends the same headers without a body:
  ``Content-Length``, ``Last-Modified``, ``ETag``, ``Accept-Ranges: bytes``.
* One range ``Range: bytes=a-b`` / ``bytes=a-`` / ``bytes=-n`` gives 206 with
  ``Content-Range``; the end is clamped to the file size; a start at or past
  the end (or ``-0``) gives 416 with ``Content-Range: bytes */SIZE``. A
  malformed or multi-range header is ignored (200 with the whole file), as
  RFC 9110 allows.
* A missing file is 404; any other method is 405; a path that would leave
  the root (``..``, symlinks pointing out) is 403.
* A directory answers with a small HTML index of links (what fsspec's HTTP
  filesystem parses for ``ls``), or 404 with ``listing=False``.

Every request is appended to `requests` (bounded) so tests can assert on what
a client actually sent (e.g. that it used ranges).
"""

from __future__ import annotations

import collections
import html
import os
import threading
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path
from urllib.parse import quote

from aiohttp import web

from .web_thread import ServedApp

_CHUNK = 256 * 1024
_RECORDED = web.RequestKey("http_origin_recorded", bool)
_LOG_LIMIT = 10_000


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request the origin answered."""

    method: str
    path: str
    range: str | None
    status: int


def parse_range(header: str | None, size: int) -> tuple[int, int] | str | None:
    """Interpret a Range header against a file of ``size`` bytes.

    Returns ``(start, end)`` inclusive for a satisfiable single range,
    ``"unsatisfiable"`` for a valid range that misses the file, or None when the
    header is absent, malformed or multi-range (serve the whole file).
    """
    if not header:
        return None
    unit, _, spec = header.strip().partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    first, last = first.strip(), last.strip()
    if not dash or (first and not first.isdigit()) or (last and not last.isdigit()):
        return None
    if not first:
        if not last:
            return None
        suffix = int(last)
        if suffix == 0 or size == 0:
            return "unsatisfiable"
        return max(0, size - suffix), size - 1
    start = int(first)
    end = int(last) if last else size - 1
    if last and end < start:
        return None
    if start >= size:
        return "unsatisfiable"
    return start, min(end, size - 1)


class HttpOrigin(ServedApp):
    """Serve ``root`` read-only over HTTP on 127.0.0.1.

    Args:
        root: directory to serve (created if missing).
        listing: answer directory URLs with an HTML index.

    Attributes:
        url: ``http://127.0.0.1:PORT`` (no trailing slash).
        root: the served directory (resolved Path).
    """

    def __init__(self, root: str | os.PathLike, *, listing: bool = True) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.listing = listing
        self._log: collections.deque[RequestRecord] = collections.deque(maxlen=_LOG_LIMIT)
        self._lock = threading.Lock()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._start_serving(app, "http-origin")

    def url_for(self, relpath: str) -> str:
        """URL of ``relpath`` (relative to root, unencoded)."""
        return f"{self.url}/{quote(relpath.lstrip('/'))}"

    @property
    def requests(self) -> list[RequestRecord]:
        """Snapshot of the requests answered so far (oldest first)."""
        with self._lock:
            return list(self._log)

    def clear_requests(self) -> None:
        with self._lock:
            self._log.clear()

    def __repr__(self) -> str:
        return f"HttpOrigin({str(self.root)!r}, {self.url})"

    # -- request handling ----------------------------------------------------

    def _resolve(self, rel: str) -> Path | None:
        parts = rel.split("/")
        if "\x00" in rel or ".." in parts or rel.startswith("/"):
            return None
        path = (self.root / rel).resolve()
        return path if path == self.root or path.is_relative_to(self.root) else None

    def _record(self, request: web.Request, status: int) -> None:
        """Log the request, before its client can have the whole answer: a test that reads
        ``requests`` once its client is answered must find it there."""
        if request.get(_RECORDED):
            return
        request[_RECORDED] = True
        with self._lock:
            self._log.append(
                RequestRecord(request.method, request.path, request.headers.get("Range"), status)
            )

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        status = 500
        try:
            response = await self._respond(request)
            status = response.status
            return response  # a response not streamed yet: aiohttp sends it after this returns
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            self._record(request, status)

    async def _respond(self, request: web.Request) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD"):
            raise web.HTTPMethodNotAllowed(request.method, ["GET", "HEAD"])
        path = self._resolve(request.match_info["tail"])
        if path is None:
            raise web.HTTPForbidden(text="path outside the served root\n")
        if path.is_dir():
            if not self.listing:
                raise web.HTTPNotFound()
            return self._index(request, path)
        try:
            stat = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            raise web.HTTPNotFound() from None
        size = stat.st_size
        headers = {
            "Accept-Ranges": "bytes",
            "Last-Modified": formatdate(stat.st_mtime, usegmt=True),
            "ETag": f'"{stat.st_mtime_ns:x}-{size:x}"',
            "Content-Type": "application/octet-stream",
        }
        wanted = parse_range(request.headers.get("Range"), size)
        if wanted == "unsatisfiable":
            raise web.HTTPRequestRangeNotSatisfiable(headers={"Content-Range": f"bytes */{size}"})
        if wanted is None:
            start, end, status = 0, size - 1, 200
        else:
            start, end = wanted
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        response = web.StreamResponse(status=status, headers=headers)
        response.content_length = end - start + 1
        self._record(request, status)
        await response.prepare(request)
        if request.method == "GET":
            await self._send_file(response, path, start, end - start + 1)
        await response.write_eof()
        return response

    @staticmethod
    async def _send_file(response: web.StreamResponse, path: Path, start: int, length: int) -> None:
        # Small blocking reads on the origin's private loop are harmless here.
        with open(path, "rb") as f:
            f.seek(start)
            remaining = length
            while remaining > 0:
                chunk = f.read(min(_CHUNK, remaining))
                if not chunk:  # file shrank under us: stop, the client sees a short body
                    break
                remaining -= len(chunk)
                await response.write(chunk)

    def _index(self, request: web.Request, path: Path) -> web.Response:
        base = request.path if request.path.endswith("/") else request.path + "/"
        links = []
        for entry in sorted(path.iterdir()):
            name = entry.name + ("/" if entry.is_dir() else "")
            links.append(f'<a href="{html.escape(base + quote(name))}">{html.escape(name)}</a>')
        body = "<html><body>\n" + "<br>\n".join(links) + "\n</body></html>\n"
        return web.Response(text=body, content_type="text/html")
