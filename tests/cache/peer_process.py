"""Small jobs run in a separate process by the cache tests (locks racing, holds of live/dead processes).

    python -m tests.cache.peer_process race CACHE_DIR DIGEST COUNTER_FILE ROUNDS [files]
    python -m tests.cache.peer_process hold CACHE_DIR OWNER DIGEST...
    python -m tests.cache.peer_process lock-and-fork CACHE_DIR DIGEST
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from stager.cache import CacheTier

from .blobs import config


def race(directory: Path, digest: str, counter: Path, rounds: int, files: bool = False) -> None:
    """Increment a counter file under the blob lock, slowly, from two threads: lost updates show a broken lock.
    With ``files``, the locks are taken as on a file system without open-file-description locks."""
    with CacheTier(config(directory, 1 << 20), reconcile=False) as tier:
        if files:
            tier._lock_ranges.usable = False
        def loop() -> None:
            for _ in range(rounds):
                with tier.lock(digest):
                    value = int(counter.read_text() or "0")
                    time.sleep(0.001)
                    counter.write_text(str(value + 1))
                    with open(counter.with_suffix(".log"), "a") as log:
                        log.write(f"{os.getpid()}\n")

        threads = [threading.Thread(target=loop) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)


def hold(directory: Path, owner: str, digests: list[str]) -> None:
    """Hold blobs, say so, and wait to be killed (or for stdin to close)."""
    with CacheTier(config(directory, 1 << 30), reconcile=False) as tier:
        tier.hold(owner, digests)
        print("held", flush=True)
        sys.stdin.read()


def lock_and_fork(directory: Path, digest: str) -> None:
    """Take a blob's lock, fork a child that only sleeps, print the child's pid, and wait to be killed."""
    with CacheTier(config(directory, 1 << 20), reconcile=False) as tier:
        lock = tier.lock(digest)
        assert lock.try_lock()
        child = os.fork()
        if child == 0:
            time.sleep(60)
            os._exit(0)
        print(child, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "race":
        race(Path(args[0]), args[1], Path(args[2]), int(args[3]), args[4:] == ["files"])
    elif mode == "hold":
        hold(Path(args[0]), args[1], args[2:])
    elif mode == "lock-and-fork":
        lock_and_fork(Path(args[0]), args[1])
    else:
        sys.exit(f"unknown mode {mode}")
