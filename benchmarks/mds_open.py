#!/usr/bin/env python3
"""Opening one shard and reading its tokens once: flat ``.bin`` against MDS, fixed-size and ragged samples.

What the warm iterator pays per shard beyond the flat format's: the MDS
reader gathers each sample's token column into one array when it opens a
shard. Shards are built in memory (one ``uint16`` column; fixed: every
sample ``--seq`` tokens, as ``MDSWriter`` writes an ``ndarray:uint16:N``
column; ragged: documents of 1 to 2 x ``--seq`` tokens, an ``ndarray:uint16``
column with its per-sample size), so nothing but the readers is timed.

    python benchmarks/mds_open.py [--samples 8192] [--seq 2048] [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import struct
import time

import numpy as np

from stager.iterator.readers.flat import FlatReader
from stager.iterator.readers.mds import MdsReader


def mds_shard(lengths: np.ndarray, tokens: np.ndarray, fixed: int | None) -> bytes:
    encoding, size = (f"ndarray:uint16:{fixed}", fixed * 2) if fixed else ("ndarray:uint16", None)
    config = json.dumps({"column_names": ["tokens"], "column_encodings": [encoding], "column_sizes": [size],
                         "compression": None, "format": "mds", "hashes": [], "size_limit": 1 << 30,
                         "version": 2}).encode()
    samples, at = [], 0
    for n in lengths.tolist():
        body = tokens[at:at + n].astype("<u2").tobytes()
        if not fixed:  # a variable column: its size, then the array's shape byte (ndim 1, u32 dims) and dims
            body = struct.pack("<IBI", 1 + 4 + len(body), (1 << 2) | 2, n) + body
        samples.append(body)
        at += n
    offsets = 4 * (len(lengths) + 2) + len(config) + np.concatenate([[0], np.cumsum([len(s) for s in samples])])
    return struct.pack("<I", len(lengths)) + offsets.astype("<u4").tobytes() + config + b"".join(samples)


def best_ms(rounds: int, open_and_read) -> float:
    best = float("inf")
    for _ in range(rounds):
        began = time.perf_counter()
        open_and_read()
        best = min(best, time.perf_counter() - began)
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    fixed = np.full(args.samples, args.seq)
    ragged = rng.integers(args.seq // 2, 2 * args.seq, args.samples)
    tokens = rng.integers(0, 50_000, int(max(fixed.sum(), ragged.sum())), dtype=np.uint16)
    cases = {
        "flat .bin": (FlatReader(), tokens[:fixed.sum()].astype("<u2").tobytes(), int(fixed.sum())),
        "MDS fixed-size samples": (MdsReader(), mds_shard(fixed, tokens, args.seq), int(fixed.sum())),
        "MDS ragged samples": (MdsReader(), mds_shard(ragged, tokens, None), int(ragged.sum())),
    }
    print(f"command: python benchmarks/mds_open.py --samples {args.samples} --seq {args.seq} --rounds {args.rounds}")
    flat_ms = None
    for name, (reader, data, count) in cases.items():
        if not np.array_equal(reader.open(data, "shard", "uint16", count), tokens[:count]):
            raise SystemExit(f"{name}: the reader returned other tokens")

        def open_and_read(reader=reader, data=data, count=count) -> None:
            int(reader.open(data, "shard", "uint16", count).sum(dtype=np.uint64))  # every token read once
        ms = best_ms(args.rounds, open_and_read)
        flat_ms = flat_ms or ms
        print(f"{name:24s} {len(data) / 1e6:7.1f} MB  open + read {ms:8.1f} ms  {ms / flat_ms:5.2f}x flat's time")


if __name__ == "__main__":
    main()
