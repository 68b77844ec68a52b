"""The tier's life cycle in one process: begin, write, read, commit, resume, records, datasets."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import xxhash

import stager.cache
from stager.cache import BlobState, CacheTier
from stager.errors import BlobTooLarge, CacheError, CacheFull

from .blobs import check_invariants, config, fill, make_blob

KiB = 1024


@pytest.fixture
def tier(tmp_path):
    with CacheTier(config(tmp_path / "cache", 1024 * KiB)) as t:
        yield t


def test_public_surface_is_pinned():
    assert sorted(stager.cache.__all__) == sorted([
        "FORMAT_VERSION", "SCHEMA_VERSION", "BadBlob", "BlobLock", "BlobRecord", "BlobState", "CacheTier",
        "CacheUsage", "DatasetSummary", "PartialBlob", "ReconcileReport", "VerifyReport"])


def test_fill_commit_and_read_back(tier):
    blob = make_blob(100 * KiB + 7)
    assert tier.state(blob.digest) is BlobState.ABSENT
    path = fill(tier, blob)
    assert path == tier.complete_path(blob.digest)
    assert path.parent.name == blob.digest[:2]
    assert path.read_bytes() == blob.data
    assert tier.state(blob.digest) is BlobState.COMPLETE
    assert not os.stat(path).st_mode & 0o222
    record = tier.record(blob.digest)
    assert record.size == blob.size and record.block_count == blob.block_count == 7
    assert record.verified == frozenset(range(7))
    usage = tier.usage()
    assert usage.complete == 1 and usage.partial == 0
    assert usage.used == os.stat(path).st_blocks * 512
    check_invariants(tier)


def test_empty_blob(tier):
    blob = make_blob(0)
    assert fill(tier, blob).read_bytes() == b""
    assert tier.state(blob.digest) is BlobState.COMPLETE


def test_partial_blob_reserves_and_reads_only_verified_blocks(tier):
    blob = make_blob(50 * KiB)
    with tier.lock(blob.digest):
        partial = tier.begin(blob.digest, blob.size, blob.block_size, blob.blocks)
        assert tier.state(blob.digest) is BlobState.PARTIAL
        assert tier.usage().used == 52 * KiB  # rounded up to whole 4 KiB units
        partial.write_block(2, blob.block(2))
        assert partial.read_block(2) == blob.block(2)
        with pytest.raises(CacheError, match="not verified"):
            partial.read_block(0)
        with pytest.raises(CacheError, match="cannot commit"):
            partial.commit()
        assert partial.missing_blocks() == [0, 1, 3]
        # Another handle (a FUSE reader) sees what the writer verified.
        reader = tier.open_partial(blob.digest)
        partial.write_block(1, blob.block(1), durable=False)
        assert reader.read_block(1) == blob.block(1)
        reader.close()
        partial.close()
    check_invariants(tier)


def test_states_of_many_digests_at_once(tier, monkeypatch):
    import stager.cache.blob_index as blob_index

    monkeypatch.setattr(blob_index, "STATES_PER_QUERY", 3)  # several queries, one cut between two of them
    complete, other = make_blob(10 * KiB, seed=1), make_blob(10 * KiB, seed=2)
    fill(tier, complete)
    partial = make_blob(40 * KiB, seed=3)
    with tier.lock(partial.digest), tier.begin(partial.digest, partial.size, partial.block_size, partial.blocks):
        absent = [make_blob(1 * KiB, seed=10 + i).digest for i in range(5)]
        asked = [absent[0], complete.digest, *absent[1:4], partial.digest, absent[4], other.digest]
        assert tier.states(asked) == {complete.digest: BlobState.COMPLETE, partial.digest: BlobState.PARTIAL}
        assert tier.states([]) == {}
    with pytest.raises(ValueError, match="not a blob digest"):
        tier.states([complete.digest, "../etc"])


def test_bad_arguments(tier):
    blob = make_blob(40 * KiB)
    with pytest.raises(ValueError, match="digest"):
        tier.state("ABC")
    with pytest.raises(ValueError, match="block digests"):
        tier.begin(blob.digest, blob.size, blob.block_size, blob.blocks[:-1])
    with tier.begin(blob.digest, blob.size, blob.block_size, blob.blocks) as partial:
        with pytest.raises(ValueError, match="must be"):
            partial.write_block(0, b"short")
        with pytest.raises(ValueError, match="out of range"):
            partial.write_block(3, b"")


def test_resume_keeps_verified_blocks_across_reopen(tmp_path):
    blob = make_blob(64 * KiB + 1)
    cfg = config(tmp_path / "c", 1024 * KiB)
    with CacheTier(cfg) as tier:
        with tier.begin(blob.digest, blob.size, blob.block_size, blob.blocks) as partial:
            for i in (0, 2, 4):
                partial.write_block(i, blob.block(i))
    with CacheTier(cfg) as tier:
        assert tier.state(blob.digest) is BlobState.PARTIAL
        with tier.begin(blob.digest, blob.size, blob.block_size, blob.blocks) as partial:
            assert partial.verified == {0, 2, 4}
            assert partial.missing_blocks() == [1, 3]
            writes = []
            for i in partial.missing_blocks():
                partial.write_block(i, blob.block(i))
                writes.append(i)
            partial.commit()
        assert writes == [1, 3]
        assert tier.complete_path(blob.digest).read_bytes() == blob.data
        check_invariants(tier)


def test_begin_is_idempotent_and_complete_blobs_give_complete_handles(tier):
    blob = make_blob(30 * KiB)
    a = tier.begin(blob.digest, blob.size, blob.block_size, blob.blocks)
    a.write_block(0, blob.block(0))
    b = tier.begin(blob.digest, blob.size, blob.block_size, blob.blocks)
    assert b.verified == {0}
    assert tier.usage().partial == 1 and tier.usage().used == 32 * KiB  # reserved once
    b.write_block(1, blob.block(1))
    path = b.commit()
    assert a.commit() == path  # the other handle finds it committed
    a.close(), b.close()
    with tier.begin(blob.digest, blob.size, blob.block_size, blob.blocks) as c:
        assert c.complete and c.missing_blocks() == []
        c.write_block(0, blob.block(0))  # a no-op
        assert c.read_block(1) == blob.block(1)
        assert c.commit() == path
    check_invariants(tier)


def test_other_block_geometry_restarts_the_partial_blob(tier):
    blob = make_blob(64 * KiB, block_size=16 * KiB)
    with tier.begin(blob.digest, blob.size, blob.block_size, blob.blocks) as old:
        old.write_block(0, blob.block(0))
        other = make_blob(64 * KiB, block_size=32 * KiB)
        other = type(other)(blob.data, 32 * KiB)
        with tier.begin(other.digest, other.size, other.block_size, other.blocks) as new:
            assert new.verified == frozenset() and new.block_count == 2
            with pytest.raises(CacheError, match="evicted, removed or restarted"):
                old.write_block(1, blob.block(1))
            for i in new.missing_blocks():
                new.write_block(i, other.block(i))
            new.commit()
    check_invariants(tier)


def test_blob_too_large_and_cache_full(tmp_path):
    with CacheTier(config(tmp_path / "c", 64 * KiB)) as tier:
        big = make_blob(64 * KiB + 1)
        with pytest.raises(BlobTooLarge, match="larger than the whole cache"):
            tier.begin(big.digest, big.size, big.block_size, big.blocks)
        a, b = make_blob(40 * KiB, seed=1), make_blob(40 * KiB, seed=2)
        fill(tier, a)
        tier.pin(a.digest)
        with pytest.raises(CacheFull, match="no room"):
            tier.begin(b.digest, b.size, b.block_size, b.blocks)
        assert isinstance(CacheFull("x"), OSError)
        tier.unpin(a.digest)
        fill(tier, b)  # evicts a
        assert tier.state(a.digest) is BlobState.ABSENT
        check_invariants(tier)


def test_threads_fill_many_blobs_at_once(tier):
    blobs = [make_blob(48 * KiB + i, seed=i) for i in range(8)]
    handles = [tier.begin(b.digest, b.size, b.block_size, b.blocks) for b in blobs]
    jobs = [(h, b, i) for h, b in zip(handles, blobs) for i in range(b.block_count)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda job: job[0].write_block(job[2], job[1].block(job[2])), jobs))
        list(pool.map(lambda h: h.commit(), handles))
    for h in handles:
        h.close()
    for b in blobs:
        assert tier.complete_path(b.digest).read_bytes() == b.data
    check_invariants(tier)


def test_touch_is_buffered_and_record_shows_it(tmp_path):
    blob = make_blob(10 * KiB)
    with CacheTier(config(tmp_path / "c", 1024 * KiB), touch_interval=3600) as tier:
        fill(tier, blob)
        before = tier.record(blob.digest).last_access
        time.sleep(0.01)
        tier.touch(blob.digest)
        assert tier._index.get(blob.digest).last_access == before  # not written yet
        assert tier.record(blob.digest).last_access > before
    with CacheTier(config(tmp_path / "c", 1024 * KiB)) as tier:  # close() flushed it
        assert tier.record(blob.digest).last_access > before


def test_pin_consumed_and_record(tier):
    blob = make_blob(10 * KiB)
    fill(tier, blob)
    tier.pin(blob.digest)
    tier.mark_consumed(blob.digest, 3)
    record = tier.record(blob.digest)
    assert record.pinned and record.consumed == "3"
    tier.unpin(blob.digest)
    assert not tier.record(blob.digest).pinned
    assert tier.record("0" * 32) is None


def test_remove(tier):
    blob = make_blob(20 * KiB)
    fill(tier, blob)
    path = tier.complete_path(blob.digest)
    with open(path, "rb") as reader:  # an open reader keeps reading after the unlink
        assert tier.remove(blob.digest)
        assert reader.read() == blob.data
    assert not path.exists() and tier.usage().used == 0
    assert not tier.remove(blob.digest)


def test_datasets_summary_with_many_blobs(tier):
    blobs = [make_blob(8 * KiB, seed=i) for i in range(3)]
    fill(tier, blobs[0])
    with tier.begin(blobs[1].digest, blobs[1].size, blobs[1].block_size, blobs[1].blocks):
        pass
    members = [(b.digest, b.size) for b in blobs]
    members += [(xxhash.xxh3_128_hexdigest(i.to_bytes(8, "little")), 100) for i in range(100_000)]
    started = time.monotonic()
    tier.register_dataset("s3://bucket/corpus", members)
    tier.register_dataset("file:///small", members[:2])
    elapsed = time.monotonic() - started
    summary = {d.name: d for d in tier.datasets()}
    big = summary["s3://bucket/corpus"]
    assert (big.blobs, big.complete, big.partial) == (100_003, 1, 1)
    assert big.bytes == 3 * 8 * KiB + 100 * 100_000 and big.complete_bytes == 8 * KiB
    assert summary["file:///small"].blobs == 2
    assert elapsed < 5, f"registering 100k blobs took {elapsed:.1f}s"  # 0.3-0.6 s here: only pathologies fail
    registered = tier._index._one("SELECT registered FROM datasets WHERE name = 'file:///small'")
    big_registered = tier._index._one("SELECT registered FROM datasets WHERE name = 's3://bucket/corpus'")
    tier.register_dataset("s3://bucket/corpus", members)  # every process that opens it does this: no writes
    assert tier._index._one("SELECT registered FROM datasets WHERE name = 's3://bucket/corpus'") == big_registered
    tier.register_dataset("file:///small", members[:2] + members[:1])  # duplicates count once: the same
    assert tier._index._one("SELECT registered FROM datasets WHERE name = 'file:///small'") == registered
    tier.register_dataset("file:///small", members[:1])  # replaces
    assert {d.name: d for d in tier.datasets()}["file:///small"].blobs == 1
    with pytest.raises(ValueError):
        tier.register_dataset("bad", [("nope", 1)])
    assert "bad" not in {d.name for d in tier.datasets()}
    tier.unregister_dataset("file:///small")
    assert [d.name for d in tier.datasets()] == ["s3://bucket/corpus"]


def test_writes_after_eviction_are_refused(tier):
    blob = make_blob(30 * KiB)
    with tier.begin(blob.digest, blob.size, blob.block_size, blob.blocks) as partial:
        partial.write_block(0, blob.block(0))
        assert tier.evict(1) == 32 * KiB  # not locked: an abandoned partial blob is evictable
        with pytest.raises(CacheError, match="evicted"):
            partial.write_block(1, blob.block(1))
    check_invariants(tier)


def test_close_closes_open_handles(tmp_path):
    tier = CacheTier(config(tmp_path / "c", 1024 * KiB))
    blob = make_blob(10 * KiB)
    partial = tier.begin(blob.digest, blob.size, blob.block_size, blob.blocks)
    tier.close()
    tier.close()
    with pytest.raises(CacheError, match="closed"):
        partial.write_block(0, blob.block(0))


def test_lock_is_exclusive_between_threads(tier):
    digest = make_blob(1).digest
    inside, overlaps, done = [0], [0], threading.Event()

    def worker():
        for _ in range(50):
            with tier.lock(digest):
                inside[0] += 1
                if inside[0] > 1:
                    overlaps[0] += 1
                time.sleep(0.0002)
                inside[0] -= 1

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert overlaps[0] == 0
    assert os.listdir(tier.directory / "locks") == ["blobs.ranges"]  # released locks leave no file of their own


def test_lookups_do_not_wait_behind_another_threads_transaction(tier):
    """state() runs on the event loop: it must not queue behind a writer (WAL readers never block)."""
    blob = make_blob(10 * KiB)
    fill(tier, blob)
    inside, leave = threading.Event(), threading.Event()

    def long_transaction():
        with tier._index.write():
            inside.set()
            leave.wait(10)

    writer = threading.Thread(target=long_transaction)
    writer.start()
    try:
        assert inside.wait(10)
        started = time.monotonic()
        assert tier.state(blob.digest) is BlobState.COMPLETE
        assert tier.usage().complete == 1
        assert time.monotonic() - started < 5, "a lookup queued behind the writer (which holds on for 10 s)"
    finally:
        leave.set()
        writer.join(timeout=10)
