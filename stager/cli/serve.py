"""``stager serve``: the node daemon (one engine, one cache, one set of origin connections per node)."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from ..config import FetchConfig
from ..daemon.config import DRAIN_TIMEOUT, LEASE, DaemonConfig, parse_address
from ..daemon_client import default_socket_path
from ..event_loop import run_async
from . import cli
from .cache_options import cache_config, cache_flags, fetch_config, fetch_flags, write_flags
from .options import POSITIVE_SIZE, SECONDS, Capacity, SecondsType, checked_by


@cli.command("serve")
@cache_flags
@fetch_flags
@write_flags
@click.option("--window", type=POSITIVE_SIZE, default=FetchConfig().window_bytes, envvar="STAGER_WINDOW",
              show_default="2GiB",
              help="Default prefetch window ahead of each consumer's cursor (a plan may ask for another).")
@click.option("--socket", "socket_path", type=click.Path(dir_okay=False, path_type=Path), envvar="STAGER_SOCKET",
              default=None, help="Unix socket of the control API [default: /run/stager/stager.sock when that "
              "directory is usable, else $XDG_RUNTIME_DIR/stager/stager.sock or /tmp/stager-UID/stager.sock].")
@click.option("--socket-group", envvar="STAGER_SOCKET_GROUP", default=None, metavar="GROUP",
              help="Let this group use the socket too (mode 0660); default: only this user (mode 0600).")
@click.option("--metrics-address", envvar="STAGER_METRICS_ADDRESS", default=None, metavar="HOST:PORT",
              callback=checked_by(parse_address),
              help="Also serve /metrics and /healthz (read-only) over TCP, e.g. 0.0.0.0:9464.")
@click.option("--drain-timeout", type=SECONDS, default=DRAIN_TIMEOUT,
              envvar="STAGER_DRAIN_TIMEOUT", show_default=True,
              help="Seconds SIGTERM/SIGINT wait for block requests in flight before cancelling them.")
@click.option("--lease", type=SecondsType(1, allow_minimum=True), default=LEASE, envvar="STAGER_LEASE",
              show_default=True, help="Seconds without a request or heartbeat after which a consumer's plans "
              "are dropped (at once when its process is seen dead).")
@click.option("--local-sources/--no-local-sources", default=True, show_default=True,
              envvar="STAGER_LOCAL_SOURCES", help="Serve datasets on local paths (read with the daemon's "
              "permissions); --no-local-sources serves only s3, gs, az and http(s) URLs, nothing chained.")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None, envvar="STAGER_CONFIG",
              help="TOML config file (the same as `stager --config FILE serve`).")
def serve_command(cache_dir: str | None, capacity: Capacity, concurrency: int,
                  bandwidth: int | None, no_hedge: bool,
                  retry_deadline: float, direct_writes: bool, window: int, socket_path: Path | None,
                  socket_group: str | None, metrics_address: str | None, drain_timeout: float, lease: float,
                  local_sources: bool, config_file: str | None) -> None:
    """Run the node daemon: consumers on this node share its engine and cache through a Unix socket.

    TokenDataset, TokenIterator, the mount, `stager stage` and `stager status` find it
    through the socket and use it; without one they run an engine in their own process.
    Stops on SIGTERM or SIGINT after draining block requests in flight.
    """
    from ..daemon.server import run_daemon

    stager_log = logging.getLogger("stager")
    if stager_log.getEffectiveLevel() > logging.INFO:
        stager_log.setLevel(logging.INFO)  # a service says what it does; -v gives debug
    daemon = DaemonConfig(socket=socket_path or default_socket_path(), socket_group=socket_group,
                          metrics_address=metrics_address, drain_timeout=drain_timeout, lease=lease,
                          local_sources=local_sources)
    fetch = fetch_config(concurrency, bandwidth, no_hedge, retry_deadline, window_bytes=window)
    run_async(run_daemon(daemon, cache_config(cache_dir, capacity, direct_writes), fetch))
