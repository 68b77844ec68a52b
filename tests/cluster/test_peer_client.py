"""The peer client against a real aiohttp peer on loopback: health checks are never queued behind blob requests."""

from __future__ import annotations

import asyncio

from aiohttp import web

from stager.cluster.auth import PeerAuth
from stager.cluster.peer_client import PeerClient
from stager.cluster.request import BLOBS_PATH, PeerRequest
from stager.store import RangeSink
from stager.testing.s3server import free_port

SECRET = b"a-cluster-secret-of-32-bytes-ok!"
HOST = "127.0.0.2"


class _Discard(RangeSink):
    async def write(self, chunk: bytes) -> None:
        pass

    async def close(self) -> None:
        pass

    async def abort(self) -> None:
        pass


async def test_a_peer_whose_every_connection_carries_a_slow_blob_request_still_answers_its_health_check():
    # A relay request waits on the peer's own origin fetch for as long as that takes. Health checks used to
    # share the per-peer connection limit with such requests: with every connection held, a check waited
    # for one past its timeout, three in a row marked a live, busy peer down, and the asker fetched that
    # peer's blobs from the origin itself (a shard read twice in the peers benchmark at N = 2).
    release = asyncio.Event()
    started = asyncio.Event()

    async def slow_blob(request: web.Request) -> web.StreamResponse:
        started.set()
        async with asyncio.timeout(30):  # bounded: released at the end of the test
            await release.wait()
        return web.Response(status=404)

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get(BLOBS_PATH + "{digest}", slow_blob)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port(HOST)
    await web.TCPSite(runner, HOST, port).start()
    peer = f"{HOST}:{port}"
    client = PeerClient(PeerAuth(SECRET), lambda: "127.0.0.3:7070", per_peer=2)
    ask = PeerRequest("0" * 32, 0, 1024, 1024, 1024, 0, "", "", "relay", "127.0.0.3:7070")
    blobs = [asyncio.create_task(client.read_into(peer, ask, _Discard)) for _ in range(client.per_peer)]
    try:
        async with asyncio.timeout(5):
            await started.wait()
        await asyncio.sleep(0.2)  # every connection the blob requests may use is now held
        assert await client.healthy(peer) is True
        assert not any(task.done() for task in blobs)  # they were still holding their connections
    finally:
        release.set()
        await asyncio.gather(*blobs, return_exceptions=True)
        await client.close()
        await runner.cleanup()
