"""Measure what checking bytes read back from the cache costs on this machine (not a test; run by hand).

    python -m tests.cache.measure_read_checks [--dir DIR] [--mib 16] [--files 8] [--repeat 5]

Prints, for files of ``--mib`` MiB in the page cache (the warm case):

- the iterator's first map of a shard: a map whose every page is touched
  (what a reader of the whole shard pays anyway) vs ``VerifiedReads.map_blob``
  (the map hashed with xxh3-128, which touches every page too);
- the mount's first read of a 1 MiB block: ``pread`` vs ``pread`` + xxh3-64;
- the commit's re-hash of a whole blob (``file_digest``), from the page cache
  and from the disk (pages dropped first, as ``O_DIRECT`` writes leave them).
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import xxhash

from stager.cache.reader import VerifiedReads, file_digest

MiB = 1 << 20


def median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def touch_map(path: Path) -> None:
    with open(path, "rb") as fh:
        mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    view = memoryview(mapped)
    sum(view[::4096])  # one byte per page: every page faulted in
    view.release()
    mapped.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None)
    parser.add_argument("--mib", type=int, default=16)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="stager-read-checks-", dir=args.dir))
    try:
        size = args.mib * MiB
        paths, digests = [], []
        for i in range(args.files):
            data = os.urandom(size)
            path = root / f"blob-{i}"
            path.write_bytes(data)
            paths.append(path)
            digests.append(xxhash.xxh3_128_hexdigest(data))
        total = size * args.files
        for path in paths:
            path.read_bytes()  # in the page cache: the warm case

        def touched() -> None:
            for path in paths:
                touch_map(path)

        def checked() -> None:
            reads = VerifiedReads("first")  # a fresh process's view: nothing checked yet
            for path, digest in zip(paths, digests):
                view, _ = reads.map_blob(path, digest, size)
                view.release()

        plain = median_ms(touched, args.repeat)
        hashed = median_ms(checked, args.repeat)
        print(f"iterator, first map of {args.files} x {args.mib} MiB (page cache): every page touched "
              f"{plain:.1f} ms ({total / plain / 1e6:.2f} GB/s); map_blob (hash over the map) {hashed:.1f} ms "
              f"({total / hashed / 1e6:.2f} GB/s); +{hashed - plain:.1f} ms per {total // MiB} MiB")

        fd = os.open(paths[0], os.O_RDONLY)
        try:
            blocks = size // MiB

            def pread_blocks() -> None:
                for b in range(blocks):
                    os.pread(fd, MiB, b * MiB)

            def pread_and_hash() -> None:
                for b in range(blocks):
                    xxhash.xxh3_64_intdigest(os.pread(fd, MiB, b * MiB))

            a = median_ms(pread_blocks, args.repeat) / blocks
            b = median_ms(pread_and_hash, args.repeat) / blocks
            print(f"mount, first read of a 1 MiB block (page cache): pread {a * 1e3:.0f} us, pread + xxh3-64 "
                  f"{b * 1e3:.0f} us (+{(b - a) * 1e3:.0f} us, once per block per mount process)")

            warm = median_ms(lambda: file_digest(fd, size), args.repeat)

            def cold_digest() -> None:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                file_digest(fd, size, drop_cache=True)

            cold = median_ms(cold_digest, args.repeat)
            print(f"commit re-hash of a {args.mib} MiB blob: {warm:.1f} ms from the page cache "
                  f"({size / warm / 1e6:.2f} GB/s), {cold:.1f} ms from the disk ({size / cold / 1e6:.2f} GB/s)")
        finally:
            os.close(fd)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
