"""``stager stage SOURCE``: stage a dataset (or a part of it) into the cache, verified.

Goes through a :class:`~stager.session.Session`: when a node daemon serves
the cache, the daemon does the fetching (one engine per node, and the
progress bar moves as shards land); otherwise an engine runs in this process.
Either way it registers one plan over the requested shards with a window
covering them all, and waits until each one is ready.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import click
import numpy as np

from ..cache import BlobState, CacheTier
from ..config import CacheConfig
from ..errors import BlobTooLarge, CacheFull, DiskFull, StagerError
from ..event_loop import run_async
from ..hashing import block_range
from ..progress import byte_progress
from ..session import EmbeddedSession, RemoteSession, Session, open_session
from . import cli
from .cache_options import cache_config, cache_flags, fetch_config, fetch_flags, write_flags
from .options import POSITIVE_SIZE, Capacity, source_config, storage_option_flag


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
def stage_command(source: str, storage_option: tuple[str, ...], cache_dir: str | None, capacity: Capacity,
                  concurrency: int, bandwidth: int | None, no_hedge: bool, retry_deadline: float, direct_writes: bool,
                  limit: int | None, as_json: bool, socket_path: str | None, no_daemon: bool) -> None:
    """Stage every shard of SOURCE into the cache, verifying each block against the manifest.

    Exits 0 only when every requested shard is in the cache and verified. Safe to run
    again, or in several processes at once: what is verified is never fetched twice.
    When a node daemon (`stager serve`) serves the cache, it does the fetching.
    """
    fetch = fetch_config(concurrency, bandwidth, no_hedge, retry_deadline)
    cache = cache_config(cache_dir, capacity, direct_writes)
    session = open_session(cache, fetch, socket=socket_path, mode="embedded" if no_daemon else "auto")
    summary = run_async(_stage(source_config(source, storage_option), session, cache, limit, fetch.concurrency))
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


async def _stage(source, session: Session, cache_cfg: CacheConfig, limit: int | None, concurrency: int) -> dict:
    began = time.monotonic()
    async with session:
        cache, owned = _cache_of(session, cache_cfg)
        try:
            dataset = await session.open_dataset(source)
            capacity = await _capacity(session, cache)
            m = dataset.manifest
            sizes = m.sizes
            count = len(m)
            if limit is not None:
                count = int((sizes.cumsum() <= limit).sum()) if count else 0
            total = int(sizes[:count].sum())
            if count and int(sizes[:count].max()) > capacity:
                big = int(sizes[:count].argmax())
                raise BlobTooLarge(f"{m.paths[big]}: {int(sizes[big]):,} bytes is larger than the cache capacity "
                                   f"{capacity:,}")
            if total > capacity:
                if capacity < cache.configured_capacity:  # the disk, not the capacity, is short
                    raise DiskFull(f"{dataset.url}: {total:,} bytes do not fit: the disk holding the cache at "
                                   f"{cache.directory} has room for {capacity:,} (capacity "
                                   f"{cache.configured_capacity:,}); stage a part with --limit or free space")
                raise CacheFull(f"{dataset.url}: {total:,} bytes do not fit in the cache capacity {capacity:,}; "
                                "stage a part with --limit or raise --capacity")
            cached_of = [_cached_bytes(cache, m, i) for i in range(count)]
        finally:
            if owned:
                cache.close()
        cached = sum(cached_of)
        before = await _counters(session)
        failures: list[BaseException] = []
        with byte_progress("staging") as progress:
            progress.set_total(count, total)
            progress.advance(cached)
            by_blocks = isinstance(session, EmbeddedSession)
            if by_blocks:
                session.engine.add_block_listener(lambda ref, n: progress.advance(n))
            plan = await session.plan(dataset, np.arange(count, dtype=np.int64), window_bytes=max(total, 1),
                                      name="stage")
            jobs = asyncio.Semaphore(max(4, concurrency * 2))
            arrived = 0  # bytes of the requested shards that were not in the cache when we started

            async def one(i: int) -> None:
                nonlocal arrived
                try:
                    await plan.ready(i)
                    arrived += int(sizes[i]) - cached_of[i]
                    if not by_blocks:
                        progress.advance(int(sizes[i]) - cached_of[i])
                except StagerError as exc:
                    failures.append(exc)
                    progress.describe(f"{count} files, {len(failures)} failed")
                finally:
                    jobs.release()

            async def describe_retries() -> None:
                while True:
                    await asyncio.sleep(1.0)
                    counters = await _counters(session)
                    now = _delta(before, counters)
                    progress.describe(f"{count} files, {counters['in_flight']} requests in flight "
                                      f"(limit {counters['concurrency']}), {now['retries']} retries"
                                      + (f", {len(failures)} failed" if failures else ""))

            ticker = asyncio.create_task(describe_retries())
            try:
                async with asyncio.TaskGroup() as tg:
                    for i in range(count):  # a bounded number of tasks alive, even for a million shards
                        await jobs.acquire()
                        tg.create_task(one(i))
            finally:
                ticker.cancel()
                await plan.close()
        seconds = time.monotonic() - began
        after = await _counters(session)
        done = _delta(before, after)
        if done["mode"] == "daemon":
            # The daemon's byte counter covers every consumer of the node: count what this run brought in.
            # (Its retry, hedge and corrupt-block counts over the run are node-wide too.)
            done["fetched"] = arrived
        return {
            "source": dataset.url,
            "blobs": count,
            "bytes": total,
            "fetched_bytes": done["fetched"],
            "cached_bytes": cached,
            "retries": done["retries"],
            "hedged": done["hedged"],
            "verify_failures": done["verify_failures"],
            "concurrency_peak": after["concurrency_peak"],  # the adaptive limit's highest (node-wide with a daemon)
            "failed": len(failures),
            "first_error": str(failures[0]) if failures else None,
            "seconds": round(seconds, 3),
            "mb_per_s": done["fetched"] / 1e6 / seconds if seconds > 0 else 0.0,
        }


def _cache_of(session: Session, config: CacheConfig) -> tuple[CacheTier, bool]:
    """The cache to read records from: the session's own, or (the daemon's) opened read-only here."""
    if isinstance(session, EmbeddedSession):
        return session.engine.cache, False
    return CacheTier(config, reconcile=False), True


async def _capacity(session: Session, cache: CacheTier) -> int:
    if isinstance(session, RemoteSession) and session.mode == "daemon":
        try:
            return int((await session.daemon_status())["cache"]["capacity"])
        except StagerError:
            pass  # gone already: the fallback engine uses our own capacity
    return cache.capacity


def _cached_bytes(cache: CacheTier, m, i: int) -> int:
    record = cache.record(m.digest(i))
    if record is None:
        return 0
    size = int(m.sizes[i])
    if record.state is BlobState.COMPLETE:
        return size
    return sum(block_range(b, size, m.block_size)[1] - block_range(b, size, m.block_size)[0] for b in record.verified)


async def _counters(session: Session) -> dict[str, Any]:
    """What the engine doing the work counted so far (the daemon's counters cover all its consumers)."""
    if isinstance(session, RemoteSession) and session.mode == "daemon":
        try:
            status = await session.daemon_status()
            e, o = status["engine"], status["origin"]
            return {"mode": "daemon", "fetched": int(e["bytes_fetched"]), "retries": int(o["retries"]),
                    "hedged": int(e["hedged_requests"]), "verify_failures": int(e["verify_failures"]),
                    "in_flight": int(e.get("requests_in_flight", 0)), "concurrency": int(e.get("concurrency", 0)),
                    "concurrency_peak": int(e.get("concurrency_peak", 0))}
        except StagerError:
            pass
    stats = session.stats()
    return {"mode": "embedded", "fetched": int(stats.get("bytes_fetched", 0)),
            "retries": int(stats.get("origin_retries", 0)), "hedged": int(stats.get("hedged_requests", 0)),
            "verify_failures": int(stats.get("verify_failures", 0)),
            "in_flight": int(stats.get("requests_in_flight", 0)), "concurrency": int(stats.get("concurrency", 0)),
            "concurrency_peak": int(stats.get("concurrency_peak", 0))}


def _delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    keys = ("fetched", "retries", "hedged", "verify_failures")
    if before["mode"] != after["mode"]:  # the daemon went away mid-run: count what the fallback engine did
        return {"mode": "embedded", **{k: after[k] for k in keys}}
    return {"mode": after["mode"], **{k: after[k] - before[k] for k in keys}}

