"""Default places: the cache under $XDG_CACHE_HOME, replicate's state under $XDG_STATE_HOME,
never one inside the other."""

from __future__ import annotations

import json

from tests.engine.corpus import make_corpus

from .runner import run

CACHE_FORMAT = "stager-cache.toml"


def home_env(tmp_path, **xdg: str) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {"HOME": str(home), "XDG_CACHE_HOME": "", "XDG_STATE_HOME": "", **xdg}


def test_stage_without_cache_works_after_a_replicate(tmp_path):
    make_corpus(tmp_path / "src", shards=2)
    env = home_env(tmp_path)
    run(["replicate", str(tmp_path / "src"), str(tmp_path / "dst"), "--json"], env=env, check=True)
    result = run(["stage", str(tmp_path / "src"), "--capacity", "100MB", "--json"], env=env)
    assert result.returncode == 0, result.stderr
    home = tmp_path / "home"
    assert (home / ".cache" / "stager" / CACHE_FORMAT).is_file()
    assert any((home / ".local" / "state" / "stager" / "replicate").iterdir())
    assert not (home / ".cache" / "stager" / "replicate").exists()


def test_replicate_state_an_older_version_left_in_the_cache_is_moved_and_used(tmp_path):
    make_corpus(tmp_path / "src", shards=2)
    env = home_env(tmp_path)
    home = tmp_path / "home"
    first = json.loads(run(["replicate", str(tmp_path / "src"), str(tmp_path / "dst"), "--json"], env=env,
                           check=True).stdout)
    assert first["copied_objects"] == 2
    state_root = home / ".local" / "state" / "stager" / "replicate"
    (home / ".cache" / "stager").mkdir(parents=True, exist_ok=True)
    (state_root).rename(home / ".cache" / "stager" / "replicate")  # where older versions kept it
    result = run(["stage", str(tmp_path / "src"), "--capacity", "100MB"], env=env)
    assert result.returncode == 0, result.stderr  # it was: "not a stager cache ... and not empty"
    assert any(state_root.iterdir()) and not (home / ".cache" / "stager" / "replicate").exists()
    # the journal moved with it: the next run copies nothing and checks nothing (its journal vouches)
    again = json.loads(run(["replicate", str(tmp_path / "src"), str(tmp_path / "dst"), "--json"], env=env,
                           check=True).stdout)
    assert again["copied_objects"] == 0 and again["checked_objects"] == 0


def test_the_cache_follows_xdg_cache_home_but_an_old_cache_keeps_working(tmp_path):
    make_corpus(tmp_path / "src", shards=1)
    home = tmp_path / "home"
    old = run(["stage", str(tmp_path / "src"), "--capacity", "100MB", "--json"], env=home_env(tmp_path), check=True)
    assert json.loads(old.stdout)["fetched_bytes"] > 0 and (home / ".cache" / "stager" / CACHE_FORMAT).is_file()
    xdg = home_env(tmp_path, XDG_CACHE_HOME=str(tmp_path / "xdg-cache"))
    again = run(["status", "--json"], env=xdg, check=True)
    assert json.loads(again.stdout)["cache"] == str(home / ".cache" / "stager")  # the existing cache, still used
    fresh = home_env(tmp_path, XDG_CACHE_HOME=str(tmp_path / "other"))
    (home / ".cache" / "stager").rename(tmp_path / "moved-away")
    status = run(["status", "--json"], env=fresh, check=True)
    assert json.loads(status.stdout)["cache"] == str(tmp_path / "other" / "stager")
