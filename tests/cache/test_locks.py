"""Per-blob locks across processes and threads: one holder at a time, nothing left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from stager.cache import CacheTier
from stager.cache.locks import RANGES_FILE, LockTable, try_flock, unflock
from stager.errors import CacheError

from .blobs import config, make_blob

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("kind", ["ranges", "files"])
def test_processes_racing_on_one_blob_lock_take_turns(tmp_path, kind):
    """``files``: as on a file system that refuses open-file-description locks (a flocked file per blob)."""
    directory = tmp_path / "cache"
    CacheTier(config(directory, 1 << 20)).close()
    digest = make_blob(10).digest
    counter = tmp_path / "counter"
    counter.write_text("0")
    rounds, procs = 25, 3
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    extra = ["files"] if kind == "files" else []
    workers = [subprocess.Popen([sys.executable, "-m", "tests.cache.peer_process", "race", str(directory), digest,
                                 str(counter), str(rounds), *extra], cwd=ROOT, env=env) for _ in range(procs)]
    for worker in workers:
        assert worker.wait(timeout=60) == 0
    # 3 processes x 2 threads read-sleep-write the counter: a single lost update means two held the lock.
    assert int(counter.read_text()) == procs * 2 * rounds
    log = counter.with_suffix(".log").read_text().split()
    assert len(set(log)) == procs  # every process got its turns
    # nothing is left per blob: the one ranges file, or no file at all
    assert os.listdir(directory / "locks") == ([RANGES_FILE] if kind == "ranges" else [])


def test_a_lock_is_free_once_its_holder_dies_though_a_child_it_forked_lives_on(tmp_path):
    """A forked child shares its parent's open files; a lock taken through one must die with the parent."""
    directory = tmp_path / "cache"
    CacheTier(config(directory, 1 << 20)).close()
    digest = make_blob(10).digest
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    holder = subprocess.Popen([sys.executable, "-m", "tests.cache.peer_process", "lock-and-fork", str(directory),
                               digest], cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    child = None
    try:
        child = int(holder.stdout.readline())
        with CacheTier(config(directory, 1 << 20), reconcile=False) as tier:
            assert not tier.lock(digest).try_lock()  # held by the holder
            holder.kill()
            holder.wait(timeout=30)
            os.kill(child, 0)  # the child still lives...
            lock = tier.lock(digest)
            assert lock.acquire(timeout=10)  # ...and the lock is free
            lock.release()
    finally:
        holder.kill()
        holder.wait(timeout=30)
        if child is not None:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_try_and_timed_acquire(tmp_path):
    with CacheTier(config(tmp_path / "c", 1 << 20)) as tier:
        digest = make_blob(10).digest
        a, b = tier.lock(digest), tier.lock(digest)
        assert a.try_lock() and a.locked
        assert not b.try_lock() and not b.try_acquire()
        started = time.monotonic()
        assert not b.acquire(timeout=0.1)
        assert 0.09 <= time.monotonic() - started < 2
        with pytest.raises(CacheError, match="already held"):
            a.acquire()
        threading.Timer(0.05, a.release).start()  # released from another thread
        assert b.acquire(timeout=5)
        b.release()
        b.release()  # a no-op
        with tier.lock(digest) as c:
            assert c.locked
        assert not c.locked
        assert tier.lock(make_blob(11).digest).try_lock()  # other blobs are independent


def test_two_tiers_in_one_process_exclude_each_other(tmp_path):
    directory = tmp_path / "c"
    with CacheTier(config(directory, 1 << 20)) as one, CacheTier(config(directory, 1 << 20)) as two:
        digest = make_blob(10).digest
        held = one.lock(digest)
        assert held.try_lock()
        assert not two.lock(digest).try_lock()  # locks conflict between open files, even in one process
        held.release()
        assert two.lock(digest).try_lock()


def test_flock_survives_the_unlink_race(tmp_path):
    path = tmp_path / "x.lock"
    fd = try_flock(path)
    assert fd is not None and try_flock(path) is None
    # A taker that opened the old file before the holder unlinked it must not think it holds the lock.
    stale = os.open(path, os.O_RDWR)
    unflock(path, fd)
    fresh = try_flock(path)
    assert fresh is not None
    import fcntl
    fcntl.flock(stale, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the stale file is lockable, but not at the path...
    assert os.fstat(stale).st_ino != os.stat(path).st_ino  # ...so try_flock would have retried
    os.close(stale)
    unflock(path, fresh)
    assert not path.exists()


def test_lock_table_waits_without_polling():
    table = LockTable()
    assert table.try_take("a") and not table.try_take("a")
    threading.Timer(0.05, table.give, ("a",)).start()
    assert table.take("a", time.monotonic() + 5)
    assert not table.take("a", time.monotonic() + 0.01)
    table.give("a")
    assert not table.held("a")
