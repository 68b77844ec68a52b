"""Every setting's ``--help`` names its ``STAGER_*`` variable, and that variable really sets it."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from stager.cli import cli
from stager.cli.options import CapacityType, RateType, SecondsType, ShareType, SizeType

#: Options that pick what one run does (or are per-run lists): no variable, on purpose.
PER_RUN = {
    "demo": {"directory", "shards", "seed"},
    "index": {"storage_option", "include", "exclude", "dry_run", "check", "allow_empty"},
    "mount": {"storage_option", "foreground"},
    "replicate": {"src_option", "dst_option", "dry_run", "delete", "trust_size", "verify", "finalize", "watch",
                  "as_json"},
    "stage": {"storage_option", "limit", "as_json"},
    "status": {"as_json"},
    "unmount": {"lazy"},
    "verify": {"sample", "no_repair", "as_json"},
}


def options():
    for name, command in sorted(cli.all_commands().items()):
        for param in command.params:
            if isinstance(param, click.Option) and param.name != "help":
                yield pytest.param(name, command, param, id=f"{name}-{param.name}")


def sample(param: click.Option) -> tuple[str, object]:
    """A value for the variable other than the default, and what it must parse to."""
    kind = param.type
    if param.is_flag:
        return ("0", False) if param.default else ("1", True)
    if param.multiple:
        return "a b", ("a", "b")
    if isinstance(kind, click.IntRange):
        value = (kind.min or 0) + 2
        return str(value), value
    if isinstance(kind, SecondsType):
        return str(kind.minimum + 7.5), kind.minimum + 7.5
    if isinstance(kind, CapacityType):
        return "7GB", (7 * 10**9, None)
    if isinstance(kind, RateType):
        return "7MB/s", 7 * 10**6
    if isinstance(kind, SizeType):
        return "7MiB", 7 << 20
    if isinstance(kind, ShareType):
        return "25%", 0.25
    if isinstance(kind, click.Choice):
        choice = next(c for c in kind.choices if c != param.default)
        return choice, choice
    if param.name == "shard":
        return "1/3", "1/3"
    if param.name in ("metrics_address", "peer_listen"):
        return "127.0.0.1:0", "127.0.0.1:0"
    return "/stager-test/somewhere", "/stager-test/somewhere"


@pytest.mark.parametrize("name, command, param", list(options()))
def test_each_setting_names_its_variable_in_help_and_the_variable_sets_it(name, command, param, monkeypatch):
    if param.name in PER_RUN.get(name, set()):
        assert not param.envvar, f"{name} --{param.name}: has a variable after all; drop it from PER_RUN"
        return
    assert param.envvar, f"`stager {name}` {param.opts[0]} has no STAGER_* variable"
    variables = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar)
    assert all(v.startswith("STAGER_") for v in variables), variables
    ctx = click.Context(command, info_name=name)
    help_text = param.get_help_record(ctx)[1]
    for variable in variables:
        assert variable in help_text, help_text
    text, expected = sample(param)
    for variable in ("STAGER_CONFIG", *variables):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv(variables[0], text)
    arguments = ["arg"] * sum(1 for p in command.params if isinstance(p, click.Argument))
    parsed = command.make_context(name, arguments).params[param.name]
    assert (str(parsed) if isinstance(parsed, Path) else parsed) == expected

