"""Measure what the cache tier costs on this machine (not a test; run by hand).

    python -m tests.cache.measure_costs [--dir DIR] [--blocks 48] [--many 50000]

Prints: write_block of 8 MiB and 1 MiB blocks with and without fdatasync next
to the raw pwrite/fdatasync they are made of, the index cost per recorded
block, commit, start-up reconciliation and eviction with many blobs, and
dataset registration at a million blobs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import xxhash

from stager.cache import CacheTier
from stager.cache.layout import new_generation
from stager.config import CacheConfig

MiB = 1024 * 1024


def stats_ms(samples: list[float]) -> str:
    samples = sorted(samples)
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
    return (f"mean {statistics.mean(samples) * 1e3:7.3f} ms  p50 {statistics.median(samples) * 1e3:7.3f} ms  "
            f"p99 {p99 * 1e3:7.3f} ms")


def measure_raw(root: Path, data: bytes, count: int) -> tuple[list[float], list[float]]:
    """pwrite + fdatasync without the cache, for comparison."""
    block_size = len(data)
    path = root / "raw"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    os.ftruncate(fd, block_size * count)
    pw, sync = [], []
    for i in range(count):
        t0 = time.perf_counter()
        os.pwrite(fd, data, i * block_size)
        t1 = time.perf_counter()
        os.fdatasync(fd)
        pw.append(t1 - t0)
        sync.append(time.perf_counter() - t1)
    os.close(fd)
    os.unlink(path)
    return pw, sync


def measure_writes(root: Path, block_size: int, count: int) -> None:
    data = os.urandom(block_size)
    digest_of_block = xxhash.xxh3_64_intdigest(data)
    pw, sync = measure_raw(root, data, count)  # first, on the same fresh ground as the cache gets
    print(f"raw pwrite    {block_size // MiB} MiB: {stats_ms(pw)}")
    print(f"raw fdatasync {block_size // MiB} MiB: {stats_ms(sync)}")
    for durable in (True, False):
        directory = root / f"w-{block_size}-{durable}"
        with CacheTier(CacheConfig(directory=directory, capacity=1 << 40)) as tier:
            size = block_size * count
            digest = xxhash.xxh3_128_hexdigest(f"{block_size}-{durable}".encode())
            with tier.begin(digest, size, block_size, [digest_of_block] * count) as partial:
                times = []
                for i in range(count):
                    t0 = time.perf_counter()
                    partial.write_block(i, data, durable=durable)
                    times.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                partial.commit()
                commit = time.perf_counter() - t0
            rate = block_size * count / sum(times) / MiB
            print(f"write_block {block_size // MiB} MiB durable={durable!s:5}: {stats_ms(times)}  "
                  f"({rate:6.0f} MiB/s, {count / sum(times):6.0f} blocks/s)")
            print(f"  commit of {size // MiB} MiB after it (fsync, rename, dir fsync, index): {commit * 1e3:.1f} ms")
        shutil.rmtree(directory)
    t0 = time.perf_counter()
    for _ in range(20):
        xxhash.xxh3_64_intdigest(data)
    print(f"  xxh3_64 of {block_size // MiB} MiB (engine side): {(time.perf_counter() - t0) / 20 * 1e3:.3f} ms")


def measure_parallel(root: Path, block_size: int, blocks: int, threads: int) -> None:
    """Several threads writing durable blocks of different blobs, as the engine's disk executor does."""
    data = os.urandom(block_size)
    block = xxhash.xxh3_64_intdigest(data)
    with CacheTier(CacheConfig(directory=root / "par", capacity=1 << 40)) as tier:
        partials = [tier.begin(xxhash.xxh3_128_hexdigest(f"p{i}".encode()), block_size * blocks, block_size,
                               [block] * blocks) for i in range(threads)]
        t0 = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda job: job[0].write_block(job[1], data),
                          [(p, i) for i in range(blocks) for p in partials]))
        elapsed = time.perf_counter() - t0
        for p in partials:
            p.close()
    total = threads * blocks
    print(f"write_block {block_size // MiB} MiB durable=True from {threads} threads: "
          f"{total / elapsed:6.0f} blocks/s ({total * block_size / elapsed / MiB:.0f} MiB/s)")
    shutil.rmtree(root / "par")


def measure_index(root: Path, blocks: int = 20000) -> None:
    with CacheTier(CacheConfig(directory=root / "idx", capacity=1 << 50)) as tier:
        digest = "ab" * 16
        size = blocks * 4096
        partial = tier.begin(digest, size, 4096, [0] * blocks)
        index, gen = tier._index, partial._gen
        for label, boot in (("durable (1 statement)", None), ("durable=False (flag set once)", "b")):
            t0, c0 = time.perf_counter(), time.thread_time()
            for i in range(blocks // 2):
                index.record_block(digest, gen, i if boot is None else blocks // 2 + i, boot)
            per, cpu = (time.perf_counter() - t0) / (blocks // 2), (time.thread_time() - c0) / (blocks // 2)
            print(f"index cost per recorded block, {label}: {per * 1e6:.1f} us wall, {cpu * 1e6:.1f} us CPU")
        partial.close()
        index._exec("PRAGMA synchronous=FULL")
        t0 = time.perf_counter()
        for i in range(200):
            index.forget_blocks(digest, [i])
            index.record_block(digest, gen, i, None)
        print(f"  (for reference, synchronous=FULL: {(time.perf_counter() - t0) / 200 * 1e3:.2f} ms "
              "per forget+record pair)")


def build_many(tier: CacheTier, n: int) -> list[str]:
    """n tiny complete blobs, written straight into place (fast synthetic set-up)."""
    layout, index = tier._layout, tier._index
    digests = [xxhash.xxh3_128_hexdigest(i.to_bytes(8, "little")) for i in range(n)]
    now = time.time()
    with index.write():
        for i, d in enumerate(digests):
            fd = os.open(layout.complete_path(d), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o444)
            os.write(fd, b"x")
            charge = os.fstat(fd).st_blocks * 512
            os.close(fd)
            index.insert_partial(d, 1, 4096, (0).to_bytes(8, "little"), new_generation(), 4096, now + i * 1e-6)
            index.mark_complete(d, charge, now + i * 1e-6)
    return digests


def measure_scale(root: Path, n: int) -> None:
    config = CacheConfig(directory=root / "many", capacity=1 << 50)
    with CacheTier(config) as tier:
        t0 = time.perf_counter()
        digests = build_many(tier, n)
        print(f"set-up of {n} complete blobs: {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    with CacheTier(config) as tier:
        print(f"open + start-up reconciliation with {n} blobs (stat only): {time.perf_counter() - t0:.2f} s")
        ranks = {d: float(i % 97) for i, d in enumerate(digests)}
        for label, rank in (("no rank", None), ("with rank", ranks.get)):
            t0 = time.perf_counter()
            tier.evict(1, rank=rank)
            first = time.perf_counter() - t0
            t0 = time.perf_counter()
            for _ in range(20):
                tier.evict(1, rank=rank)
            print(f"evict(1) with {n} candidates, {label}: first {first * 1e3:.0f} ms (orders them), "
                  f"then {(time.perf_counter() - t0) / 20 * 1e3:.1f} ms per call (kept order)")
        t0 = time.perf_counter()
        for d in digests[:10000]:
            tier.touch(d)
        tier._access.flush()
        print(f"touch: {(time.perf_counter() - t0) / 10000 * 1e6:.1f} us per call (buffered, incl. flush)")
        t0, c0 = time.perf_counter(), time.thread_time()
        for d in digests[:10000]:
            tier.state(d)
        print(f"state(): {(time.perf_counter() - t0) / 10000 * 1e6:.1f} us wall, "
              f"{(time.thread_time() - c0) / 10000 * 1e6:.1f} us CPU per call")
    with CacheTier(config, reconcile=False) as tier:
        members = [(xxhash.xxh3_128_hexdigest(i.to_bytes(8, "big")), 1000) for i in range(1_000_000)]
        t0 = time.perf_counter()
        tier.register_dataset("million", members)
        print(f"register_dataset with 1,000,000 blobs: {time.perf_counter() - t0:.2f} s")
        t0 = time.perf_counter()
        tier.datasets()
        print(f"datasets() summary over 1,000,000 members: {time.perf_counter() - t0:.2f} s")


def load() -> str:
    return "load average %.1f %.1f %.1f on %d CPUs" % (*os.getloadavg(), os.cpu_count())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="where to measure (default: a temporary directory)")
    parser.add_argument("--blocks", type=int, default=48, help="8 MiB blocks to write per mode")
    parser.add_argument("--many", type=int, default=50_000, help="blobs for the reconciliation/eviction runs")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="stager-measure-", dir=args.dir))
    print(load())
    try:
        measure_writes(root, 8 * MiB, args.blocks)
        measure_writes(root, 1 * MiB, args.blocks * 8)
        measure_parallel(root, 1 * MiB, args.blocks, 8)
        measure_index(root)
        measure_scale(root, args.many)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(load())


if __name__ == "__main__":
    main()
