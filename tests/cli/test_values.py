"""Every numeric, size, rate, share and duration option of every command refuses nan, inf and negatives."""

from __future__ import annotations

import click
import pytest

from stager.cli import cli
from stager.cli.options import CapacityType, RateType, SecondsType, ShareType, SizeType

STRICT = (click.IntRange, SecondsType, SizeType, CapacityType, RateType, ShareType)
#: Plain integers that may be anything (a seed).
ANY_INTEGER = {("demo", "seed")}


def numeric_options():
    for name, command in sorted(cli.all_commands().items()):
        for param in command.params:
            if isinstance(param, click.Option) and isinstance(param.type, (click.types.IntParamType,
                                                                           click.types.FloatParamType, *STRICT)):
                yield pytest.param(name, command, param, id=f"{name}-{param.name}")


@pytest.mark.parametrize("name, command, param", list(numeric_options()))
def test_no_option_takes_nan_inf_or_a_negative(name, command, param):
    if (name, param.name) in ANY_INTEGER:
        return
    assert isinstance(param.type, STRICT), f"`stager {name}` {param.opts[0]}: an unchecked {param.type.name}"
    arguments = ["arg"] * sum(1 for p in command.params if isinstance(p, click.Argument))
    for bad in ("nan", "inf", "-inf", "-1", "-0.5", ""):
        with pytest.raises(click.BadParameter):
            command.make_context(name, [*arguments, param.opts[0], bad])


@pytest.mark.parametrize("flag, value", [("--bandwidth", "0"), ("--capacity", "1"), ("--capacity", "0.8"),
                                         ("--retry-deadline", "0"), ("--concurrency", "0"), ("--limit", "0")])
def test_values_that_used_to_mean_something_else_are_refused(flag, value):
    command = cli.all_commands()["stage"]
    with pytest.raises(click.BadParameter):
        command.make_context("stage", ["src", flag, value])


def test_the_values_help_promises_are_taken():
    command = cli.all_commands()["stage"]
    params = command.make_context("stage", ["src", "--capacity", "80%", "--bandwidth", "unlimited",
                                            "--retry-deadline", "2.5", "--limit", "1GB"]).params
    assert params["capacity"] == (None, 0.8) and params["bandwidth"] is None
    assert params["retry_deadline"] == 2.5 and params["limit"] == 10**9
    params = command.make_context("stage", ["src", "--capacity", "500GB", "--bandwidth", "200MB/s"]).params
    assert params["capacity"] == (500 * 10**9, None) and params["bandwidth"] == 200 * 10**6
