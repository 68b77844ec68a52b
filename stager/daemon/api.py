"""The control API: aiohttp routes on the daemon's Unix socket.

::

    GET    /healthz                                  liveness, identity, cache (503 while stopping)
    GET    /metrics                                  Prometheus text format
    GET    /v1/status                                cache, datasets, consumers, plans, counters
    POST   /v1/datasets                              open a dataset: {"dataset": SOURCE, "fingerprint"?}
    PUT    /v1/consumers/{c}/plans/{p}               register or replace a plan:
                                                     {"dataset", "fingerprint", "order"|"order_b64",
                                                      "cursor", "window_bytes", "name", "floor_bytes"?,
                                                      "ahead_seconds"?}
    POST   /v1/consumers/{c}/plans/{p}/advance       {"position": n, "hits"?, "hit_bytes"?}: positions before n
                                                     are consumed; hits: blobs found complete without asking
    GET    /v1/consumers/{c}/plans/{p}/ready         ?position=n&timeout=s[&again=1]: long-poll, 200 {"path"}
                                                     or 202 (ask again, with again=1)
    DELETE /v1/consumers/{c}/plans/{p}               close one plan
    POST   /v1/consumers/{c}/heartbeat               renew the lease; answers the plans the daemon holds
                                                     and its node-wide counters
    DELETE /v1/consumers/{c}                         close every plan of a consumer
    POST   /v1/blocks/ready                          {"dataset", "fingerprint", "index", "block", "timeout"}:
                                                     long-poll until that block (alone, urgently) is verified
                                                     in the cache; 200 {"path"} (null while the blob is partial)
    POST   /v1/pin, /v1/unpin                        {"dataset"}: keep (or stop keeping) a dataset's blobs
    POST   /v1/evict                                 {"bytes": n}: free at least n bytes, by the usual policy

A SOURCE is ``{"url": ..., "storage_options": {...}}``; every request that
names one is served by the dataset version opened with exactly those
options, proven at the origin first (``datasets.py``). Every
``/v1/consumers/{c}`` request carries the consumer's key in the
``X-Stager-Consumer-Key`` header (``protocol.py``). Readiness is a
long-poll: the handler waits for the blob up to the asked timeout (at most
``max_poll``) and answers 202 when it is not there yet, so a consumer asks
again without any busy polling. Every request is validated (``schema.py``);
errors are JSON (``protocol.py``). While the daemon stops, everything but
``/healthz``, ``/metrics`` and ``/v1/status`` answers 503 and waiting
long-polls are answered 503 at once, so consumers go and reconnect.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable, TypeVar

from aiohttp import web

from .. import __version__
from ..cache import BlobState
from ..daemon_client.protocol import (API, API_VERSION, CONSUMER_KEY_HEADER, INSTANCE_HEADER, PENDING,
                                      DaemonRequestError, DaemonUnavailable, error_body, error_status)
from ..errors import AccessDenied, ShardNotFound, StagerError
from ..hashing import block_range
from . import schema
from .metrics import CONTENT_TYPE

if TYPE_CHECKING:
    from .server import Daemon

log = logging.getLogger(__name__)

T = TypeVar("T")
DAEMON = web.AppKey("daemon", object)
REFUSED_ATTEMPTS = 3  # tries of a blob the origin refused (see _refused_again)
_ALWAYS_OPEN = ("/healthz", "/metrics", f"{API}/status")
_UCRED = struct.Struct("3i")


def build_app(daemon: "Daemon") -> web.Application:
    """The full API, for the Unix socket."""
    app = _base_app(daemon, daemon.config.max_request_bytes)
    r = app.router
    r.add_get(f"{API}/status", status)
    r.add_post(f"{API}/datasets", open_dataset)
    plan = f"{API}/consumers/{{consumer}}/plans/{{plan}}"
    r.add_put(plan, register_plan)
    r.add_delete(plan, close_plan)
    r.add_post(f"{plan}/advance", advance)
    r.add_get(f"{plan}/ready", plan_ready)
    r.add_post(f"{API}/consumers/{{consumer}}/heartbeat", heartbeat)
    r.add_delete(f"{API}/consumers/{{consumer}}", drop_consumer)
    r.add_post(f"{API}/blocks/ready", block_ready)
    r.add_post(f"{API}/pin", pin)
    r.add_post(f"{API}/unpin", unpin)
    r.add_post(f"{API}/evict", evict)
    from ..checkpoint.daemon_hook import drain_route  # the checkpoint drain queue (stager/checkpoint)

    r.add_post(f"{API}/checkpoints/drain", drain_route)
    return app


def build_metrics_app(daemon: "Daemon") -> web.Application:
    """Only ``/healthz`` and ``/metrics``, for the optional TCP listener (nothing there changes state)."""
    return _base_app(daemon, 1024)


def _base_app(daemon: "Daemon", max_body: int) -> web.Application:
    app = web.Application(middlewares=[_errors], client_max_size=max_body)
    app[DAEMON] = daemon
    app.router.add_get("/healthz", health)
    app.router.add_get("/metrics", metrics)
    app.on_response_prepare.append(_stamp)
    return app


def _daemon(request: web.Request) -> "Daemon":
    return request.app[DAEMON]  # type: ignore[return-value]


async def _stamp(request: web.Request, response: web.StreamResponse) -> None:
    response.headers[INSTANCE_HEADER] = _daemon(request).instance


@web.middleware
async def _errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) \
        -> web.StreamResponse:
    daemon = _daemon(request)
    try:
        if daemon.draining and request.path not in _ALWAYS_OPEN:
            raise DaemonUnavailable("the daemon is stopping; reconnect to its successor")
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return web.json_response({"error": {"type": "DaemonRequestError",
                                            "message": f"{request.method} {request.path}: {exc.reason}"}},
                                 status=exc.status)
    except StagerError as exc:
        return web.json_response(error_body(exc), status=error_status(exc))
    except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # noqa: BLE001 - a bug: answer it as one, keep serving
        log.exception("%s %s failed", request.method, request.path)
        return web.json_response(error_body(exc), status=500)


def _peer_pid(request: web.Request) -> int | None:
    """The pid of the process at the other end of a Unix socket (kernel-given, not client-claimed)."""
    transport = request.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or getattr(sock, "family", None) != socket.AF_UNIX:
        return None
    try:
        pid, _, _ = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    except (OSError, AttributeError):
        return None
    return pid or None


async def _body(request: web.Request) -> dict[str, Any]:
    return schema.parse_json(await request.read())


def _ids(request: web.Request) -> tuple[str, str, str | None]:
    """The consumer id, the consumer's key (from its header) and the plan id of a consumer's route."""
    consumer = schema.ident(request.match_info["consumer"], "consumer id")
    key = schema.consumer_key(request.headers.get(CONSUMER_KEY_HEADER))
    plan = request.match_info.get("plan")
    return consumer, key, (schema.ident(plan, "plan id") if plan is not None else None)


# -- health, metrics, status ----------------------------------------------------------------------


async def health(request: web.Request) -> web.Response:
    daemon = _daemon(request)
    body = {
        "status": "draining" if daemon.draining else "ok", "api": API_VERSION, "version": __version__,
        "pid": daemon.pid, "instance": daemon.instance, "started": daemon.started,
        "socket": str(daemon.config.socket), **daemon.cache_identity(),
    }
    return web.json_response(body, status=503 if daemon.draining else 200)


async def metrics(request: web.Request) -> web.Response:
    daemon = _daemon(request)
    text = daemon.metrics.render(await daemon.snapshot())
    return web.Response(body=text, headers={"Content-Type": CONTENT_TYPE})


async def status(request: web.Request) -> web.Response:
    return web.json_response(await _daemon(request).status())


# -- datasets and plans ---------------------------------------------------------------------------


async def open_dataset(request: web.Request) -> web.Response:
    daemon = _daemon(request)
    body = await _body(request)
    source = schema.source(body.get("dataset"), local_sources=daemon.config.local_sources)
    async with daemon.datasets.use(source, schema.fingerprint(body.get("fingerprint"))) as (dataset, fingerprint):
        m = dataset.manifest
        return web.json_response({"name": dataset.name, "shards": len(m), "bytes": m.total_bytes,
                                  "block_size": m.block_size, "fingerprint": fingerprint})


async def register_plan(request: web.Request) -> web.Response:
    daemon = _daemon(request)
    consumer, key, plan_id = _ids(request)
    req = schema.plan_request(await _body(request), local_sources=daemon.config.local_sources)
    daemon.registry.seen(consumer, key)  # another process's consumer: refused before anything is opened
    async with daemon.datasets.use(req.source, req.fingerprint) as (dataset, fingerprint):
        order = schema.order(req.order_body, len(dataset.manifest))
        assert plan_id is not None
        plan = await daemon.registry.register(consumer, key, plan_id, dataset, order, fingerprint=fingerprint,
                                              cursor=req.cursor, window_bytes=req.window_bytes, name=req.name,
                                              pid=_peer_pid(request), floor_bytes=req.floor_bytes,
                                              ahead_seconds=req.ahead_seconds)
    return web.json_response({"plan": plan_id, "length": len(plan), "cursor": plan.cursor,
                              "window_bytes": plan.window_bytes, "floor_bytes": plan.floor_bytes,
                              "ahead_seconds": plan.ahead_seconds, "lease": daemon.config.lease})


async def advance(request: web.Request) -> web.Response:
    daemon = _daemon(request)
    consumer, key, plan_id = _ids(request)
    assert plan_id is not None
    plan = daemon.registry.get(consumer, key, plan_id).plan
    body = await _body(request)
    position = schema.integer(body.get("position"), "position", high=len(plan))
    # Blobs the consumer found complete in the cache by itself, without asking: served from the cache too.
    hits = schema.integer(body.get("hits", 0), "hits", high=schema.MAX_PLAN)
    hit_bytes = schema.integer(body.get("hit_bytes", 0), "hit_bytes")
    plan.advance(position)
    if hits:
        daemon.metrics.served(hit_bytes, True, count=hits)
    return web.json_response({"cursor": plan.cursor})


async def plan_ready(request: web.Request) -> web.Response:
    daemon = _daemon(request)
    consumer, key, plan_id = _ids(request)
    assert plan_id is not None
    plan = daemon.registry.get(consumer, key, plan_id).plan
    if not len(plan):
        raise DaemonRequestError("position: the plan is empty")
    position = schema.integer(request.query.get("position"), "position", high=len(plan) - 1)
    timeout = schema.seconds(request.query.get("timeout", daemon.config.max_poll), "timeout",
                             high=daemon.config.max_poll)
    ref = plan.ref(position)
    urgent = schema.integer(request.query.get("urgent", "1"), "urgent", high=1) == 1
    again = request.query.get("again") == "1"
    return await _long_poll(daemon, ref.digest, ref.size,
                            _refused_again(lambda: plan.ready(position, urgent=urgent)), timeout,
                            again, position=position)


async def _refused_again(attempt: Callable[[], Awaitable[T]]) -> T:
    """``attempt()``, again when the origin refused it, a bounded number of times.

    The engine fetches each blob once however many plans want it, through the
    store of whichever consumer asked first: a refusal (a denied key, an
    object its endpoint lacks) may be another consumer's. Asked again, the
    blob is fetched through this consumer's own store unless another fetch is
    under way; these errors are never retried at the origin, so a consumer
    refused with its own keys learns it after a few quick round trips.
    """
    for _ in range(REFUSED_ATTEMPTS - 1):
        try:
            return await attempt()
        except (AccessDenied, ShardNotFound):
            pass
    return await attempt()


async def close_plan(request: web.Request) -> web.Response:
    consumer, key, plan_id = _ids(request)
    assert plan_id is not None
    return web.json_response({"closed": await _daemon(request).registry.close(consumer, key, plan_id)})


async def heartbeat(request: web.Request) -> web.Response:
    daemon = _daemon(request)
    consumer, key, _ = _ids(request)
    record = daemon.registry.seen(consumer, key, _peer_pid(request))
    engine = daemon.engine
    counters = {**engine.stats.as_dict(), **{f"origin_{k}": v for k, v in engine.origin_stats.snapshot().items()}}
    return web.json_response({"plans": sorted(record.plans), "lease": daemon.config.lease, "counters": counters})


async def drop_consumer(request: web.Request) -> web.Response:
    consumer, key, _ = _ids(request)
    return web.json_response({"closed": await _daemon(request).registry.drop(consumer, key)})


async def block_ready(request: web.Request) -> web.Response:
    daemon = _daemon(request)
    body = await _body(request)
    source = schema.source(body.get("dataset"), local_sources=daemon.config.local_sources)
    async with daemon.datasets.use(source, schema.fingerprint(body.get("fingerprint"))) as (dataset, _):
        if not len(dataset.manifest):
            raise DaemonRequestError("index: the dataset has no shards")
        index = schema.integer(body.get("index"), "index", high=len(dataset.manifest) - 1)
        ref = dataset.ref(index)
        if not ref.blocks:
            raise DaemonRequestError(f"block: shard {index} is empty")
        block = schema.integer(body.get("block"), "block", high=len(ref.blocks) - 1)
        timeout = schema.seconds(body.get("timeout", daemon.config.max_poll), "timeout", high=daemon.config.max_poll)
        cache = daemon.engine.cache
        start, end = block_range(block, ref.size, ref.block_size)

        async def verified() -> dict[str, Any]:
            if cache.state(ref.digest) is not BlobState.COMPLETE:
                # This block alone, urgently; the bytes stay here and on disk, where the consumer reads them.
                await _refused_again(lambda: daemon.engine.read_block(ref, block))
                await daemon.block_recorded(ref, block)
            complete = cache.state(ref.digest) is BlobState.COMPLETE
            return {"path": str(cache.complete_path(ref.digest)) if complete else None}

        again = body.get("again") is True
        return await _long_poll(daemon, ref.digest, end - start, verified(), timeout, again, index=index,
                                block=block)


async def _long_poll(daemon: "Daemon", digest: str, nbytes: int, waiting: Awaitable[Path | dict[str, Any]],
                     timeout: float, again: bool, **echo: int) -> web.Response:
    """Wait for ``waiting`` up to ``timeout``: 200 with its answer, 202 pending, 503 if the daemon stops.

    ``again``: the consumer asked before and was told to wait (so it counts as a miss either way).
    """
    hit = not again and daemon.engine.cache.state(digest) is BlobState.COMPLETE
    began = time.monotonic()
    task = asyncio.ensure_future(waiting)
    stop = asyncio.ensure_future(daemon.stopping.wait())
    try:
        done, _ = await asyncio.wait({task, stop}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        if not task.done():
            task.cancel()  # the fetch is shared and shielded: it goes on for the next poll
    daemon.metrics.ready_wait.observe(time.monotonic() - began)
    if task not in done:
        if daemon.stopping.is_set():
            raise DaemonUnavailable("the daemon is stopping; reconnect to its successor")
        daemon.metrics.ready_requests.labels("pending").inc()
        return web.json_response({"pending": True, **echo}, status=PENDING)
    try:
        result = task.result()
    except StagerError:
        daemon.metrics.ready_requests.labels("error").inc()
        raise
    daemon.metrics.ready_requests.labels("ready").inc()
    daemon.metrics.served(nbytes, hit)
    answer = {"path": str(result)} if isinstance(result, Path) else result
    return web.json_response({**answer, "digest": digest, **echo})


# -- pins and eviction ----------------------------------------------------------------------------


async def pin(request: web.Request) -> web.Response:
    return await _pin(request, True)


async def unpin(request: web.Request) -> web.Response:
    return await _pin(request, False)


async def _pin(request: web.Request, keep: bool) -> web.Response:
    daemon = _daemon(request)
    body = await _body(request)
    source = schema.source(body.get("dataset"), local_sources=daemon.config.local_sources)
    async with daemon.datasets.use(source, schema.fingerprint(body.get("fingerprint"))) as (dataset, _):
        count = await daemon.pin_dataset(dataset, keep)
        return web.json_response({"pinned" if keep else "unpinned": count, "name": dataset.name})


async def evict(request: web.Request) -> web.Response:
    daemon = _daemon(request)
    nbytes = schema.integer((await _body(request)).get("bytes"), "bytes", low=1)
    return web.json_response({"freed": await daemon.evict(nbytes)})
