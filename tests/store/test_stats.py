"""OriginStats: plain counters."""

from __future__ import annotations

from stager.store.stats import OUTCOMES, OriginStats


def test_counters_start_at_zero_and_count():
    stats = OriginStats()
    assert all(v == 0 for v in stats.snapshot().values())
    for outcome in OUTCOMES:
        stats.count(outcome)
    stats.bytes_read += 10
    assert stats.requests == len(OUTCOMES)
    snap = stats.snapshot()
    assert snap["bytes_read"] == 10 and snap["ok"] == 1
    snap["ok"] = 99
    assert stats.ok == 1  # a copy


def test_snapshot_names_every_counter():
    assert set(OriginStats().snapshot()) >= {
        "ok", "throttled", "transient", "corrupt", "not_found", "denied",
        "retries", "bytes_read", "bytes_written",
    }
