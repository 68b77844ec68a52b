"""Start-up reconciliation: orphans, temporaries, missing and wrong-size files, half-done commits."""

from __future__ import annotations

import os
import time

import pytest

from stager.cache import BlobState, CacheTier
from stager.cache.layout import new_generation
from stager.cache.reader import STAMP_NS, VerifiedReads, stamp_intact
from stager.errors import CacheCorrupt

from .blobs import check_invariants, config, fill, make_blob

KiB = 1024


def test_reconcile_removes_orphans_and_temporaries_and_drops_bad_rows(tmp_path):
    directory = tmp_path / "cache"
    cfg = config(directory, 4096 * KiB)
    keep, gone, short, partial_ok, partial_gone, partial_short = (make_blob(40 * KiB, seed=i) for i in range(6))
    with CacheTier(cfg) as tier:
        for blob in (keep, gone, short):
            fill(tier, blob)
        handles = {}
        for blob in (partial_ok, partial_gone, partial_short):
            handles[blob.digest] = tier.begin(blob.digest, blob.size, blob.block_size, blob.blocks)
            handles[blob.digest].write_block(0, blob.block(0))
            handles[blob.digest].close()
        paths = {b.digest: tier._layout.partial_path(b.digest, tier._index.get(b.digest).gen)
                 for b in (partial_ok, partial_gone, partial_short)}
    # What a crash, a careless admin or an older stager may leave behind:
    os.unlink(directory / "blobs" / gone.digest[:2] / gone.digest)
    short_path = directory / "blobs" / short.digest[:2] / short.digest
    os.chmod(short_path, 0o644)
    with open(short_path, "r+b") as fh:
        fh.truncate(10)
    os.unlink(paths[partial_gone.digest])
    with open(paths[partial_short.digest], "r+b") as fh:
        fh.truncate(5)
    orphan = make_blob(8 * KiB, seed=99)
    for shard in (orphan.digest[:2], "ab"):
        (directory / "blobs" / shard).mkdir(exist_ok=True)
    (directory / "blobs" / orphan.digest[:2] / orphan.digest).write_bytes(orphan.data)
    (directory / "blobs" / "ab" / "tmpXYZ.part").write_bytes(b"temp")
    (directory / "partial" / f"{orphan.digest}.{new_generation()}").write_bytes(b"x")
    (directory / "partial" / "something.tmp").write_bytes(b"x")
    (directory / ".stager-cache.toml.123.abcd").write_bytes(b"half a format file")
    (directory / "locks" / f"{orphan.digest}.lock").write_bytes(b"")

    with CacheTier(cfg) as tier:
        report = tier.last_reconcile
        assert tier.state(keep.digest) is BlobState.COMPLETE
        assert tier.state(gone.digest) is BlobState.ABSENT
        assert tier.state(short.digest) is BlobState.ABSENT
        assert tier.state(partial_ok.digest) is BlobState.PARTIAL
        assert tier.record(partial_ok.digest).verified == {0}
        assert tier.state(partial_gone.digest) is BlobState.ABSENT
        assert tier.state(partial_short.digest) is BlobState.ABSENT
        assert tier.state(orphan.digest) is BlobState.ABSENT
        assert report.rows_dropped == 4
        assert report.files_removed == 6  # short file, short partial, orphan blob, temp, orphan partial, .tmp
        assert report.lock_files_removed == 1
        assert not any(n.startswith(".stager-cache.toml.") for n in os.listdir(directory))
        assert not [n for n in os.listdir(directory / "locks") if n.endswith(".lock")]
        counts = check_invariants(tier)
        assert counts == {"complete": 1, "partial": 1, "verified_blocks": 1}


def test_a_commit_interrupted_after_its_rename_is_promoted(tmp_path):
    cfg = config(tmp_path / "cache", 1024 * KiB)
    blob = make_blob(40 * KiB)
    with CacheTier(cfg) as tier:
        with tier.begin(blob.digest, blob.size, blob.block_size, blob.blocks) as partial:
            for i in partial.missing_blocks():
                partial.write_block(i, blob.block(i))
            gen = tier._index.get(blob.digest).gen
    # What commit does before its index update, then the process dies:
    src = tmp_path / "cache" / "partial" / f"{blob.digest}.{gen}"
    os.chmod(src, 0o444)
    (tmp_path / "cache" / "blobs" / blob.digest[:2]).mkdir()
    os.rename(src, tmp_path / "cache" / "blobs" / blob.digest[:2] / blob.digest)
    with CacheTier(cfg) as tier:
        assert tier.last_reconcile.promoted == 1
        assert tier.state(blob.digest) is BlobState.COMPLETE
        check_invariants(tier)


def test_begin_promotes_without_a_restart(tmp_path):
    """Another process died mid-commit while this one kept running: resuming must not refetch."""
    cfg = config(tmp_path / "cache", 1024 * KiB)
    blob = make_blob(40 * KiB)
    with CacheTier(cfg) as tier:
        with tier.begin(blob.digest, blob.size, blob.block_size, blob.blocks) as partial:
            for i in partial.missing_blocks():
                partial.write_block(i, blob.block(i))
        gen = tier._index.get(blob.digest).gen
        tier.complete_path(blob.digest).parent.mkdir()
        os.rename(tmp_path / "cache" / "partial" / f"{blob.digest}.{gen}",
                  tier.complete_path(blob.digest))
        os.chmod(tier.complete_path(blob.digest), 0o444)
        with tier.begin(blob.digest, blob.size, blob.block_size, blob.blocks) as again:
            assert again.complete and again.missing_blocks() == []
        check_invariants(tier)


def test_unsynced_blocks_of_another_boot_are_forgotten(tmp_path):
    cfg = config(tmp_path / "cache", 1024 * KiB)
    blob = make_blob(40 * KiB)
    with CacheTier(cfg) as tier:
        with tier.begin(blob.digest, blob.size, blob.block_size, blob.blocks) as partial:
            partial.write_block(0, blob.block(0))
            partial.write_block(1, blob.block(1), durable=False)
        # Pretend the unsynced write happened before a reboot.
        tier._index._exec("UPDATE blobs SET volatile_boot = 'another-boot' WHERE digest = ?", (blob.digest,))
    with CacheTier(cfg) as tier:
        assert tier.last_reconcile.blocks_forgotten == 1
        with tier.begin(blob.digest, blob.size, blob.block_size, blob.blocks) as partial:
            assert partial.verified == frozenset()  # the durable one goes too: one flag per blob
    with CacheTier(cfg) as tier:  # same boot: kept
        with tier.begin(blob.digest, blob.size, blob.block_size, blob.blocks) as partial:
            partial.write_block(2, blob.block(2), durable=False)
    with CacheTier(cfg) as tier:
        assert tier.record(blob.digest).verified == {2}


def test_reconcile_is_stat_only_and_fast(tmp_path):
    cfg = config(tmp_path / "cache", 1 << 30)
    with CacheTier(cfg) as tier:
        for i in range(100):
            fill(tier, make_blob(100, seed=i), durable=False)
    started = time.monotonic()
    with CacheTier(cfg) as tier:
        elapsed = time.monotonic() - started
        assert tier.usage().complete == 100
    assert elapsed < 2


def test_a_blob_begun_unsynced_records_each_block_in_one_statement_and_is_forgotten_after_a_reboot(tmp_path):
    """Recording a block without fdatasync needs the blob's row to carry the boot id: set at begin, the
    first block's record is one statement, not a transaction of its own after a failed one."""
    cfg = config(tmp_path / "cache", 1024 * KiB)
    blob = make_blob(40 * KiB)
    with CacheTier(cfg) as tier:
        statements: list[str] = []
        with tier.begin(blob.digest, blob.size, blob.block_size, blob.blocks, unsynced=True) as partial:
            tier._index._conn.set_trace_callback(statements.append)  # what the index's writer runs
            partial.write_block(0, blob.block(0), durable=False)
            tier._index._conn.set_trace_callback(None)
            assert [s.split()[0] for s in statements] == ["INSERT"], statements
            partial.write_block(1, blob.block(1), durable=False)
        assert tier.record(blob.digest).verified == {0, 1}
        tier._index._exec("UPDATE blobs SET volatile_boot = 'another-boot' WHERE digest = ?", (blob.digest,))
    with CacheTier(cfg) as tier:  # as after a reboot: the unsynced blocks may not be on the disk
        assert tier.last_reconcile.blocks_forgotten == 1
        assert tier.record(blob.digest).verified == frozenset()


def _zero_and_restamp(path) -> None:
    """What a power loss can leave of a file the kernel had not written back: its metadata (the
    commit's stamp among it) on the disk, its bytes not."""
    st = os.stat(path)
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.write(bytes(st.st_size))
    os.chmod(path, 0o444)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert stamp_intact(os.stat(path))


def test_a_blob_committed_unsynced_is_not_fsynced_and_is_hashed_by_every_reader_after_a_reboot(tmp_path, monkeypatch):
    cfg = config(tmp_path / "cache", 1024 * KiB)
    unsynced, synced = make_blob(40 * KiB, seed=1), make_blob(40 * KiB, seed=2)
    real_fsync, real_fdatasync, synced_files = os.fsync, os.fdatasync, []  # the files synced, by inode
    monkeypatch.setattr(os, "fsync", lambda fd: (synced_files.append(os.fstat(fd).st_ino), real_fsync(fd))[1])
    monkeypatch.setattr(os, "fdatasync",
                        lambda fd: (synced_files.append(os.fstat(fd).st_ino), real_fdatasync(fd))[1])
    with CacheTier(cfg) as tier:
        inode = os.stat(fill(tier, unsynced, durable=False, unsynced=True)).st_ino
        assert inode not in synced_files  # neither its blocks nor its file waited for the disk
        assert tier._index.get(unsynced.digest).volatile_boot == tier._boot
        inode = os.stat(fill(tier, synced, durable=True)).st_ino
        assert synced_files.count(inode) == synced.block_count + 1  # each block, then the file
        assert tier._index.get(synced.digest).volatile_boot is None
        paths = {blob.digest: tier.complete_path(blob.digest) for blob in (unsynced, synced)}
    assert all(stamp_intact(os.stat(path)) for path in paths.values())
    with CacheTier(cfg) as tier:  # the same boot: nothing to do
        assert tier.last_reconcile.unsynced_rechecked == 0
        assert tier._index.get(unsynced.digest).volatile_boot == tier._boot
        tier._index._exec("UPDATE blobs SET volatile_boot = 'another-boot' WHERE digest = ?", (unsynced.digest,))
    _zero_and_restamp(paths[unsynced.digest])
    with CacheTier(cfg) as tier:  # as after a reboot that lost the unsynced blob's bytes
        assert tier.last_reconcile.unsynced_rechecked == 1
        assert tier.state(unsynced.digest) is BlobState.COMPLETE  # stat only: no read of the cache here
        assert tier._index.get(unsynced.digest).volatile_boot is None
    assert not stamp_intact(os.stat(paths[unsynced.digest]))
    assert stamp_intact(os.stat(paths[synced.digest]))
    for path in paths.values():
        path.read_bytes()  # every page in the page cache: a stamped file is then taken as it is
    reads = VerifiedReads("first")
    reads.map_blob(paths[synced.digest], synced.digest, synced.size)
    assert reads.files_resident == 1
    with pytest.raises(CacheCorrupt):
        reads.map_blob(paths[unsynced.digest], unsynced.digest, unsynced.size)
    assert reads.files_resident == 1 and reads.mismatches == 1  # hashed, not taken as it was


def test_a_commit_renamed_unsynced_before_a_reboot_is_promoted_and_hashed_by_readers(tmp_path):
    cfg = config(tmp_path / "cache", 1024 * KiB)
    blob = make_blob(40 * KiB)
    with CacheTier(cfg) as tier:
        with tier.begin(blob.digest, blob.size, blob.block_size, blob.blocks, unsynced=True) as partial:
            for i in partial.missing_blocks():
                partial.write_block(i, blob.block(i), durable=False)
            gen = tier._index.get(blob.digest).gen
        tier._index._exec("UPDATE blobs SET volatile_boot = 'another-boot' WHERE digest = ?", (blob.digest,))
    src = tmp_path / "cache" / "partial" / f"{blob.digest}.{gen}"
    os.utime(src, ns=(0, 1_000_000_000 + STAMP_NS))  # stamped by the commit's check, renamed, then the reboot
    os.chmod(src, 0o444)
    dest = tmp_path / "cache" / "blobs" / blob.digest[:2] / blob.digest
    dest.parent.mkdir()
    os.rename(src, dest)
    with CacheTier(cfg) as tier:
        assert tier.last_reconcile.promoted == 1
        assert tier.state(blob.digest) is BlobState.COMPLETE
        assert tier._index.get(blob.digest).volatile_boot is None
    assert not stamp_intact(os.stat(dest))
