"""The node daemon's drain queue: staging directories it drains when a writer asks, and their metrics.

A :class:`CheckpointWriter` with ``drain="auto"`` asks the daemon (one POST
on its Unix socket, :func:`ask_daemon_to_drain`) before starting a drainer
process. The daemon runs each directory's drain on a thread of its own
(:class:`DaemonDrains`), with its own event loop, so the daemon's loop never
waits on a drain's disk work; the directory's drain lock still holds, so a
drainer process and the daemon never send the same checkpoint at once, and a
daemon killed mid-drain leaves a journal the next drain resumes from.

Only a client running as the daemon's own user (or root) is served: the
daemon reads the files a staging entry names, so drains asked for by another
user are refused (403) and that user's writer starts its own drainer process.

:class:`DaemonDrains` is also a Prometheus collector for ``/metrics``: bytes
staged and drained, drain lag (seconds since the oldest checkpoint not yet
drained was sealed, and its bytes), checkpoints per state.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

from .drain import Drain, DrainStats
from .staging import StagingDir

log = logging.getLogger(__name__)
ROUTE = "/v1/checkpoints/drain"
_UCRED = struct.Struct("3i")
_ASK_TIMEOUT_S = 2.0


def ask_daemon_to_drain(root: Path, socket_path: str | os.PathLike[str] | None = None) -> bool:
    """Whether the node daemon took the drain of ``root`` (False: start a drainer process).

    ``STAGER_CHECKPOINT_DRAIN=process`` skips the daemon.
    """
    if os.environ.get("STAGER_CHECKPOINT_DRAIN") == "process":
        return False
    from ..socket_path import default_socket_path

    path = Path(socket_path) if socket_path else default_socket_path()
    body = json.dumps({"staging": str(root)}).encode()
    request = (f"POST {ROUTE} HTTP/1.1\r\nHost: stager\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(_ASK_TIMEOUT_S)
    try:
        sock.connect(str(path))
        sock.sendall(request)
        answer = sock.recv(256)
    except OSError:
        return False
    finally:
        sock.close()
    return answer.startswith(b"HTTP/1.1 202")


class DaemonDrains:
    """The staging directories a daemon drains, one thread each while there is work (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads: dict[Path, threading.Thread] = {}
        self._again: set[Path] = set()
        self._stats: dict[Path, DrainStats] = {}

    def submit(self, root: Path) -> None:
        """Drain ``root`` (again, if a drain of it is running: a new checkpoint may have just been sealed)."""
        root = root.absolute()
        with self._lock:
            self._stats.setdefault(root, DrainStats())
            thread = self._threads.get(root)
            if thread is not None and thread.is_alive():
                self._again.add(root)
                return
            thread = threading.Thread(target=self._run, args=(root,), name=f"stager drain {root.name}", daemon=True)
            self._threads[root] = thread
        thread.start()

    def _run(self, root: Path) -> None:
        from .drainer import drain_until_empty

        staging = StagingDir(root)
        while True:
            try:
                drain_until_empty(staging, Drain(staging, stats=self._stats[root]))
            except Exception:  # noqa: BLE001 - a bad directory must not end the daemon's drains
                log.exception("draining %s failed", root)
            with self._lock:
                if root not in self._again:
                    return
                self._again.discard(root)

    # -- metrics ---------------------------------------------------------------------------------

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        drained = CounterMetricFamily("stager_checkpoint_drained_bytes", "Checkpoint bytes the drain sent, "
                                      "by staging directory.", labels=["staging"])
        skipped = CounterMetricFamily("stager_checkpoint_skipped_bytes", "Checkpoint bytes a resumed drain found "
                                      "verified at a store already (not sent again).", labels=["staging"])
        staged = GaugeMetricFamily("stager_checkpoint_staged_bytes", "Bytes held in the staging directory.",
                                   labels=["staging"])
        lag_s = GaugeMetricFamily("stager_checkpoint_drain_lag_seconds", "Seconds since the oldest checkpoint "
                                  "not drained yet was saved (0: none waiting).", labels=["staging"])
        lag_b = GaugeMetricFamily("stager_checkpoint_drain_lag_bytes", "Bytes of the checkpoints not drained yet.",
                                  labels=["staging"])
        states = GaugeMetricFamily("stager_checkpoints", "Checkpoints in the staging directory by state "
                                   "(staging: being saved, draining: saved, not at every store yet, drained).",
                                   labels=["staging", "state"])
        with self._lock:
            roots = dict(self._stats)
        for root, stats in roots.items():
            label = str(root)
            drained.add_metric([label], stats.bytes_drained)
            skipped.add_metric([label], stats.bytes_skipped)
            try:
                entries = StagingDir(root).entries()
            except OSError:
                entries = []
            pending = [e for e in entries if e.sealed_at is not None and not e.drained]
            staged.add_metric([label], sum(e.size() for e in entries))
            oldest = min((e.sealed_at for e in pending if e.sealed_at is not None), default=None)
            stats.oldest_pending_since = oldest
            lag_s.add_metric([label], stats.lag_seconds())
            lag_b.add_metric([label], sum(e.size() for e in pending))
            counts = {"staging": sum(1 for e in entries if e.sealed_at is None), "draining": len(pending),
                      "drained": sum(1 for e in entries if e.drained)}
            for state, n in counts.items():
                states.add_metric([label, state], n)
        yield from (drained, skipped, staged, lag_s, lag_b, states)


def peer_uid(request) -> int | None:
    """The uid of the process at the other end of the daemon's Unix socket (kernel-given)."""
    transport = request.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    try:
        _, uid, _ = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    except (OSError, AttributeError):
        return None
    return uid


async def drain_route(request):
    """``POST /v1/checkpoints/drain {"staging": DIR}``: 202 once the daemon drains DIR; 403 for another user."""
    from aiohttp import web

    from ..daemon import schema
    from ..daemon.api import DAEMON

    drains: DaemonDrains | None = getattr(request.app[DAEMON], "checkpoint_drains", None)
    if drains is None:
        return web.json_response({"error": "this daemon does not drain checkpoints"}, status=404)
    uid = peer_uid(request)
    if uid is None or uid not in (0, os.geteuid()):
        return web.json_response({"error": "drains are run for the daemon's own user only"}, status=403)
    body = schema.parse_json(await request.read())
    root = body.get("staging") if isinstance(body, dict) else None
    if not isinstance(root, str) or not os.path.isabs(root):
        return web.json_response({"error": "staging: an absolute directory path is required"}, status=400)
    drains.submit(Path(root))
    return web.json_response({"staging": root}, status=202)

