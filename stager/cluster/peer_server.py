"""The peer API (aiohttp over TCP, optionally TLS): ranged GET and HEAD of a blob's verified blocks, health.

- ``GET /healthz``: 200 ``ok``, no authentication and no data (for probes and peers' health checks);
  503 while the daemon stops.
- ``GET /v1/blobs/{digest}?start=&end=&size=&block_size=&index=&mode=``: the bytes of a
  block-aligned range (``request.py``), streamed block by block as each is read or arrives; in
  ``hold`` mode, the part of it held here from its start (``Content-Length`` says how much).
- ``HEAD /v1/blobs/{digest}?...``: 200 if the range is held verified here now, else 404.

Every ``/v1`` request must carry a valid signature (``auth.py``); any other
gets 401 and no data. Each asker gets at most ``per_peer`` requests at once
(more wait their turn) and, with ``bandwidth``, at most that many bytes per
second; its requests' blocks are written one at a time, the block with the
fewest copies outside this node first, urgent requests before any
(``uplink.py``). A block that cannot be sent after the answer has started
(evicted meanwhile, its fetch failed) cuts the connection short, which the
asker sees as a short body and treats like any failed peer.
"""

from __future__ import annotations

import asyncio
import itertools
import logging

from aiohttp import web

from ..errors import ConfigError
from .auth import PeerAuth
from .holdings import Holdings
from .request import ASKER_HEADER, BLOBS_PATH, PeerRequest
from .stats import ClusterStats
from .uplink import Uplink

#: Seconds a block's write holds its asker's lane while the socket drains (a healthy one drains in
#: milliseconds); past that the lane goes on and the write finishes on its own.
DRAIN_HOLD = 0.25

log = logging.getLogger(__name__)

def build_peer_app(auth: PeerAuth, holdings: Holdings, stats: ClusterStats, *, per_peer: int = 8,
                   bandwidth: int | None = None, stopping: asyncio.Event | None = None,
                   uplink: Uplink | None = None) -> web.Application:
    """The peer listener's application.

    Args:
        auth: checks every ``/v1`` request's signature.
        holdings: what this node may send (``holdings.py``).
        stats: bytes sent, refusals.
        per_peer: requests served at once to one asker.
        bandwidth: bytes per second sent to one asker (None: no cap).
        stopping: set while the daemon stops (health answers 503).
        uplink: the order of the sends (made from ``per_peer`` and ``bandwidth`` if not given).
    """
    uplink = uplink if uplink is not None else Uplink(per_peer, bandwidth)
    arrivals = itertools.count()

    async def healthz(request: web.Request) -> web.Response:
        if stopping is not None and stopping.is_set():
            return web.Response(status=503, text="stopping\n")
        return web.Response(text="ok\n")

    def checked(request: web.Request) -> PeerRequest | web.Response:
        digest = request.match_info["digest"]
        try:
            peer_request = PeerRequest.parse(digest, request.query, request.headers)
        except ConfigError as exc:
            stats.requests_unauthorized += 1  # unproved input is refused as unauthorized: no hint either way
            log.info("refused a peer request from %s: %s", request.remote, exc)
            return web.Response(status=401)
        problem = auth.check(request.method, digest, peer_request.start, peer_request.end, peer_request.context(),
                             request.headers)
        if problem is not None:
            stats.requests_unauthorized += 1
            log.warning("refused a peer request from %s: %s", request.remote, problem)
            return web.Response(status=401)
        return peer_request

    async def head_blob(request: web.Request) -> web.Response:
        peer_request = checked(request)
        if isinstance(peer_request, web.Response):
            return peer_request
        record = await holdings.engine.in_disk_thread(holdings.engine.cache.record, peer_request.digest)
        held = record is not None and all(b in record.verified for b in peer_request.blocks)
        return web.Response(status=200 if held else 404)

    async def get_blob(request: web.Request) -> web.StreamResponse:
        peer_request = checked(request)
        if isinstance(peer_request, web.Response):
            return peer_request
        lane = uplink.lane(request.headers.get(ASKER_HEADER, request.remote or ""))
        async with lane.requests:
            arrival = next(arrivals)
            opened = await holdings.open(peer_request)
            if opened is None:
                stats.requests_missing += 1
                return web.Response(status=404)
            peer_request, blocks = opened  # in hold mode, perhaps only the start of the range (what is held)
            response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
            response.content_length = peer_request.end - peer_request.start
            started = False
            index = peer_request.blocks[0]
            try:
                async for data in blocks:  # each block in order, as it is read or arrives
                    async with uplink.send(lane, peer_request.digest, index, len(data), urgent=peer_request.urgent,
                                           owned=holdings.owns(peer_request.digest), arrival=arrival):
                        if not started:
                            await response.prepare(request)
                            started = True
                        write = asyncio.ensure_future(response.write(data))  # it waits for the socket to drain
                        try:
                            # The lane waits for the drain only so long: an asker slow to read this one answer
                            # (its disk, its CPU) must not hold back its other answers past their deadlines.
                            await asyncio.wait((write,), timeout=DRAIN_HOLD)
                        except asyncio.CancelledError:
                            write.cancel()
                            raise
                    try:
                        await write
                    except BaseException:
                        write.cancel()
                        uplink.uncount(peer_request.digest, index)  # not a copy out after all
                        raise
                    stats.bytes_to_peers += len(data)
                    index += 1
            except Exception as exc:  # noqa: BLE001 - any failure of ours: the asker goes elsewhere
                if not started:
                    stats.requests_missing += 1
                    log.info("could not serve %s to %s: %s", peer_request.digest, peer_request.asker, exc)
                    return web.Response(status=404)
                log.info("cut short sending %s to %s: %s", peer_request.digest, peer_request.asker, exc)
                if request.transport is not None:
                    request.transport.abort()
                return response
            await response.write_eof()
            stats.requests_served += 1
            return response

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_route("HEAD", BLOBS_PATH + "{digest}", head_blob)
    app.router.add_get(BLOBS_PATH + "{digest}", get_blob, allow_head=False)
    return app
