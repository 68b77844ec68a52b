"""``stager status`` and ``stager verify``: what the cache holds, and a scrub of it.

When a node daemon serves the cache, ``status`` asks it (``/v1/status``), so
it also shows the daemon, its consumers' plans and how far ahead of each
cursor the data is ready; otherwise it reads the cache's index itself.
Both only read, so they work on a full disk: when sqlite cannot even open
the index there (the room kept for it spent), they read the index file
alone, and ``verify`` reports what is bad without dropping it.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from ..cache import CacheTier, CacheUsage, DatasetSummary, VerifyReport
from ..cache.blob_index import BlobIndex
from ..cache.layout import FORMAT_FILE, CacheLayout
from ..cache.reserve import IndexReserve
from ..cache.verify import scrub
from ..config import CacheConfig
from ..errors import CacheError, DiskFull, StagerError
from ..event_loop import run_async
from ..progress import stderr_console
from . import cli
from .cache_options import cache_config, cache_flags
from .options import SHARE, Capacity

log = logging.getLogger(__name__)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


@cli.command("status")
@cache_flags
@click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout instead of a table.")
@click.option("--socket", "socket_path", type=click.Path(dir_okay=False), envvar="STAGER_SOCKET", default=None,
              help="The node daemon's socket (default: see `stager serve --help`); asked when it serves --cache.")
def status_command(cache_dir: str | None, capacity: Capacity, as_json: bool, socket_path: str | None) -> None:
    """Show what the cache holds: capacity, use, and each dataset's blobs (complete and partial).

    When a node daemon serves the cache, also show the daemon and its consumers' plans.
    """
    config = cache_config(cache_dir, capacity)
    daemon = _daemon_status(config, socket_path)
    if daemon is not None:
        c = daemon["cache"]
        directory = c["directory"]
        usage = {"capacity": c["capacity"], "used": c["used"], "free": c["free"],
                 "complete_blobs": c["complete_blobs"], "partial_blobs": c["partial_blobs"]}
        datasets = daemon["datasets"]
    else:
        if (empty := _not_made_yet(config)) is not None:
            directory, u, summaries = empty
        else:
            try:
                cache = CacheTier(config, reconcile=False)  # only reads
            except DiskFull as exc:
                directory, u, summaries = _read_on_full_disk(config)
                log.info("%s; read the index file alone", exc)
            else:
                try:
                    u, summaries = cache.usage(), cache.datasets()
                finally:
                    cache.close()
                directory = str(cache.directory)
        datasets = [{"name": d.name, "blobs": d.blobs, "bytes": d.bytes, "complete": d.complete,
                     "partial": d.partial, "complete_bytes": d.complete_bytes} for d in summaries]
        usage = {"capacity": u.capacity, "used": u.used, "free": u.free, "complete_blobs": u.complete,
                 "partial_blobs": u.partial}
    if as_json:
        report: dict[str, Any] = {"cache": directory, **usage, "datasets": datasets}
        if daemon is not None:
            report["daemon"] = {**daemon["daemon"], "plans": daemon["plans"]}
            report["daemon"]["fetch"] = {k: v for k, v in (daemon.get("engine") or {}).items()
                                         if k in ("concurrency", "concurrency_peak", "concurrency_ceiling",
                                                  "requests_in_flight", "throughput_bps", "throttle_backoffs")}
            if "cluster" in daemon:
                report["cluster"] = {**daemon["cluster"], **_origin_and_peers(daemon.get("engine") or {})}
        click.echo(json.dumps(report, sort_keys=True))
        return
    click.echo(f"cache {directory}: {_size(usage['used'])} used of {_size(usage['capacity'])} "
               f"({usage['complete_blobs']} complete blobs, {usage['partial_blobs']} partial)")
    if daemon is not None:
        d = daemon["daemon"]
        click.echo(f"daemon pid {d['pid']} on {d['socket']}, up {d['uptime']:.0f}s: {d['consumers']} consumer(s), "
                   f"{len(daemon['plans'])} plan(s)")
        e = daemon.get("engine") or {}
        if "concurrency" in e:  # the adaptive limit and what it achieves (engine/concurrency.py)
            click.echo(f"fetching: {int(e['requests_in_flight'])} requests in flight, limit {int(e['concurrency'])} "
                       f"(peak {int(e['concurrency_peak'])}, ceiling {int(e['concurrency_ceiling'])}), "
                       f"{e['throughput_bps'] / 1e6:,.1f} MB/s, {int(e['throttle_backoffs'])} SlowDown back-offs")
        if "cluster" in daemon:
            _echo_cluster(daemon["cluster"], e)
    table = Table("dataset", "shards", "size", "complete", "partial", "staged")
    for d in datasets:
        share = d["complete_bytes"] / d["bytes"] if d["bytes"] else 1.0
        table.add_row(d["name"], f"{d['blobs']:,}", _size(d["bytes"]), f"{d['complete']:,}", f"{d['partial']:,}",
                      f"{share:.0%}")
    if datasets:
        stderr_console().print(table)
    if daemon is not None and daemon["plans"]:
        plans = Table("consumer", "plan", "dataset", "position", "ready ahead", "reads", "stages ahead")
        for p in daemon["plans"]:
            rate = p.get("rate")  # a daemon of an earlier version shows neither
            plans.add_row(p["consumer"], p["plan"], p["dataset"], f"{p['cursor']:,} / {p['length']:,}",
                          f"{p['ready_steps']:,} shards, {_size(p['ready_bytes'])}",
                          "not measured yet" if rate is None else f"{rate / 1e6:,.1f} MB/s",
                          _size(p["ahead_bytes"]) if "ahead_bytes" in p else "")
        stderr_console().print(plans)


def _origin_and_peers(engine: dict[str, Any]) -> dict[str, int]:
    return {"staged_from_origin": int(engine.get("bytes_from_origin", 0)),
            "staged_from_peers": int(engine.get("bytes_from_peers", 0))}


def _echo_cluster(c: dict[str, Any], engine: dict[str, Any]) -> None:
    """The cluster as this node sees it: members, and what crossed the origin and peer links."""
    staged = _origin_and_peers(engine)
    failures = ", ".join(f"{n} {kind}" for kind, n in c["peer_failures"].items() if n) or "none"
    click.echo(f"cluster node {c['me']} ({c['spec']}): {len(c['live'])} of {len(c['members'])} members live"
               + (f", down: {', '.join(c['down'])}" if c["down"] else ""))
    click.echo(f"  staged {_size(staged['staged_from_origin'])} from the origin, "
               f"{_size(staged['staged_from_peers'])} from peers; sent {_size(c['bytes_to_peers'])} to peers; "
               f"peer failures: {failures}; {c['requests_unauthorized']} unauthorized requests refused")


def _not_made_yet(config: CacheConfig) -> tuple[str, CacheUsage, list[DatasetSummary]] | None:
    """An empty report for a cache directory that does not exist yet (or is empty), made without
    creating anything there: opening it would make a cache, and status only looks. None otherwise
    (a cache, or a directory holding something else, which opening refuses by name)."""
    directory = config.directory
    try:
        if CacheLayout(directory).format_path.is_file() or (directory.exists() and any(directory.iterdir())):
            return None
        probe = directory
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        st = os.statvfs(probe)
    except OSError:
        return None  # opening it says what is wrong
    capacity = min(config.capacity_bytes(), st.f_bavail * st.f_frsize)
    return str(directory), CacheUsage(0, capacity, 0, 0), []


def _read_on_full_disk(config: CacheConfig) -> tuple[str, CacheUsage, list[DatasetSummary]]:
    """What the index file says, for a disk so full that sqlite cannot open the index as usual (it
    would write its ``-shm`` file first) and the room kept for it is spent."""
    layout = CacheLayout(config.directory)
    index = BlobIndex.snapshot(layout.index_path)
    try:
        used = index.used()
        complete, partial = index.counts()
        summaries = index.dataset_summaries()
    finally:
        index.close()
    try:
        room = IndexReserve(layout.root).disk_room()
    except OSError:
        room = 0
    capacity = min(config.capacity_bytes(), used + max(0, room))
    return str(layout.root), CacheUsage(used, capacity, complete, partial), summaries


def _verify_on_full_disk(config: CacheConfig, sample: float | None) -> VerifyReport:
    """The scrub, reading the index file alone (see :func:`_read_on_full_disk`); nothing is dropped."""
    layout = CacheLayout(config.directory)
    index = BlobIndex.snapshot(layout.index_path)
    report = VerifyReport(repaired=False)
    try:
        for row, check in scrub(index, layout, sample, None):
            report.add(row.digest, row.state, check)
    finally:
        index.close()
    return report


def _daemon_status(config: CacheConfig, socket_path: str | None) -> dict[str, Any] | None:
    """The daemon's status if one answers on the socket and serves this cache directory."""
    from ..daemon_client import DaemonClient, default_socket_path, probe, same_cache

    path = Path(socket_path).expanduser() if socket_path else default_socket_path()
    health = probe(path)
    if health is None or not same_cache(health, config.directory):
        return None

    async def ask() -> dict[str, Any]:
        client = DaemonClient(path)
        try:
            return (await client.request("GET", "/v1/status"))[1]
        finally:
            await client.close()

    try:
        return run_async(ask())
    except StagerError:
        return None  # it went away meanwhile: read the cache ourselves


@cli.command("verify")
@cache_flags
@click.option("--sample", type=SHARE, default=None,
              help="Re-hash only this share of the blobs, 0.1 or 10% (at least one blob); default: all.")
@click.option("--no-repair", is_flag=True, help="Only report; do not drop blobs that fail.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
def verify_command(cache_dir: str | None, capacity: Capacity, sample: float | None, no_repair: bool,
                   as_json: bool) -> None:
    """Re-hash the cache against the recorded block digests; drop what fails so it is fetched again.

    Dropped blobs are fetched again (and verified) by the next `stager stage` or by the
    consumer that next needs them. Exits 1 when anything failed verification.
    """
    config = cache_config(cache_dir, capacity)
    if not CacheLayout(config.directory).format_path.is_file():
        # Opening would make an empty cache there: a mistyped --cache would "verify" it and report nothing bad.
        raise CacheError(f"{config.directory}: no stager cache there (no {FORMAT_FILE}): nothing to verify")
    try:
        cache = CacheTier(config, reconcile=False)
    except DiskFull as exc:
        log.info("%s; verifying from the index file alone, without repairs", exc)
        report = _verify_on_full_disk(config, sample)
    else:
        try:
            try:
                cache.reconcile()
            except DiskFull as exc:  # the scrub only reads: it does not need the repairs
                log.info("cache %s: not reconciled before verifying (%s)", cache.directory, exc)
            report = cache.verify(sample=sample, repair=not no_repair)
        finally:
            cache.close()
    if as_json:
        click.echo(json.dumps({
            "blobs_checked": report.blobs_checked, "blocks_checked": report.blocks_checked,
            "bytes_checked": report.bytes_checked, "repaired": report.repaired,
            "bad": [{"digest": b.digest, "state": b.state.name.lower(), "bad_blocks": list(b.bad_blocks),
                     "reason": b.reason} for b in report.bad],
        }, sort_keys=True))
    else:
        click.echo(f"verified {report.blobs_checked:,} blobs, {report.blocks_checked:,} blocks, "
                   f"{_size(report.bytes_checked)}: {len(report.bad)} bad"
                   + ("; dropped, they will be fetched again" if report.bad and report.repaired else ""))
        for bad in report.bad[:20]:
            click.echo(f"  {bad.digest}: {bad.reason}, blocks {list(bad.bad_blocks)[:10]}")
    if report.bad:
        raise StagerError(f"{len(report.bad)} blob(s) in {config.directory} failed verification"
                          + (" and were dropped" if report.repaired else ""))
