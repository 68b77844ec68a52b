"""How many reads of a block the indexer takes before its bytes count as the truth, or as changing for good."""

from __future__ import annotations

import random

from stager.manifest.object_hash import _Agreement, read_limit, reads_needed

TRUE = 0


def read_until_agreed(rng: random.Random, corrupt_p: float, span: int) -> int | None:
    """One block's agreement reads through a corrupter flipping one of ``span * 8`` bits of a read with
    ``corrupt_p``; the value taken, or None when the reads ran out."""
    def read() -> int:
        return rng.randrange(1, span * 8 + 1) if rng.random() < corrupt_p else TRUE

    agreement = _Agreement(read(), reads_needed(span))  # the earlier pass's read of the block
    for _ in range(read_limit(agreement.needed)):
        digest = read()
        if agreement.take(digest):
            return digest
    return None


def test_a_corrupter_flipping_three_reads_in_ten_does_not_exhaust_a_blocks_reads():
    """30% of the bodies corrupted (as the indexer's fault test does) ran a block out of its reads
    about once in a thousand blocks when 10 reads were its limit (14 of these 20,000); now it is far rarer."""
    rng = random.Random(7)
    results = [read_until_agreed(rng, 0.30, 64 * 1024) for _ in range(20_000)]
    assert results.count(None) == 0
    assert set(results) == {TRUE}


def test_reads_that_never_agree_are_given_up_on_after_the_limit():
    rng = random.Random(1)
    assert [read_until_agreed(rng, 1.0, 64 * 1024) for _ in range(100)] == [None] * 100
    assert read_limit(reads_needed(64 * 1024)) <= 20 and read_limit(reads_needed(1)) <= 32
