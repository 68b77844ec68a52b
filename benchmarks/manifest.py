"""Loading a manifest of 1,000,000 shards: time and peak RSS (target: under 1 s and 500 MB).

A manifest is written for a synthetic dataset (1M shards of 1-64 MiB, so about
4M block digests of 8 MiB blocks), then loaded and validated in a fresh
process, several times; the figures are the median load time and the peak
RSS of the loading process.

Run: ``.venv/bin/python benchmarks/manifest.py [--entries 1000000] [--repeat 5]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import machine  # noqa: E402

from stager.manifest import SCHEMA, Manifest, encode_manifest  # noqa: E402

LOADER = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from stager.manifest import read_manifest_file
t1 = time.perf_counter(); c1 = time.process_time()
m = read_manifest_file(sys.argv[1])
t2 = time.perf_counter(); c2 = time.process_time()
m.digest(len(m) - 1); m.block_digests(len(m) // 2)
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "load_cpu_s": c2 - c1, "entries": len(m),
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def synthetic(entries: int, block_size: int = 8 << 20) -> Manifest:
    rng = np.random.default_rng(0)
    sizes = rng.integers(1 << 20, 64 << 20, entries)
    counts = -(-sizes // block_size)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    blocks = pa.ListArray.from_arrays(pa.array(offsets), pa.array(rng.integers(0, 2**63, int(offsets[-1]), dtype=np.uint64)))
    digests = pa.FixedSizeBinaryArray.from_buffers(pa.binary(16), entries, [None, pa.py_buffer(rng.bytes(16 * entries))])
    table = pa.table({
        "path": [f"train/{i // 1000:04d}/part-{i:07d}.bin" for i in range(entries)],
        "size": sizes, "digest": digests, "blocks": blocks,
        "dtype": pa.array(["uint16"] * entries), "tokens": sizes // 2, "mtime": np.full(entries, 1.7e9),
    }, schema=SCHEMA)
    return Manifest(table, block_size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"# manifest load benchmark: {args.entries:,} entries")
    print(f"machine: {machine()}")
    print(f"reproduce: .venv/bin/python benchmarks/manifest.py --entries {args.entries} --repeat {args.repeat}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "manifest.parquet"
        path.write_bytes(encode_manifest(synthetic(args.entries)))
        print(f"manifest file: {path.stat().st_size / 1e6:.1f} MB")
        runs = [json.loads(subprocess.run([sys.executable, "-c", LOADER, str(path)], capture_output=True, text=True,
                                          check=True).stdout) for _ in range(args.repeat)]
    load = statistics.median(r["load_s"] for r in runs)
    rss = max(r["peak_rss_mb"] for r in runs)
    cpu = statistics.median(r["load_cpu_s"] for r in runs)
    print(f"load + validate: median {load:.3f} s (min {min(r['load_s'] for r in runs):.3f}, "
          f"max {max(r['load_s'] for r in runs):.3f}) over {args.repeat} fresh processes; target < 1 s: "
          f"{'met' if load < 1 else 'NOT met'}")
    print(f"CPU time of load + validate: median {cpu:.3f} s (wall time above this means the machine was busy)")
    print(f"peak RSS of the loading process: {rss:.0f} MB (includes the interpreter, numpy and pyarrow); "
          f"target < 500 MB: {'met' if rss < 500 else 'NOT met'}")


if __name__ == "__main__":
    main()
