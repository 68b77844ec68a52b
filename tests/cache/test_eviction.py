"""Eviction order (rank, then consumed, then LRU) and what is never evicted."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stager.cache import BlobState, CacheTier
from stager.cache.blob_index import Candidate
from stager.cache.eviction import eviction_order

from .blobs import check_invariants, config, fill, make_blob

ROOT = Path(__file__).resolve().parents[2]
KiB = 1024
SIZE = 16 * KiB  # one block, one 4 KiB-aligned charge each


@pytest.fixture
def tier(tmp_path):
    with CacheTier(config(tmp_path / "cache", 1024 * KiB), touch_interval=0) as t:
        yield t


def filled(tier: CacheTier, n: int) -> list[str]:
    """n complete blobs, accessed in order (the first is the least recently used)."""
    digests = []
    for i in range(n):
        blob = make_blob(SIZE, seed=100 + i)
        fill(tier, blob)
        digests.append(blob.digest)
    for d in digests:
        time.sleep(0.002)
        tier.touch(d)
    return digests


def evicted_in_order(tier: CacheTier, digests: list[str], **kwargs) -> list[str]:
    """Evict one blob at a time; the order in which they went."""
    order = []
    for _ in range(len(digests)):
        if tier.evict(1, **kwargs) == 0:
            break
        order += [d for d in digests if d not in order and tier.state(d) is BlobState.ABSENT]
    return order


def test_lru_without_rank(tier):
    d = filled(tier, 4)
    tier.touch(d[0])  # now the most recent
    assert evicted_in_order(tier, d) == [d[1], d[2], d[3], d[0]]


def test_consumed_before_lru(tier):
    d = filled(tier, 4)
    tier.mark_consumed(d[3], "epoch-1")
    tier.mark_consumed(d[2], "epoch-0")
    assert evicted_in_order(tier, d) == [d[2], d[3], d[0], d[1]]


def test_consumed_tokens_filter(tier):
    d = filled(tier, 3)
    tier.mark_consumed(d[2], "epoch-0")  # a previous epoch's mark does not count
    tier.mark_consumed(d[1], "epoch-1")
    assert evicted_in_order(tier, d, consumed={"epoch-1"}) == [d[1], d[0], d[2]]


def test_rank_first_then_consumed_then_lru(tier):
    d = filled(tier, 6)
    ranks = {d[0]: 1.0, d[1]: 5.0, d[2]: math.inf, d[3]: None, d[4]: 5.0, d[5]: float("nan")}
    tier.mark_consumed(d[4], 0)
    # inf, None and NaN rank alike (no plan needs them): LRU among them; then 5.0 (consumed first); then 1.0.
    assert evicted_in_order(tier, d, rank=ranks.get) == [d[2], d[3], d[5], d[4], d[1], d[0]]


def test_eviction_order_is_a_pure_function():
    c = [Candidate(f"{i:032x}", "g", 10, float(i), None) for i in range(4)]
    assert [x.digest for x in eviction_order(c)] == [x.digest for x in c]
    assert [x.digest for x in eviction_order(c, rank=lambda d: -int(d, 16), exclude={c[0].digest})] == \
        [c[1].digest, c[2].digest, c[3].digest]


def test_pinned_protected_held_and_locked_are_never_evicted(tier):
    d = filled(tier, 5)
    tier.pin(d[0])
    tier.hold("me-1", [d[1]])
    lock = tier.lock(d[2])
    assert lock.try_lock()
    freed = tier.evict(10**9, protect={d[3]})
    assert freed == SIZE  # only d[4]
    assert [tier.state(x) for x in d] == [BlobState.COMPLETE] * 4 + [BlobState.ABSENT]
    lock.release()
    tier.release("me-1")
    tier.unpin(d[0])
    assert tier.evict(10**9, protect={d[3]}) == 3 * SIZE
    assert tier.state(d[3]) is BlobState.COMPLETE
    check_invariants(tier)


def test_a_live_process_hold_protects_and_a_dead_ones_does_not(tier):
    d = filled(tier, 2)
    holder = subprocess.Popen([sys.executable, "-m", "tests.cache.peer_process", "hold", str(tier.directory),
                               "peer-1", d[0]], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert holder.stdout.readline().strip() == b"held"
        assert tier.evict(10**9) == SIZE
        assert tier.state(d[0]) is BlobState.COMPLETE  # held by a live process
        holder.kill()  # SIGKILL: no chance to release; not reaped yet (a zombie)
        deadline = time.monotonic() + 10
        for _ in range(1000):  # until the kernel has finished killing it (a few ms)
            if tier.evict(10**9) or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        assert tier.state(d[0]) is BlobState.ABSENT
        assert tier._index.owners() == []  # the dead owner's holds were cleaned up
    finally:
        holder.kill()
        holder.wait(timeout=10)


def test_pid_reuse_does_not_keep_a_hold_alive(tier):
    d = filled(tier, 1)
    tier.hold("ghost", [d[0]])
    # Same pid as a live process (ours), but another start time: the hold is a dead process's.
    tier._index.add_holds("ghost", os.getpid(), 1, tier._boot, [d[0]])
    assert tier.evict(1) == SIZE


def test_begin_evicts_with_rank_and_protect(tmp_path):
    with CacheTier(config(tmp_path / "c", 4 * SIZE), touch_interval=0) as tier:
        d = filled(tier, 4)
        new = make_blob(2 * SIZE, seed=999)
        ranks = {d[0]: 1.0, d[1]: 9.0, d[2]: 8.0, d[3]: 7.0}
        fill(tier, new, rank=ranks.get, protect={d[1]})
        assert [tier.state(x) for x in d] == [BlobState.COMPLETE, BlobState.COMPLETE,
                                              BlobState.ABSENT, BlobState.ABSENT]
        check_invariants(tier)


class Untouchable:
    """What a caller protects, which must not be looked at: the engine's is every plan's window, and
    made into one set for every blob's begin, a plan of thousands of shards cost seconds of CPU."""

    def __iter__(self):
        raise AssertionError("begin looked at what is protected although it had room")

    def __contains__(self, digest):
        raise AssertionError("begin looked at what is protected although it had room")


def test_begin_looks_at_what_is_protected_only_when_it_must_evict(tmp_path):
    with CacheTier(config(tmp_path / "c", 4 * SIZE), touch_interval=0) as tier:
        filled(tier, 2)  # half full: the next blob fits
        fill(tier, make_blob(SIZE, seed=998), protect=Untouchable())
        with pytest.raises(AssertionError, match="although it had room"):  # full: now it must look
            fill(tier, make_blob(2 * SIZE, seed=997), protect=Untouchable())
        check_invariants(tier)


def test_a_kept_order_is_refreshed_when_it_runs_dry(tier):
    d = filled(tier, 2)
    tier.pin(d[0])
    assert tier.evict(1) == SIZE  # d[1]; the order is now kept for a while
    late = make_blob(SIZE, seed=777)
    fill(tier, late)  # arrived after the order was made
    tier.unpin(d[0])  # was excluded when the order was made
    assert tier.evict(10**9) == 2 * SIZE
    assert tier.state(d[0]) is BlobState.ABSENT and tier.state(late.digest) is BlobState.ABSENT
    assert tier.evicted_blobs == 3 and tier.evicted_bytes == 3 * SIZE
