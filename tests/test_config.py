"""Parsing values strictly, and where the defaults live (XDG base directories, the old places kept)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from stager.cache import CacheTier
from stager.config import (
    CacheConfig,
    default_cache_dir,
    default_state_root,
    move_legacy_replicate_state,
    parse_capacity,
    parse_rate,
    parse_seconds,
    parse_size,
)
from stager.errors import ConfigError


@pytest.mark.parametrize("text", ["1", "1.0", "0.5", ".8", "0", "0%", "150%", "nan%", "-5%", "lots", "", True, 0.5])
def test_a_capacity_that_is_not_clearly_bytes_or_a_share_is_refused(text):
    with pytest.raises(ConfigError):
        parse_capacity(text)


def test_a_bare_one_is_refused_as_ambiguous_and_the_message_shows_both_spellings():
    with pytest.raises(ConfigError, match=r"ambiguous.*%.*1B"):
        parse_capacity("1")


@pytest.mark.parametrize("text, expected", [
    ("80%", (None, 0.8)), ("100%", (None, 1.0)), ("500GB", (500 * 10**9, None)), ("1B", (1, None)),
    ("2", (2, None)), ("1048576", (1 << 20, None)), (1 << 30, (1 << 30, None)), ("2TiB", (2 << 40, None)),
])
def test_capacities_mean_what_they_say(text, expected):
    assert parse_capacity(text) == expected


def test_a_rate_of_zero_is_refused_and_unlimited_is_said_outright():
    for zero in ("0", "0MB/s", 0):
        with pytest.raises(ConfigError, match="unlimited"):
            parse_rate(zero, what="--bandwidth")
    assert parse_rate("unlimited") is None and parse_rate("None") is None and parse_rate(None) is None
    assert parse_rate("200MB/s") == 200 * 10**6 and parse_rate("1GiB") == 1 << 30


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "-1", "0", "soon", math.nan, math.inf, True])
def test_seconds_must_be_finite_and_positive(text):
    with pytest.raises(ConfigError):
        parse_seconds(text, what="--retry-deadline")


def test_seconds_at_a_minimum_only_where_it_is_allowed():
    assert parse_seconds("0", minimum=0, allow_minimum=True) == 0.0
    assert parse_seconds("2.5") == 2.5


@pytest.mark.parametrize("value", [math.nan, math.inf, -1, [1], "8 parsecs"])
def test_a_bad_size_is_a_config_error_not_a_crash(value):
    with pytest.raises(ConfigError):
        parse_size(value, what="--window")


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in ("XDG_CACHE_HOME", "XDG_STATE_HOME"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


def test_the_defaults_follow_the_xdg_variables(home, tmp_path):
    assert default_cache_dir({}) == home / ".cache" / "stager"
    assert default_state_root({}) == home / ".local" / "state" / "stager" / "replicate"
    env = {"XDG_CACHE_HOME": str(tmp_path / "xc"), "XDG_STATE_HOME": str(tmp_path / "xs")}
    assert default_cache_dir(env) == tmp_path / "xc" / "stager"
    assert default_state_root(env) == tmp_path / "xs" / "stager" / "replicate"
    # relative values are invalid by the XDG spec: ignored
    assert default_cache_dir({"XDG_CACHE_HOME": "rel"}) == home / ".cache" / "stager"
    assert default_state_root({"XDG_STATE_HOME": "rel"}) == home / ".local" / "state" / "stager" / "replicate"


def test_replicate_state_is_never_inside_the_default_cache(home, tmp_path):
    for env in ({}, {"XDG_CACHE_HOME": str(home / ".cache"), "XDG_STATE_HOME": str(home / ".local/state")}):
        assert not default_state_root(env).is_relative_to(default_cache_dir(env))


def test_a_cache_at_the_old_default_keeps_being_used(home, tmp_path):
    legacy = home / ".cache" / "stager"
    with CacheTier(CacheConfig(legacy, capacity=10 << 20)):
        pass
    env = {"XDG_CACHE_HOME": str(tmp_path / "xc")}
    assert default_cache_dir(env) == legacy
    (tmp_path / "xc" / "stager").mkdir(parents=True)  # once the new place exists, it wins
    assert default_cache_dir(env) == tmp_path / "xc" / "stager"


def test_old_replicate_state_moves_out_of_the_default_cache(home):
    old = home / ".cache" / "stager" / "replicate" / "0123abcd"
    old.mkdir(parents=True)
    (old / "journal.sqlite").write_bytes(b"journal")
    move_legacy_replicate_state({})
    moved = home / ".local" / "state" / "stager" / "replicate" / "0123abcd" / "journal.sqlite"
    assert moved.read_bytes() == b"journal"
    assert list((home / ".cache" / "stager").iterdir()) == []
    with CacheTier(CacheConfig(home / ".cache" / "stager", capacity=10 << 20)) as cache:  # usable as a cache now
        assert Path(cache.directory) == home / ".cache" / "stager"
