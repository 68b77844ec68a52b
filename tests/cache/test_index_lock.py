"""What a blob's begin and commit do while another process holds the cache index's write lock.

Their file system work (a begin creating and allocating the partial file, a
commit renaming it into ``blobs/`` and syncing the directory) happens before
the transaction that records it, so the cache's other begins and commits do
not wait for it; and whatever another process does meanwhile (a reconcile
removing the unrecorded file, a removal of the blob, a reader opening it)
still sees each blob whole.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

import pytest

from stager.cache import BlobState, CacheTier
from stager.cache.layout import CacheLayout
from stager.errors import CacheError

from .blobs import check_invariants, config, make_blob

KiB = 1024
WAIT = 10.0  # seconds any step below may take, at most
CAPACITY = 64 << 20  # room for the blobs below to be made ahead of their transactions (tier.EARLY_ROOM)


@contextmanager
def index_locked_elsewhere(tier: CacheTier):
    """The index's write lock held by a connection of its own, as another process would hold it."""
    conn = sqlite3.connect(CacheLayout(tier.directory).index_path, isolation_level=None, timeout=WAIT)
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        conn.close()


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def still_waiting(future: Future) -> bool:
    time.sleep(0.1)
    return not future.done()


@pytest.fixture
def tier(tmp_path):
    with CacheTier(config(tmp_path / "cache", CAPACITY)) as t:
        yield t


@pytest.fixture
def pool():
    with ThreadPoolExecutor(2) as p:
        yield p


def partial_files(tier: CacheTier) -> list:
    return sorted(CacheLayout(tier.directory).partial_dir.iterdir())


def filled(tier: CacheTier, blob):
    partial = tier.begin(blob.digest, blob.size, blob.block_size, blob.blocks)
    for index in partial.missing_blocks():
        partial.write_block(index, blob.block(index))
    return partial


def test_a_begin_creates_and_allocates_its_file_before_it_waits_for_the_index(tier, pool):
    blob = make_blob(100 * KiB)
    with tier.lock(blob.digest):
        with index_locked_elsewhere(tier):
            begun = pool.submit(tier.begin, blob.digest, blob.size, blob.block_size, blob.blocks)
            wait_for(lambda: partial_files(tier), "the partial file")
            (path,) = partial_files(tier)
            assert path.stat().st_size == blob.size and path.stat().st_blocks * 512 >= blob.size
            assert still_waiting(begun)  # recorded only once the index is free
            assert tier.state(blob.digest) is BlobState.ABSENT
        with begun.result(WAIT) as partial:
            assert partial.path == path
            for index in partial.missing_blocks():
                partial.write_block(index, blob.block(index))
            assert partial.commit().read_bytes() == blob.data
    check_invariants(tier)


def test_a_file_removed_before_its_begin_is_recorded_is_made_again(tier, pool):
    """A reconcile of another process removes partial files that no row accounts for."""
    blob = make_blob(70 * KiB, seed=1)
    with tier.lock(blob.digest):
        with index_locked_elsewhere(tier):
            begun = pool.submit(tier.begin, blob.digest, blob.size, blob.block_size, blob.blocks)
            wait_for(lambda: partial_files(tier), "the partial file")
            (early,) = partial_files(tier)
            early.unlink()
            assert still_waiting(begun)
        with begun.result(WAIT) as partial:
            assert partial.path.exists() and partial_files(tier) == [partial.path]
            for index in partial.missing_blocks():
                partial.write_block(index, blob.block(index))
            assert partial.commit().read_bytes() == blob.data
    check_invariants(tier)


def test_a_commit_renames_its_file_before_it_waits_and_readers_see_it_complete(tier, pool, tmp_path):
    blob = make_blob(90 * KiB, seed=2)
    reader = CacheTier(config(tier.directory, CAPACITY), reconcile=False)  # "another process", opened first
    with reader, tier.lock(blob.digest), filled(tier, blob) as partial:
        with index_locked_elsewhere(tier):
            committed = pool.submit(partial.commit)
            dest = tier.complete_path(blob.digest)
            wait_for(dest.exists, "the rename into blobs/")
            assert not partial_files(tier)
            assert still_waiting(committed)
            assert tier.state(blob.digest) is BlobState.PARTIAL  # not recorded yet
            # another process reading the blob meanwhile finds it whole
            with reader.open_partial(blob.digest) as seen:
                assert seen.complete
                assert [seen.read_block(i) for i in range(blob.block_count)] == \
                    [blob.block(i) for i in range(blob.block_count)]
        assert committed.result(WAIT) == dest
    assert tier.state(blob.digest) is BlobState.COMPLETE and dest.read_bytes() == blob.data
    check_invariants(tier)


def test_a_blob_removed_during_its_commit_leaves_no_file_behind(tier, pool):
    blob = make_blob(40 * KiB, seed=3)
    with tier.lock(blob.digest), filled(tier, blob) as partial:
        with index_locked_elsewhere(tier) as other:
            committed = pool.submit(partial.commit)
            dest = tier.complete_path(blob.digest)
            wait_for(dest.exists, "the rename into blobs/")
            # what CacheTier.remove does in the other process: the partial file (gone) and the rows
            charged = other.execute("SELECT charged FROM blobs WHERE digest = ?", (blob.digest,)).fetchone()[0]
            other.execute("DELETE FROM blobs WHERE digest = ?", (blob.digest,))
            other.execute("DELETE FROM verified_blocks WHERE digest = ?", (blob.digest,))
            other.execute("UPDATE meta SET value = value - ? WHERE key = 'used'", (charged,))
            other.execute("COMMIT")
        with pytest.raises(CacheError, match="removed during its commit"):
            committed.result(WAIT)
    assert not dest.exists() and tier.state(blob.digest) is BlobState.ABSENT
    check_invariants(tier)


def test_begins_and_commits_of_many_blobs_from_threads_keep_the_cache_whole(tmp_path):
    blobs = [make_blob(10 * KiB + i, block_size=4 * KiB, seed=10 + i) for i in range(64)]
    with CacheTier(config(tmp_path / "cache", 64 * 64 * KiB)) as tier:
        def one(blob):
            with tier.lock(blob.digest), filled(tier, blob) as partial:
                return partial.commit().read_bytes() == blob.data
        with ThreadPoolExecutor(8) as pool:
            assert all(pool.map(one, blobs, timeout=60))
        assert not partial_files(tier)
        counts = check_invariants(tier)
        assert all(tier.state(b.digest) is BlobState.COMPLETE for b in blobs), counts


def test_a_blob_another_process_began_meanwhile_is_taken_from_its_row(tier, pool):
    """Its row appeared between the look without the lock and the transaction; its file is gone (that
    process died), so the row is dropped and the blob begun here, in a file made in the transaction."""
    from stager.cache.blob_index import pack_block_digests

    blob = make_blob(50 * KiB, seed=4)
    with tier.lock(blob.digest):
        with index_locked_elsewhere(tier) as other:
            begun = pool.submit(tier.begin, blob.digest, blob.size, blob.block_size, blob.blocks)
            wait_for(lambda: partial_files(tier), "the partial file")
            (early,) = partial_files(tier)
            charged = tier.charge(blob.size)
            other.execute("INSERT INTO blobs (digest, state, size, block_size, block_digests, gen, charged, "
                          "last_access) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                          (blob.digest, int(BlobState.PARTIAL), blob.size, blob.block_size,
                           pack_block_digests(blob.blocks), "0123456789abcdef", charged, time.time()))
            other.execute("UPDATE meta SET value = value + ? WHERE key = 'used'", (charged,))
            other.execute("COMMIT")
        with begun.result(WAIT) as partial:
            assert not early.exists() and partial_files(tier) == [partial.path]
            for index in partial.missing_blocks():
                partial.write_block(index, blob.block(index))
            assert partial.commit().read_bytes() == blob.data
    check_invariants(tier)


def test_closing_the_cache_while_other_threads_read_its_index_fails_their_reads_and_crashes_nothing(tmp_path):
    """The engine's lock threads may still ask a blob's state after a cancelled job's engine closed
    the cache (on another thread): a read through a connection closed under it crashed the
    interpreter (a segfault in the full suite). Now it ends first, and later reads raise."""
    blob = make_blob(40 * 1024)
    for attempt in range(5):  # a few closes at random points of the readers' loops; bounded
        tier = CacheTier(config(tmp_path / f"cache-{attempt}", 1 << 20))
        started, outcomes = threading.Barrier(5), []

        def read_until_closed() -> None:
            started.wait(5)
            for _ in range(20_000):  # bounded: the close comes within a few hundred reads
                try:
                    tier.state(blob.digest)
                except CacheError:
                    outcomes.append("refused")
                    return
            outcomes.append("never closed")

        readers = [threading.Thread(target=read_until_closed) for _ in range(4)]
        for thread in readers:
            thread.start()
        started.wait(5)
        time.sleep(0.01 * attempt)
        tier.close()
        for thread in readers:
            thread.join(30)
        assert outcomes == ["refused"] * 4
