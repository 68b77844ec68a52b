"""``stager stage SOURCE``: stage a dataset (or a part of it) into the cache, verified."""

from __future__ import annotations

import asyncio
import json
import time

import click

from ..cache import BlobState, CacheTier
from ..engine import Engine
from ..errors import BlobTooLarge, CacheFull, StagerError
from ..hashing import block_range
from . import cli
from .cache_options import cache_config, cache_flags, fetch_config, fetch_flags
from .options import SIZE, source_config, storage_option_flag
from .progress import byte_progress, console, run_async


@cli.command("stage")
@click.argument("source")
@storage_option_flag()
@cache_flags
@fetch_flags
@click.option("--limit", type=SIZE, default=None, help="Stage only the first shards (manifest order) up to this many bytes.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
def stage_command(source: str, storage_option: tuple[str, ...], cache_dir: str, capacity: str, concurrency: int,
                  bandwidth: str | None, no_hedge: bool, retry_deadline: float, limit: int | None, as_json: bool) -> None:
    """Stage every shard of SOURCE into the cache, verifying each block against the manifest.

    Exits 0 only when every requested shard is in the cache and verified. Safe to run
    again, or in several processes at once: what is verified is never fetched twice.
    """
    fetch = fetch_config(concurrency, bandwidth, no_hedge, retry_deadline)
    cache = CacheTier(cache_config(cache_dir, capacity))
    try:
        summary = run_async(_stage(source_config(source, storage_option), cache, fetch, limit))
    finally:
        cache.close()
    if as_json:
        click.echo(json.dumps(summary, sort_keys=True))
    else:
        click.echo(
            f"staged {summary['blobs']} shards, {summary['bytes']:,} bytes: {summary['fetched_bytes']:,} fetched, "
            f"{summary['cached_bytes']:,} already cached; {summary['retries']} retries, "
            f"{summary['hedged']} hedged requests, {summary['verify_failures']} corrupt blocks rejected; "
            f"{summary['seconds']:.1f}s, {summary['mb_per_s']:.0f} MB/s"
        )
    if summary["failed"]:
        raise StagerError(f"{summary['failed']} of {summary['blobs']} shards could not be staged "
                          f"(first: {summary['first_error']})")


async def _stage(source, cache: CacheTier, fetch, limit: int | None) -> dict:
    began = time.monotonic()
    async with Engine(cache, fetch) as engine:
        dataset = await engine.open_dataset(source)
        m = dataset.manifest
        sizes = m.sizes
        count = len(m)
        if limit is not None:
            count = int((sizes.cumsum() <= limit).sum()) if count else 0
        total = int(sizes[:count].sum())
        if count and int(sizes[:count].max()) > cache.capacity:
            big = int(sizes[:count].argmax())
            raise BlobTooLarge(f"{m.paths[big]}: {int(sizes[big]):,} bytes is larger than the cache capacity "
                               f"{cache.capacity:,}")
        if total > cache.capacity:
            raise CacheFull(f"{dataset.name}: {total:,} bytes do not fit in the cache capacity {cache.capacity:,}; "
                            "stage a part with --limit or raise --capacity")
        cached = 0
        for i in range(count):
            record = cache.record(m.digest(i))
            if record is None:
                continue
            if record.state is BlobState.COMPLETE:
                cached += int(sizes[i])
            else:
                cached += sum(block_range(b, int(sizes[i]), m.block_size)[1] - block_range(b, int(sizes[i]), m.block_size)[0]
                              for b in record.verified)
        failures: list[BaseException] = []
        with byte_progress("staging") as progress:
            progress.set_total(count, total)
            progress.advance(cached)
            engine.add_block_listener(lambda ref, n: progress.advance(n))
            jobs = asyncio.Semaphore(max(4, fetch.concurrency * 2))

            async def one(i: int) -> None:
                try:
                    await engine.ensure(dataset.ref(i), priority=float(i))
                except StagerError as exc:
                    failures.append(exc)
                    progress.describe(f"{count} files, {len(failures)} failed")
                finally:
                    jobs.release()

            async def describe_retries() -> None:
                while True:
                    await asyncio.sleep(0.5)
                    o = engine.origin_stats
                    progress.describe(f"{count} files, {o.retries} retries" + (f", {len(failures)} failed" if failures else ""))

            ticker = asyncio.create_task(describe_retries())
            try:
                async with asyncio.TaskGroup() as tg:
                    for i in range(count):  # a bounded number of tasks alive, even for a million shards
                        await jobs.acquire()
                        tg.create_task(one(i))
            finally:
                ticker.cancel()
        seconds = time.monotonic() - began
        stats = engine.stats
        return {
            "source": dataset.name,
            "blobs": count,
            "bytes": total,
            "fetched_bytes": stats.bytes_fetched,
            "cached_bytes": cached,
            "retries": engine.origin_stats.retries,
            "hedged": stats.hedged_requests,
            "verify_failures": stats.verify_failures,
            "failed": len(failures),
            "first_error": str(failures[0]) if failures else None,
            "seconds": round(seconds, 3),
            "mb_per_s": stats.bytes_fetched / 1e6 / seconds if seconds > 0 else 0.0,
        }
