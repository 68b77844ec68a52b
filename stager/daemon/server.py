"""The daemon's life: start, serve, drain, stop.

Start: own the socket (``listener.py``: refuses a second daemon), open the
cache (reconciling it with the disk, which also makes partial blobs of a
daemon that was killed resumable), build the one engine every consumer
shares, serve the API on the socket (and ``/metrics`` on TCP if asked), start
the lease reaper, and tell systemd it is ready.

Stop (SIGTERM, SIGINT, or :meth:`Daemon.stop`), bounded by ``drain_timeout``:
answer 503 to new requests and to waiting long-polls (consumers reconnect to
the next daemon or fall back to their own engine), close every plan so no new
blob fetch starts, then take every slot of the engine's priority gate at the
highest priority: each block request in flight finishes, lands in the cache
and is recorded as verified, and no new one starts. What is still in flight
when the bound runs out is cancelled; either way the cache is consistent (it
is safe against kill -9 at any point) and the next daemon resumes partial
blobs without fetching a verified block twice. A watchdog ends the process
if stopping itself hangs, and a second signal ends it at once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import os
import secrets
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable

from aiohttp import web

from .. import __version__
from ..cache import BlobState, CacheTier
from ..config import CacheConfig, FetchConfig, parse_address
from ..engine import BlobRef, Dataset, Engine
from ..errors import ConfigError
from .api import build_app, build_metrics_app
from .config import DaemonConfig
from .datasets import DatasetVersions
from .listener import SocketOwner
from .metrics import DaemonMetrics, DaemonSnapshot, PlanSnapshot
from .plans import PlanRegistry

if TYPE_CHECKING:
    from ..cluster import ClusterNode, PeerConfig

log = logging.getLogger(__name__)

READY_SCAN_LIMIT = 4096  # positions looked at per plan when measuring readiness ahead of its cursor
WATCHDOG_GRACE = 20.0  # seconds past drain_timeout after which a stop that hangs ends the process


class Daemon:
    """One engine and one cache for every consumer of the node, behind a Unix socket.

    Use ``await daemon.start()`` then ``await daemon.stop()`` (or ``async with``);
    :func:`run_daemon` adds signal handling for ``stager serve``.
    """

    def __init__(self, config: DaemonConfig, cache: CacheConfig, fetch: FetchConfig = FetchConfig(),
                 peers: "PeerConfig | None" = None) -> None:
        self.config = config
        self.peers = peers
        self.cluster: "ClusterNode | None" = None
        self.cache_config = cache
        self.fetch = fetch
        self.pid = os.getpid()
        self.instance = secrets.token_hex(8)
        self.started = time.time()
        self.draining = False
        self.stopping = asyncio.Event()
        self.metrics = DaemonMetrics()
        from ..checkpoint.daemon_hook import DaemonDrains  # staging directories drained here when asked

        self.checkpoint_drains = DaemonDrains()
        self.metrics.registry.register(self.checkpoint_drains)
        self.metrics_port: int | None = None
        self._owner = SocketOwner(config.socket, config.socket_group)
        self._cache: CacheTier | None = None
        self._engine: Engine | None = None
        self._registry: PlanRegistry | None = None
        self._runners: list[web.AppRunner] = []
        self._datasets: DatasetVersions | None = None
        self._queries = ThreadPoolExecutor(max_workers=2, thread_name_prefix="stager-daemon")
        self._reapers: list[asyncio.Task[None]] = []
        self._stop_task: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()
        self._block_written = asyncio.Event()  # replaced by a fresh one each time a block is recorded

    @property
    def cache(self) -> CacheTier:
        assert self._cache is not None, "the daemon is not started"
        return self._cache

    @property
    def engine(self) -> Engine:
        assert self._engine is not None, "the daemon is not started"
        return self._engine

    @property
    def registry(self) -> PlanRegistry:
        assert self._registry is not None, "the daemon is not started"
        return self._registry

    async def __aenter__(self) -> "Daemon":
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    # -- start -----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Own the socket, open the cache and the engine, and serve.

        Raises:
            DaemonError: another daemon already serves the socket.
            ConfigError: the socket path, its group or the metrics address cannot be used.
            CacheError: the cache directory cannot be used.
        """
        self._owner.acquire()
        try:
            self._cache = await self._in_thread(CacheTier, self.cache_config)
            sources = None
            if self.peers is not None:  # a node of a cluster: peers are the engine's sources before the origin
                from ..cluster import ClusterNode

                self.cluster = ClusterNode(self.peers)
                await self.cluster.prepare()
                sources = self.cluster.sources
            self._engine = Engine(self._cache, self.fetch, sources=sources)
            self._engine.add_block_listener(self._on_block)
            self._registry = PlanRegistry(self._engine, self.config.lease)
            self._datasets = DatasetVersions(self._engine, idle=self.config.lease)
            runner = await self._runner(build_app(self))
            await web.SockSite(runner, self._owner.bind()).start()
            if self.config.metrics_address:
                host, port = parse_address(self.config.metrics_address)
                runner = await self._runner(build_metrics_app(self))
                try:
                    await web.TCPSite(runner, host, port).start()
                except OSError as exc:
                    raise ConfigError(f"--metrics-address {self.config.metrics_address}: cannot listen there: "
                                      f"{exc.strerror or exc}") from exc
                self.metrics_port = runner.addresses[0][1] if runner.addresses else None
            if self.cluster is not None:
                await self.cluster.start(self._engine, lambda: [(v.dataset, v.fingerprint)
                                                                for v in self.datasets.versions()], self.stopping)
                self.datasets.listeners.append(self.cluster.version_held)
            interval = min(5.0, self.config.lease / 4)
            self._reapers = [asyncio.create_task(self.registry.run_reaper(interval), name="stager lease reaper"),
                             asyncio.create_task(self._drop_idle_datasets(interval), name="stager dataset reaper")]
        except BaseException:
            await self._close()
            raise
        usage = self.cache.usage()
        log.info("stager daemon %s (pid %d) serving %s; cache %s: %d of %d bytes used%s", __version__, self.pid,
                 self.config.socket, self.cache.directory, usage.used, usage.capacity,
                 f"; metrics on {self.config.metrics_address} (port {self.metrics_port})"
                 if self.metrics_port is not None else "")

    async def _runner(self, app: web.Application) -> web.AppRunner:
        runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=2.0)
        await runner.setup()
        self._runners.append(runner)
        return runner

    # -- what the API asks of it -------------------------------------------------------------------

    @property
    def datasets(self) -> DatasetVersions:
        """The dataset versions held for consumers, each proven with its own credentials (``datasets.py``)."""
        assert self._datasets is not None, "the daemon is not started"
        return self._datasets

    async def block_recorded(self, ref: BlobRef, block: int) -> None:
        """Wait until block ``block`` of ``ref`` is recorded as verified in the cache, so that another
        process can read it (the engine hands a fetched block to its waiters before its disk write)."""
        cache = self.cache

        def recorded() -> bool:
            record = cache.record(ref.digest)
            return record is not None and (record.state is BlobState.COMPLETE or block in record.verified)

        while True:  # bounded by the caller's long-poll timeout; woken by each recorded block
            written = self._block_written
            if await self._in_thread(recorded):
                return
            try:
                async with asyncio.timeout(1.0):  # a block recorded by another process wakes nobody here
                    await written.wait()
            except TimeoutError:
                pass

    def _on_block(self, ref: BlobRef, nbytes: int) -> None:
        self._block_written.set()
        self._block_written = asyncio.Event()

    async def pin_dataset(self, dataset: Dataset, keep: bool) -> int:
        """Pin (or unpin) every blob of a dataset, present or not; returns how many."""
        m = dataset.manifest
        digests = sorted({m.digest(i) for i in range(len(m))})
        action = self.cache.pin if keep else self.cache.unpin

        def run() -> int:
            for digest in digests:
                action(digest)
            return len(digests)

        return await self._in_thread(run)

    async def evict(self, nbytes: int) -> int:
        """Free at least ``nbytes`` if possible, by the engine's policy (never a plan's window); bytes freed."""
        engine = self.engine
        return await self._in_thread(self.cache.evict, nbytes, rank=engine.eviction_rank,
                                     protect=engine.protected_digests())

    def cache_identity(self) -> dict[str, Any]:
        """Which directory the cache is, so consumers can tell whether it is theirs."""
        directory = self.cache_config.directory
        try:
            st = os.stat(directory)
            dev, ino = st.st_dev, st.st_ino
        except OSError:
            dev = ino = None
        capacity = self._cache.capacity if self._cache is not None else None
        return {"cache": str(directory), "cache_dev": dev, "cache_ino": ino, "capacity": capacity}

    async def snapshot(self) -> DaemonSnapshot:
        """Every number /metrics and /v1/status show; sqlite work runs off the event loop."""
        cache, engine, registry = self.cache, self.engine, self.registry
        windows = []
        for reg in registry.plans():
            plan = reg.plan
            end = min(len(plan), plan.cursor + READY_SCAN_LIMIT)
            m = plan.dataset.manifest
            indexes = plan.order[plan.cursor:end]
            windows.append((reg, plan.cursor, len(plan), (plan.window_bytes, plan.ahead_bytes, plan.rate),
                            plan.dataset.name, [m.digest(int(i)) for i in indexes], m.sizes[indexes].tolist()))

        def query() -> tuple[Any, list[tuple[int, int]]]:
            ready = []
            for *_, digests, sizes in windows:
                steps = nbytes = 0
                for digest, size in zip(digests, sizes, strict=True):
                    if cache.state(digest) is not BlobState.COMPLETE:
                        break
                    steps, nbytes = steps + 1, nbytes + size
                ready.append((steps, nbytes))
            return cache.usage(), ready

        usage, ready = await self._in_thread(query)
        plans = [PlanSnapshot(reg.consumer, reg.id, name, cursor, length, window, steps, nbytes, ahead, rate)
                 for (reg, cursor, length, (window, ahead, rate), name, _, _), (steps, nbytes)
                 in zip(windows, ready, strict=True)]
        return DaemonSnapshot(
            engine=engine.stats.as_dict(), origin=engine.origin_stats.snapshot(), usage=usage,
            evicted_blobs=cache.evicted_blobs, evicted_bytes=cache.evicted_bytes, plans=plans,
            consumers=len(registry.consumers), datasets=len(self.datasets), draining=self.draining,
            started=self.started, cache=str(cache.directory), socket=str(self.config.socket),
            cluster=self.cluster.status() if self.cluster is not None else None)

    async def status(self) -> dict[str, Any]:
        """The daemon's state as JSON-ready data (``stager status``)."""
        snap = await self.snapshot()
        datasets = await self._in_thread(self.cache.datasets)
        return {
            "daemon": {"pid": self.pid, "version": __version__, "instance": self.instance,
                       "started": self.started, "uptime": time.time() - self.started,
                       "socket": str(self.config.socket), "draining": self.draining,
                       "metrics_port": self.metrics_port, "consumers": snap.consumers},
            "cache": {"directory": snap.cache, "capacity": snap.usage.capacity, "used": snap.usage.used,
                      "free": snap.usage.free, "complete_blobs": snap.usage.complete,
                      "partial_blobs": snap.usage.partial, "evicted_blobs": snap.evicted_blobs,
                      "evicted_bytes": snap.evicted_bytes},
            "datasets": [{"name": d.name, "blobs": d.blobs, "bytes": d.bytes, "complete": d.complete,
                          "partial": d.partial, "complete_bytes": d.complete_bytes} for d in datasets],
            "plans": [{"consumer": p.consumer, "plan": p.plan, "dataset": p.dataset, "cursor": p.cursor,
                       "length": p.length, "window_bytes": p.window_bytes, "ahead_bytes": p.ahead_bytes,
                       "rate": p.rate, "ready_steps": p.ready_steps, "ready_bytes": p.ready_bytes}
                      for p in snap.plans],
            "engine": snap.engine,
            "origin": snap.origin,
            **({"cluster": snap.cluster} if snap.cluster is not None else {}),
        }

    # -- stop ------------------------------------------------------------------------------------

    def request_stop(self) -> asyncio.Task[None]:
        """Start stopping (idempotent); the task ends when the daemon has stopped."""
        if self._stop_task is None:
            self._stop_task = asyncio.create_task(self.stop(), name="stager daemon stop")
        return self._stop_task

    async def stop(self) -> None:
        """Drain (bounded by ``drain_timeout``), then close everything and remove the socket. Idempotent."""
        if self.draining:
            await self._stopped.wait()
            return
        self.draining = True
        self.stopping.set()
        began = time.monotonic()
        try:
            if self._registry is not None:
                await self._registry.close_all()
            if self._engine is not None:
                try:
                    async with asyncio.timeout(self.config.drain_timeout):
                        await self._quiesce()
                    log.info("drained the block requests in flight in %.1fs", time.monotonic() - began)
                except TimeoutError:
                    log.warning("block requests still in flight after %.0fs; cancelling them (verified blocks "
                                "stay in the cache)", self.config.drain_timeout)
        finally:
            await self._close()
            self._stopped.set()
        log.info("stager daemon stopped in %.1fs", time.monotonic() - began)

    async def _quiesce(self) -> None:
        """Hold every slot of the engine's gate: requests in flight finish, none starts."""
        await self.engine.gate.hold_all(-math.inf)

    async def _drop_idle_datasets(self, interval: float) -> None:
        """Every ``interval`` seconds, drop the dataset versions no consumer used for a lease."""
        while True:
            await asyncio.sleep(interval)
            try:
                await self.datasets.drop_idle(reg.plan.dataset for reg in self.registry.plans())
            except Exception:  # noqa: BLE001 - the reaper must outlive one bad round
                log.exception("dropping idle datasets failed")

    async def _close(self) -> None:
        for reaper in self._reapers:
            reaper.cancel()
        if self.cluster is not None:
            await self.cluster.stop()
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()
        if self._engine is not None:
            await self._engine.close()
        if self._datasets is not None:
            await self._datasets.close()
        if self._cache is not None:
            await self._in_thread(self._cache.close)
        self._queries.shutdown(wait=False)
        self._owner.release()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def _in_thread(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._queries, functools.partial(fn, *args, **kwargs))


async def run_daemon(config: DaemonConfig, cache: CacheConfig, fetch: FetchConfig = FetchConfig(),
                     peers: "PeerConfig | None" = None) -> None:
    """Run a daemon until SIGTERM or SIGINT, then drain and stop (``stager serve``).

    Raises:
        DaemonError: another daemon already serves the socket.
        ConfigError, CacheError: as :meth:`Daemon.start`.
    """
    daemon = Daemon(config, cache, fetch, peers)
    await daemon.start()
    loop = asyncio.get_running_loop()

    def on_signal(name: str) -> None:
        if daemon.draining:
            log.warning("%s again while stopping: exiting now (the cache stays consistent)", name)
            os._exit(1)
        log.info("%s: draining block requests in flight (at most %.0fs), then stopping", name,
                 config.drain_timeout)
        _notify_systemd("STOPPING=1")
        _start_watchdog(config.drain_timeout + WATCHDOG_GRACE)
        daemon.request_stop()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signal.Signals(signum).name)
    try:
        _notify_systemd(f"READY=1\nMAINPID={os.getpid()}")
        await daemon.wait_stopped()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await daemon.stop()


def _start_watchdog(seconds: float) -> None:
    def expire() -> None:
        log.error("stopping took more than %.0fs: exiting now (the cache stays consistent)", seconds)
        os._exit(1)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()


def _notify_systemd(message: str) -> None:
    """sd_notify(3) without libsystemd: one datagram to $NOTIFY_SOCKET, if systemd gave one."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(message.encode(), address)
    except OSError as exc:
        log.warning("could not notify systemd (%s): %s", message.split("=")[0], exc)

