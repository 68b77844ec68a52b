"""``stager serve``: the node daemon (one engine, one cache, one set of origin connections per node)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..cluster.membership import parse_peer_spec
from ..config import DEFAULT_AHEAD_SECONDS, FetchConfig, parse_address
from ..daemon.config import DRAIN_TIMEOUT, LEASE, DaemonConfig
from ..daemon_client import default_socket_path
from ..errors import ConfigError
from ..event_loop import run_async
from . import cli
from .cache_options import cache_config, cache_flags, fetch_config, fetch_flags, write_flags
from .options import POSITIVE_SIZE, RATE, SECONDS, Capacity, SecondsType, checked_by

if TYPE_CHECKING:
    from ..cluster import PeerConfig


@cli.command("serve")
@cache_flags
@fetch_flags
@write_flags
@click.option("--window", type=POSITIVE_SIZE, default=FetchConfig().window_bytes, envvar="STAGER_WINDOW",
              show_default="2GiB",
              help="Default prefetch window ahead of each consumer's cursor (a plan may ask for another): the "
              "most staged ahead of it.")
@click.option("--ahead-seconds", type=SECONDS, default=DEFAULT_AHEAD_SECONDS, envvar="STAGER_AHEAD_SECONDS",
              show_default=True,
              help="Seconds of each consumer's measured reading staged ahead of its cursor, past what it needs "
              "not to stall and within --window (a plan may ask for another).")
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
@click.option("--peer-listen", envvar="STAGER_PEER_LISTEN", default=None, metavar="HOST:PORT",
              callback=checked_by(lambda text: parse_address(text, what="--peer-listen")),
              help="Serve this node's cache to the cluster's other daemons on HOST:PORT (TCP); with --peers.")
@click.option("--peers", envvar="STAGER_PEERS", default=None, metavar="SPEC",
              callback=checked_by(lambda text: parse_peer_spec(text, 1)),
              help="The cluster's members: host:port,... (this node's own entry is recognised), slurm "
              "(SLURM_JOB_NODELIST on the --peer-listen port), dns:NAME[:PORT] (A/AAAA records, looked up "
              "again every 30 s) or file:PATH (one address a line, read again when it changes).")
@click.option("--peer-secret-file", type=click.Path(dir_okay=False), envvar="STAGER_PEER_SECRET_FILE",
              default=None, help="The cluster secret (the same on every node, at least 16 bytes); default: "
              "the variable STAGER_PEER_SECRET. Requests prove it with an HMAC, never sending it.")
@click.option("--peer-tls-cert", type=click.Path(dir_okay=False), envvar="STAGER_PEER_TLS_CERT", default=None,
              help="PEM certificate of this node: the peer listener speaks TLS (with --peer-tls-key).")
@click.option("--peer-tls-key", type=click.Path(dir_okay=False), envvar="STAGER_PEER_TLS_KEY", default=None,
              help="PEM private key of --peer-tls-cert.")
@click.option("--peer-tls-ca", type=click.Path(dir_okay=False), envvar="STAGER_PEER_TLS_CA", default=None,
              help="PEM CA: peers must present certificates it signed, both ways.")
@click.option("--peer-bandwidth", type=RATE, default=None, envvar="STAGER_PEER_BANDWIDTH", show_default="unlimited",
              help="Bytes per second this node sends to any one peer (e.g. 500MB/s).")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None, envvar="STAGER_CONFIG",
              help="TOML config file (the same as `stager --config FILE serve`).")
def serve_command(cache_dir: str | None, capacity: Capacity, concurrency: int,
                  bandwidth: int | None, no_hedge: bool,
                  retry_deadline: float, direct_writes: bool, durable: bool, window: int, ahead_seconds: float,
                  socket_path: Path | None,
                  socket_group: str | None, metrics_address: str | None, drain_timeout: float, lease: float,
                  local_sources: bool, peer_listen: str | None, peers: str | None, peer_secret_file: str | None,
                  peer_tls_cert: str | None, peer_tls_key: str | None, peer_tls_ca: str | None,
                  peer_bandwidth: int | None, config_file: str | None) -> None:
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
    fetch = fetch_config(concurrency, bandwidth, no_hedge, retry_deadline, durable, window_bytes=window,
                         ahead_seconds=ahead_seconds)
    cluster = peer_config(peer_listen, peers, peer_secret_file, peer_tls_cert, peer_tls_key, peer_tls_ca,
                          peer_bandwidth)
    run_async(run_daemon(daemon, cache_config(cache_dir, capacity, direct_writes), fetch, cluster))


def peer_config(listen: str | None, peers: str | None, secret_file: str | None, tls_cert: str | None,
                tls_key: str | None, tls_ca: str | None, bandwidth: int | None) -> "PeerConfig | None":
    """The cluster settings, or None when this daemon is not a node of a cluster. Raises ConfigError."""
    if listen is None and peers is None:
        if secret_file or tls_cert or tls_key or tls_ca or bandwidth:
            raise ConfigError("the --peer-* settings need --peer-listen and --peers")
        return None
    if listen is None or peers is None:
        raise ConfigError("--peer-listen and --peers go together (this node's address, and the cluster's)")
    from ..cluster import PeerConfig
    from ..cluster.auth import load_secret

    return PeerConfig.build(listen, peers, load_secret(secret_file), tls_cert=tls_cert, tls_key=tls_key,
                            tls_ca=tls_ca, bandwidth=bandwidth)
