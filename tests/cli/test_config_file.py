"""The config file is checked as a whole, and a bad value names where it came from: file and key, variable, flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from stager.cli import cli
from stager.cli.config_file import load_config_file

from .runner import assert_one_line_error, run_here

DEPLOYED = Path(__file__).resolve().parents[2] / "deploy" / "config" / "stager.toml"


def write(tmp_path, text: str) -> str:
    path = tmp_path / "stager.toml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("text, fragments", [
    ('capcity = "10MB"\n', ["unknown key 'capcity'", "did you mean 'capacity'"]),
    ('[stgae]\nconcurrency = 4\n', ["unknown table [stgae]", "did you mean [stage]"]),
    ('[stage]\nconcurency = 4\n', ["[stage] unknown key 'concurency'", "did you mean 'concurrency'"]),
    ('[status]\nconcurrency = 4\n', ["[status] unknown key 'concurrency'", "not an option of `stager status`"]),
    ("cache = 42\n", ["key 'cache' must be a string", "42"]),
    ('concurrency = "lots"\n', ["key 'concurrency' must be a whole number"]),
    ("no_hedge = 1\n", ["key 'no_hedge' must be true or false"]),
    ('[stage]\nstorage_options = "x"\n', ["[stage] key 'storage_options' must be a table"]),
    ('profiles = 3\n', ["'profiles' must hold tables"]),
    ('[index]\ninclude = "*.bin"\n', ["[index] key 'include' must be a list of strings"]),
])
def test_every_mistake_in_the_file_is_one_line_naming_file_and_key(tmp_path, capsys, text, fragments):
    path = write(tmp_path, text)
    result = run_here(["--config", path, "status", "--cache", str(tmp_path / "cache")], capsys)
    assert_one_line_error(result, path, *fragments)


def test_a_bad_value_in_the_file_names_the_file_and_key_not_a_flag(tmp_path, capsys):
    path = write(tmp_path, "[stage]\nconcurrency = 0\n")
    result = run_here(["--config", path, "stage", str(tmp_path)], capsys)
    assert_one_line_error(result, path, "[stage] key 'concurrency'", "1<=x<=4096")
    assert "--concurrency" not in result.stderr
    path = write(tmp_path, 'capacity = "1"\n')
    result = run_here(["--config", path, "status", "--cache", str(tmp_path / "cache")], capsys)
    assert_one_line_error(result, path, "key 'capacity'", "ambiguous")


def test_a_bad_value_in_a_variable_names_the_variable(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("STAGER_CONCURRENCY", "0")
    result = run_here(["stage", str(tmp_path), "--cache", str(tmp_path / "cache")], capsys)
    assert_one_line_error(result, "STAGER_CONCURRENCY=0:", "1<=x<=4096")
    assert "--concurrency" not in result.stderr and result.returncode == 2


def test_a_bad_flag_names_the_flag(tmp_path, capsys):
    result = run_here(["stage", str(tmp_path), "--concurrency", "0"], capsys)
    assert_one_line_error(result, "--concurrency", "1<=x<=4096", "stager stage --help")
    assert result.returncode == 2


def test_flags_beat_variables_beat_the_file(tmp_path, capsys, monkeypatch):
    path = write(tmp_path, 'capacity = "1GB"\n[status]\ncapacity = "2GB"\n')
    cache = str(tmp_path / "cache")

    def capacity(*args) -> str:
        result = run_here(["--config", path, "status", "--cache", cache, "--json", *args], capsys)
        assert result.returncode == 0, result.stderr
        import json

        return json.loads(result.stdout)["capacity"]

    assert capacity() == 2 * 10**9  # the [status] table wins over the top-level key
    monkeypatch.setenv("STAGER_CAPACITY", "3GB")
    assert capacity() == 3 * 10**9
    assert capacity("--capacity", "4GB") == 4 * 10**9


def test_the_deployed_config_file_is_valid_and_every_key_in_it_is_used(tmp_path, capsys):
    commands = cli.all_commands()
    config = load_config_file(str(DEPLOYED), commands)
    assert config.default_map["serve"]["socket_group"] == "stager"
    assert config.default_map["stage"]["cache_dir"] == "/var/cache/stager"
    # and its values convert: a command runs with it (its cache moved to a temporary directory)
    result = run_here(["--config", str(DEPLOYED), "status", "--cache", str(tmp_path / "cache")], capsys)
    assert result.returncode == 0, result.stderr


def test_the_examples_commented_out_in_the_deployed_file_are_valid_too(tmp_path):
    import re

    text = re.sub(r"(?m)^# (\[[\w.]+\]|\w+ = .*)$", r"\1", DEPLOYED.read_text())
    assert text.count("\n[") > DEPLOYED.read_text().count("\n[")  # the tables commented out came back
    load_config_file(write(tmp_path, text), cli.all_commands())


def test_storage_options_and_profiles_tables_are_accepted(tmp_path, capsys):
    path = write(tmp_path, '[storage_options]\nendpoint_url = "http://127.0.0.1:9"\n'
                           '[storage_options.client_kwargs]\nregion_name = "x"\n'
                           '[profiles.a]\nkey = "k"\n[replicate]\nsrc_profile = "a"\n')
    config = load_config_file(path, cli.all_commands())
    assert sorted(config.default_map["stage"]["storage_option"]) == [
        "client_kwargs.region_name=x", "endpoint_url=http://127.0.0.1:9"]
    assert config.default_map["replicate"]["src_profile"] == "a"
