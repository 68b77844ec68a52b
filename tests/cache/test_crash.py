"""kill -9 at any point: a restarted process finds a consistent cache and resumes partial blobs.

Real worker processes (crash_worker.py) fill, commit, evict and remove blobs
of one shared cache. They are SIGKILLed at random moments (two workers at
once), or kill themselves right before or after an exact system call of a
blob transition. After every kill the cache is reopened and every invariant
checked: each block the index claims verified re-hashes correctly, each
complete file hashes correctly, no orphan file, no drift in the capacity
total. Finally every partial blob is resumed without refetching a verified
block and completed.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stager.cache import BlobState, CacheTier

from . import crash_worker
from .blobs import check_invariants, config

ROOT = Path(__file__).resolve().parents[2]
RANDOM_KILLS = 10  # rounds of two workers each, killed at random moments
TARGETED = [  # (os function, n-th call, before/after): each one point inside a transition
    "pwrite:5:after", "fdatasync:4:after", "fdatasync:9:before", "fsync:1:after", "fsync:2:after",
    "fchmod:1:after", "rename:1:before", "rename:1:after", "rename:3:after", "unlink:2:after",
    "ftruncate:2:after", "open:12:after",
]


def spawn(directory: Path, seed: int, crash: str | None = None) -> subprocess.Popen:
    args = [sys.executable, "-m", "tests.cache.crash_worker", str(directory), str(seed)]
    if crash:
        args.append(crash)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def reopen_and_check(directory: Path) -> dict[str, int]:
    with CacheTier(config(directory, crash_worker.CAPACITY)) as tier:
        counts = check_invariants(tier)
        assert tier.usage().used <= tier.capacity
        report = tier.last_reconcile
        counts.update(promoted=report.promoted, repaired=report.rows_dropped + report.files_removed)
        return counts


def test_sigkill_at_random_points_and_inside_transitions(tmp_path):
    directory = tmp_path / "cache"
    rng = random.Random(20240601)
    seen = dict.fromkeys(["complete", "partial", "verified_blocks", "promoted", "repaired"], 0)
    killed = 0
    for round_ in range(RANDOM_KILLS):
        workers = [spawn(directory, rng.randrange(1 << 30)) for _ in range(2)]
        deadline = time.monotonic() + 10
        for worker in workers:
            time.sleep(rng.uniform(0.05, 0.5))
            worker.send_signal(signal.SIGKILL)
        for worker in workers:
            code = worker.wait(timeout=max(1, deadline - time.monotonic()))
            assert code in (0, -signal.SIGKILL), worker.stderr.read().decode()
            killed += code == -signal.SIGKILL
        for key, value in reopen_and_check(directory).items():
            seen[key] += value
    for crash in TARGETED:
        worker = spawn(directory, rng.randrange(1 << 30), crash)
        code = worker.wait(timeout=30)
        assert code in (0, -signal.SIGKILL), f"{crash}: {worker.stderr.read().decode()}"
        killed += code == -signal.SIGKILL
        for key, value in reopen_and_check(directory).items():
            seen[key] += value
    assert killed >= 20
    # The kills did land in the middle of things: between a commit's rename and its index update
    # (promoted), between an unlink and its row's removal or a file's creation and its row (repaired).
    assert seen["partial"] > 0 and seen["verified_blocks"] > 0 and seen["complete"] > 0
    assert seen["promoted"] > 0 and seen["repaired"] > 0, seen

    # Every partial blob resumes with its verified blocks and completes without refetching them.
    with CacheTier(config(directory, crash_worker.CAPACITY)) as tier:
        for blob in crash_worker.CORPUS:
            record = tier.record(blob.digest)
            if record is None or record.state is not BlobState.PARTIAL:
                continue
            with tier.begin(blob.digest, blob.size, blob.block_size, blob.blocks) as partial:
                assert partial.verified == record.verified
                for index in partial.missing_blocks():
                    assert index not in record.verified
                    partial.write_block(index, blob.block(index))
                partial.commit()
            assert tier.complete_path(blob.digest).read_bytes() == blob.data
        check_invariants(tier)


@pytest.mark.parametrize("signal_at", ["ready", "never"])
def test_lock_of_a_killed_holder_is_free(tmp_path, signal_at):
    directory = tmp_path / "cache"
    digest = crash_worker.CORPUS[0].digest
    code = ("import sys, time\n"
            "from stager.cache import CacheTier\n"
            "from tests.cache.blobs import config\n"
            f"t = CacheTier(config(sys.argv[1], 1 << 20))\n"
            f"lock = t.lock({digest!r}); lock.acquire()\n"
            "print('locked', flush=True); time.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(directory)], cwd=ROOT, stdout=subprocess.PIPE,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert holder.stdout.readline().strip() == b"locked"
        with CacheTier(config(directory, 1 << 20)) as tier:
            lock = tier.lock(digest)
            assert not lock.try_lock()
            assert not lock.acquire(timeout=0.05)
            holder.kill()
            if signal_at == "ready":
                holder.wait(timeout=10)
            assert lock.acquire(timeout=10)  # the kernel dropped the dead holder's flock
            lock.release()
    finally:
        holder.kill()
        holder.wait(timeout=10)
