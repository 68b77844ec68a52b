"""A process that works a shared cache hard until it is killed (run by test_crash.py).

    python -m tests.cache.crash_worker CACHE_DIR SEED [SYSCALL:N:before|after]

It fills, resumes, commits, evicts and removes blobs of a fixed corpus, in an
order drawn from SEED, for a bounded number of steps. With a crash spec, it
SIGKILLs itself right before or after the N-th call of that os function
(pwrite, fdatasync, fsync, fchmod, rename, unlink, ftruncate, open), so the
kill lands on an exact step of a transition; without one, the parent kills it
at a random moment.
"""

from __future__ import annotations

import os
import random
import signal
import sys
from pathlib import Path

from stager.cache import BlobState, CacheTier
from stager.errors import CacheError, CacheFull

from .blobs import config, corpus

CORPUS = corpus(10, min_size=1, max_size=160 * 1024, block_size=16 * 1024, seed=7)
CAPACITY = 600 * 1024  # about half the corpus: eviction happens
MAX_STEPS = 400


def arm_crash(spec: str) -> None:
    name, count, when = spec.split(":")
    real = getattr(os, name)
    remaining = [int(count)]

    def wrapper(*args, **kwargs):
        remaining[0] -= 1
        if remaining[0] == 0 and when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        result = real(*args, **kwargs)
        if remaining[0] == 0 and when == "after":
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    setattr(os, name, wrapper)


def work(tier: CacheTier, rng: random.Random) -> None:
    for _ in range(MAX_STEPS):
        blob = rng.choice(CORPUS)
        roll = rng.random()
        if roll < 0.05:
            tier.evict(rng.randint(1, CAPACITY // 2))
            continue
        if roll < 0.08:
            tier.remove(blob.digest)
            continue
        lock = tier.lock(blob.digest)
        if not lock.try_lock():
            continue
        try:
            if tier.state(blob.digest) is BlobState.COMPLETE:
                tier.touch(blob.digest)
                if rng.random() < 0.3:
                    tier.mark_consumed(blob.digest, "epoch-0")
                continue
            try:
                partial = tier.begin(blob.digest, blob.size, blob.block_size, blob.blocks)
            except CacheFull:
                continue
            with partial:
                missing = partial.missing_blocks()
                rng.shuffle(missing)
                stop = len(missing) if rng.random() < 0.6 else rng.randint(0, len(missing))
                try:
                    for index in missing[:stop]:
                        partial.write_block(index, blob.block(index), durable=rng.random() < 0.5)
                    if not partial.missing_blocks():
                        partial.commit()
                except CacheError:
                    pass  # evicted or removed by the other worker meanwhile
        finally:
            lock.release()


def main(argv: list[str]) -> int:
    directory, seed = Path(argv[0]), int(argv[1])
    if len(argv) > 2:
        arm_crash(argv[2])
    tier = CacheTier(config(directory, CAPACITY))
    print("ready", flush=True)
    work(tier, random.Random(seed))
    tier.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
