"""``stager demo``: the main job end to end on a generated dataset, no external service.

1. generate a token corpus (flat uint16 ``.bin`` shards) in a local folder;
2. ``index`` it: hash every shard and write the manifest beside it;
3. serve it over HTTP on 127.0.0.1 behind a slow, faulty proxy (latency
   spikes, 503 SlowDown, 500s, reset connections, truncated bodies, flipped
   bytes, a bandwidth cap);
4. ``stage`` it through that origin into a cache, with the progress bar;
5. check every cached shard against the generated files byte for byte, and
   say how many faults were injected and how many corrupt blocks were refused.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

from .cache import CacheTier
from .config import MiB, CacheConfig, FetchConfig, RetryConfig, SourceConfig
from .engine import Engine
from .errors import StagerError
from .loopback import FaultPlan, FaultProxy, HttpOrigin
from .manifest import save_manifest
from .manifest.build import IndexConfig, build_manifest
from .progress import byte_progress
from .store import open_store
from .write import generate_corpus


@dataclass(frozen=True, slots=True)
class DemoConfig:
    directory: Path = Path("demo-data")
    shards: int = 24
    tokens_per_shard: int = 2 * MiB  # 4 MiB per shard as uint16
    block_size: int = 1 * MiB
    bandwidth: float = 80e6  # bytes/s through the faulty proxy
    seed: int = 0


def faulty_plan(bandwidth: float) -> FaultPlan:
    """A bad day at the object store: every kind of fault, often."""
    return FaultPlan(latency_s=0.005, jitter_s=0.01, spike_p=0.03, spike_s=1.5, slowdown_p=0.08, error500_p=0.04,
                     reset_p=0.04, truncate_p=0.04, flip_p=0.05, ignore_range_p=0.02, bandwidth_bps=bandwidth)


async def run_demo(config: DemoConfig, say) -> None:
    """Run the demo, reporting each step through ``say(text)``; raises StagerError if anything is off."""
    corpus = config.directory / "corpus"
    cache_dir = config.directory / "cache"
    began = time.monotonic()
    say(f"1/5 generating {config.shards} token shards in {corpus}")
    generate_corpus(corpus, shards=config.shards, tokens_per_shard=config.tokens_per_shard, seed=config.seed,
                    block_size=config.block_size)

    say("2/5 indexing: hashing every shard into the manifest")
    store = open_store(SourceConfig(str(corpus)))
    try:
        with byte_progress("hashing") as progress:
            manifest = await build_manifest(store, IndexConfig(block_size=config.block_size),
                                            on_listed=progress.set_total, on_bytes=progress.advance)
        await save_manifest(store, manifest)
    finally:
        await store.close()
    say(f"    {len(manifest)} shards, {manifest.total_bytes / MiB:.0f} MiB, "
        f"{int(manifest.tokens.sum()):,} tokens, blocks of {config.block_size // MiB} MiB")

    with HttpOrigin(corpus) as origin, FaultProxy(origin.url, faulty_plan(config.bandwidth), seed=config.seed) as proxy:
        say(f"3/5 serving it at {proxy.url}: a slow, faulty origin (503s, resets, short and corrupted bodies)")
        say(f"4/5 staging into {cache_dir}")
        cache = CacheTier(CacheConfig(directory=cache_dir, capacity=4 * manifest.total_bytes))
        try:
            for blob in list(manifest):  # start cold, so the demo shows the whole path
                cache.remove(blob.digest)
            fetch = FetchConfig(concurrency=16, retry=RetryConfig(backoff_base=0.05, backoff_max=1.0, deadline=60))
            async with Engine(cache, fetch) as engine:
                dataset = await engine.open_dataset(SourceConfig(proxy.url), manifest=manifest)
                with byte_progress("staging") as progress:
                    progress.set_total(len(manifest), manifest.total_bytes)
                    engine.add_block_listener(lambda ref, n: progress.advance(n))
                    plan = engine.plan(dataset, window_bytes=manifest.total_bytes, name="demo")
                    for position in range(len(plan)):
                        await plan.ready(position)
                    await plan.close()
                stats, origin_stats = engine.stats, engine.origin_stats
            faults = proxy.faults
            say(f"    {stats.bytes_fetched / MiB:.0f} MiB fetched in {stats.blocks_fetched} blocks; "
                f"{origin_stats.retries} retries, {stats.hedged_requests} hedged requests, "
                f"{stats.verify_failures} corrupt blocks refused")
            say("    faults injected: " + ", ".join(f"{k} {v}" for k, v in sorted(faults.items()) if v))

            say("5/5 checking the cache against the generated files, byte for byte")
            for blob in manifest:
                cached = cache.complete_path(blob.digest).read_bytes()
                original = (corpus / blob.path).read_bytes()
                if hashlib.sha256(cached).digest() != hashlib.sha256(original).digest():
                    raise StagerError(f"{blob.path}: cached bytes differ from the origin")
        finally:
            cache.close()
    say(f"all {len(manifest)} shards staged and identical to the origin, no corrupted byte served; "
        f"{time.monotonic() - began:.1f}s in all")
