"""Scrubbing finds bytes that rotted on disk and drops them so the engine fetches them again."""

from __future__ import annotations

import os

from stager.cache import BlobState, CacheTier

from .blobs import check_invariants, config, fill, make_blob

KiB = 1024


def flip_byte(path, offset: int) -> None:
    os.chmod(path, 0o644)
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))
    os.chmod(path, 0o444)


def test_verify_finds_and_drops_corrupt_blocks(tmp_path):
    with CacheTier(config(tmp_path / "c", 4096 * KiB)) as tier:
        good, bad = make_blob(100 * KiB, seed=1), make_blob(100 * KiB + 3, seed=2)
        fill(tier, good)
        fill(tier, bad)
        part = make_blob(64 * KiB, seed=3)
        with tier.begin(part.digest, part.size, part.block_size, part.blocks) as partial:
            for i in (0, 1, 3):
                partial.write_block(i, part.block(i))
            part_path = partial.path
        flip_byte(tier.complete_path(bad.digest), 6 * 16 * KiB + 1)  # the last, short block
        flip_byte(part_path, 16 * KiB + 5)

        report = tier.verify(repair=False)
        assert report.blobs_checked == 3 and report.blocks_checked == 7 + 7 + 3
        assert report.bytes_checked == good.size + bad.size + 3 * 16 * KiB
        assert {(b.digest, b.bad_blocks) for b in report.bad} == {(bad.digest, (6,)), (part.digest, (1,))}
        assert tier.state(bad.digest) is BlobState.COMPLETE  # not repaired

        report = tier.verify()
        assert len(report.bad) == 2 and report.repaired
        assert tier.state(bad.digest) is BlobState.ABSENT
        assert tier.record(part.digest).verified == {0, 3}
        assert tier.verify().ok
        check_invariants(tier)


def test_verify_sample(tmp_path):
    with CacheTier(config(tmp_path / "c", 4096 * KiB)) as tier:
        for i in range(20):
            fill(tier, make_blob(KiB, seed=i))
        assert tier.verify(sample=0.0).blobs_checked == 0
        assert tier.verify(sample=1.0).blobs_checked == 20
        some = tier.verify(sample=0.5, seed=1).blobs_checked
        assert 0 < some < 20 and tier.verify(sample=0.5, seed=1).blobs_checked == some


def test_verify_reads_large_blobs_in_large_reads(tmp_path):
    with CacheTier(config(tmp_path / "c", 64 * 1024 * KiB)) as tier:
        blob = make_blob(20 * 1024 * KiB + 11, block_size=1024 * KiB, seed=5)
        fill(tier, blob, durable=False)
        seen = []
        report = tier.verify(progress=seen.append)
        assert report.ok and report.blocks_checked == 21 and seen == [blob.size]
