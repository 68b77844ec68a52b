"""Options shared by several commands, and turning them into config values."""

from __future__ import annotations

from typing import Any, Callable

import click

from ..config import SourceConfig, parse_size
from ..errors import ConfigError


def parse_storage_options(pairs: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """``("key=value", ...)`` to a dict; values that look like JSON scalars are decoded.

    ``client_kwargs.endpoint_url=...`` style dotted keys build nested dicts.
    """
    import json

    result: dict[str, Any] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--storage-option {pair!r}: expected key=value")
        try:
            parsed: Any = json.loads(value)
            if isinstance(parsed, (dict, list)):
                parsed = value
        except ValueError:
            parsed = value
        node = result
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--storage-option {pair!r}: {part} is both a value and a table")
        node[leaf] = parsed
    return result


def source_config(url: str, pairs: tuple[str, ...]) -> SourceConfig:
    return SourceConfig(url=url, storage_options=parse_storage_options(pairs))


def storage_option_flag(name: str = "--storage-option", dest: str = "storage_option", help_side: str = "") -> Callable:
    return click.option(
        name, "-o", dest, multiple=True, metavar="KEY=VALUE",
        help=f"fsspec storage option{help_side} (repeatable), e.g. -o endpoint_url=http://127.0.0.1:9000 "
             "-o key=ACCESS -o secret=SECRET. AWS_* environment variables are read too.",
    )


class SizeType(click.ParamType):
    """A byte size such as 8MiB, 500GB or 1048576."""

    name = "SIZE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        try:
            return parse_size(value, what=param.name if param else "size")
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)


SIZE = SizeType()
