"""The drainer process: runs a staging directory's drain outside the training process, and outlives it.

``python -m stager.checkpoint.drainer STAGING_DIR`` takes the directory's
drain lock (another drainer, or the daemon, already draining it: exit at
once, it will see the new checkpoint), drains the queue to its end, releases
the lock and looks once more, so a checkpoint sealed while it was letting go
is never left behind. :func:`spawn_drainer` starts one in a new session
(``start_new_session``): a SIGKILL of the training process, or of its
process group, does not reach it. Its log goes to ``STAGING_DIR/.drain.log``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path

from .drain import Drain, drain_lock
from .staging import StagingDir
from .transfer import DEFAULT_PART_SIZE

LOG = ".drain.log"


def spawn_drainer(staging_dir: str | os.PathLike[str]) -> subprocess.Popen:
    """Start a drainer process for ``staging_dir`` in its own session; return it (nobody needs to wait)."""
    root = Path(staging_dir).absolute()
    root.mkdir(parents=True, exist_ok=True)
    log = open(root / LOG, "ab")
    try:
        return subprocess.Popen([sys.executable, "-m", "stager.checkpoint.drainer", str(root)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                close_fds=True)
    finally:
        log.close()


def drain_until_empty(staging: StagingDir, drain: Drain | None = None) -> int:
    """Drain ``staging`` while holding its lock; return the checkpoints drained (0 if another drain holds it)."""
    drain = drain or Drain(staging)
    total = 0
    while True:
        with drain_lock(staging.root) as held:
            if not held:
                return total
            total += asyncio.run(drain.run())
        if not [e for e in staging.pending() if e.name not in drain.failed]:
            return total


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m stager.checkpoint.drainer")
    parser.add_argument("staging_dir")
    parser.add_argument("--part-size", type=int, default=DEFAULT_PART_SIZE, help="bytes per multipart part")
    parser.add_argument("--concurrency", type=int, default=8, help="parts in flight per store")
    args = parser.parse_args(argv)
    if args.part_size <= 0 or args.concurrency <= 0:
        parser.error("--part-size and --concurrency must be > 0")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s")
    staging = StagingDir(args.staging_dir)
    drain_until_empty(staging, Drain(staging, part_size=args.part_size, concurrency=args.concurrency))
    return 0


if __name__ == "__main__":
    sys.exit(main())
