"""``stager stage SOURCE``: stage a dataset (or a part of it) into the cache, verified.

Goes through a :class:`~stager.session.Session`: when a node daemon serves
the cache, the daemon does the fetching (one engine per node, and the
progress bar moves as shards land); otherwise an engine runs in this process.
Either way it registers one plan over the requested shards with a window
covering them all, and waits until each one is ready.

This module loads only what parsing the command line and sending the first
request need: the manifest's GET goes out (:mod:`.head_start`) while the
engine's modules (:mod:`.staging`, numpy and pyarrow with it) load on a
thread, when this process runs the engine itself.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..config import CacheConfig, FetchConfig, SourceConfig
from ..errors import StagerError
from ..event_loop import run_async
from ..one_cpu import keep_on_one_cpu
from ..socket_path import default_socket_path
from . import cli
from .cache_options import cache_config, cache_flags, fetch_config, fetch_flags, write_flags
from .options import POSITIVE_SIZE, Capacity, source_config, storage_option_flag

if TYPE_CHECKING:
    from .head_start import HeadStart


@cli.command("stage")
@click.argument("source")
@storage_option_flag()
@cache_flags
@fetch_flags
@write_flags
@click.option("--limit", type=POSITIVE_SIZE, default=None,
              help="Stage only the first shards (manifest order) up to this many bytes (e.g. 200GB).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
@click.option("--socket", "socket_path", type=click.Path(dir_okay=False), envvar="STAGER_SOCKET", default=None,
              help="The node daemon's socket (default: see `stager serve --help`); used when a daemon serves --cache.")
@click.option("--no-daemon", is_flag=True, envvar="STAGER_NO_DAEMON",
              help="Run the engine in this process even when a daemon serves the cache.")
@click.option("--one-cpu/--any-cpu", "one_cpu", default=None, envvar="STAGER_ONE_CPU",
              help="Keep this process's threads on one CPU (--one-cpu) or let them run on any (--any-cpu). "
                   "Default: one CPU where the process may run on exactly two, where the threads' turns at "
                   "the interpreter's lock cost more across two CPUs than the second CPU brings.")
def stage_command(source: str, storage_option: tuple[str, ...], cache_dir: str | None, capacity: Capacity,
                  concurrency: int, bandwidth: int | None, no_hedge: bool, retry_deadline: float, direct_writes: bool,
                  durable: bool, limit: int | None, as_json: bool, socket_path: str | None, no_daemon: bool,
                  one_cpu: bool | None) -> None:
    """Stage every shard of SOURCE into the cache, verifying each block against the manifest.

    Exits 0 only when every requested shard is in the cache and verified. Safe to run
    again, or in several processes at once: what is verified is never fetched twice.
    When a node daemon (`stager serve`) serves the cache, it does the fetching.
    """
    fetch = fetch_config(concurrency, bandwidth, no_hedge, retry_deadline, durable)
    cache = cache_config(cache_dir, capacity, direct_writes)
    keep_on_one_cpu(one_cpu)  # before any thread starts: they all inherit it
    summary = run_async(_run(source_config(source, storage_option), cache, fetch, limit, socket_path, no_daemon))
    if as_json:
        click.echo(json.dumps(summary, sort_keys=True))
    else:
        staged = summary["blobs"] - summary["failed"]
        shards = (f"{staged} of {summary['blobs']} shards ({summary['bytes']:,} bytes asked for)" if summary["failed"]
                  else f"{staged} shards, {summary['bytes']:,} bytes")
        click.echo(
            f"staged {shards}: {summary['fetched_bytes']:,} fetched, "
            f"{summary['cached_bytes']:,} already cached; {summary['retries']} retries, "
            f"{summary['hedged']} hedged requests, {summary['verify_failures']} corrupt blocks rejected; "
            f"{summary['seconds']:.1f}s, {summary['mb_per_s']:.0f} MB/s"
        )
    if summary["failed"]:
        raise StagerError(f"{summary['failed']} of {summary['blobs']} shards could not be staged "
                          f"(first: {summary['first_error']})")


async def _run(source: SourceConfig, cache: CacheConfig, fetch: FetchConfig, limit: int | None,
               socket_path: str | None, no_daemon: bool) -> dict[str, Any]:
    # With no daemon's socket in sight this process runs the engine, and needs the manifest first:
    # ask for it now, and load the engine's modules while the origin answers.
    socket = Path(socket_path).expanduser() if socket_path else default_socket_path()
    head_start = _head_start(source, fetch) if no_daemon or not socket.exists() else None
    try:
        staging = await asyncio.to_thread(importlib.import_module, f"{__package__}.staging")
        gc.freeze()  # as the command group does after a command's imports: they live for the whole run
        session = staging.open_session(cache, fetch, socket=socket_path, mode="embedded" if no_daemon else "auto")
        manifest = None
        if head_start is not None:
            manifest = await head_start.manifest() if isinstance(session, staging.EmbeddedSession) else None
    finally:
        if head_start is not None:
            await head_start.close()
    return await staging.stage(source, session, cache, limit, fetch.concurrency, manifest=manifest)


def _head_start(source: SourceConfig, fetch: FetchConfig) -> "HeadStart | None":
    """The manifest's GET, sent now; None where it cannot be (a bad URL: the usual path says why)."""
    from .head_start import HeadStart

    try:
        return HeadStart(source, fetch)
    except StagerError:
        return None
