"""The iterator's read-ahead bounds: its floor is its current and next shuffle window, its seconds ahead a knob."""

from __future__ import annotations

import pytest

from stager.errors import ConfigError
from stager.iterator.staging import describe
from tests.iterator.test_iterator import FETCH, corpus, iterator  # noqa: F401 - corpus is a fixture


def test_the_iterator_asks_for_two_shuffle_windows_as_its_floor_and_its_seconds_ahead(corpus, tmp_path):
    data, manifest = corpus
    with iterator(data, tmp_path / "cache", session="embedded", ahead_seconds=7.0, prefetch_bytes=1 << 20) as it:
        next(iter(it))
        plan = it._link.plan.plan  # the engine's plan behind the embedded session
        floor = 2 * it._order(it.epoch).max_window_bytes(manifest.sizes)
        assert plan.floor_bytes == floor
        assert plan.window_bytes == max(1 << 20, floor)
        assert plan.ahead_seconds == 7.0
        assert it.fetch_config.ahead_seconds == 7.0


def test_without_the_knob_the_engine_default_applies(corpus, tmp_path):
    data, _ = corpus
    with iterator(data, tmp_path / "cache", session="embedded") as it:
        next(iter(it))
        assert it._link.plan.plan.ahead_seconds == 60.0
    assert FETCH.ahead_seconds is None


@pytest.mark.parametrize("bad", [0, -1, float("nan"), "soon"])
def test_a_bad_ahead_seconds_is_one_clear_error(corpus, tmp_path, bad):
    data, _ = corpus
    with pytest.raises(ConfigError, match="ahead_seconds"):
        iterator(data, tmp_path / "cache", ahead_seconds=bad)


def test_the_log_line_says_the_loops_rate_and_how_far_ahead_it_stages(corpus, tmp_path):
    data, _ = corpus
    with iterator(data, tmp_path / "cache", session="embedded") as it:
        next(iter(it))
        stats = it.stats()
        plan = it._link.plan.plan
        assert stats["session_plan_ahead_bytes"] == plan.ahead_bytes
        assert ("session_plan_rate" in stats) == (plan.rate is not None)
        line = describe(stats)
        assert f"staging {plan.ahead_bytes / 1e6:,.0f} MB ahead" in line and "reading " in line
