"""Options shared by several commands, and the value types that parse them strictly.

Each type turns what the user wrote (a flag, a ``STAGER_*`` variable or a key of
the config file: click hands all three to ``convert``) into a value, or fails
with a message that says what the value means; the CLI's error handler names
where the value came from.
"""

from __future__ import annotations

from typing import Any, Callable

import click

from ..config import SourceConfig, parse_capacity, parse_rate, parse_seconds, parse_size
from ..errors import ConfigError


def parse_storage_options(pairs: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """``("key=value", ...)`` to a dict; values that look like JSON scalars are decoded.

    ``client_kwargs.endpoint_url=...`` style dotted keys build nested dicts.

    Raises:
        ConfigError: a pair is not ``key=value``, or a key is both a value and a table.
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
    """The source of a command: its URL and its ``-o key=value`` storage options."""
    return SourceConfig(url=url, storage_options=parse_storage_options(pairs))


def storage_option_flag(name: str = "--storage-option", dest: str = "storage_option", help_side: str = "") -> Callable:
    """The repeatable ``-o KEY=VALUE`` option of the commands that read a source."""
    return click.option(
        name, "-o", dest, multiple=True, metavar="KEY=VALUE",
        help=f"fsspec storage option{help_side} (repeatable), e.g. -o endpoint_url=http://127.0.0.1:9000 "
             "-o key=ACCESS -o secret=SECRET. AWS_* environment variables are read too.",
    )


class _StrictType(click.ParamType):
    """A value type whose parser raises ConfigError; ``toml_types`` are what a config file may hold for it."""

    toml_types: tuple[type, ...] = (str,)
    toml_name = "a string"

    def parse(self, value: Any) -> Any:
        raise NotImplementedError

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, bool) or not isinstance(value, self.toml_types):
            self.fail(f"expected {self.toml_name}, got {value!r}", param, ctx)
        try:
            return self.parse(value)
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)


class SizeType(_StrictType):
    """A byte size such as 8MiB, 500GB or 1048576 (a bare number is bytes), at least ``minimum``."""

    name = "SIZE"
    toml_types = (str, int)
    toml_name = "a size (a string such as \"8MiB\", or a number of bytes)"

    def __init__(self, minimum: int = 0, maximum: int | None = None) -> None:
        self.minimum = minimum
        self.maximum = maximum

    def parse(self, value: Any) -> int:
        size = parse_size(value, what=None)
        if size < self.minimum:
            raise ConfigError(f"must be at least {_bytes(self.minimum)}, got {value!r}")
        if self.maximum is not None and size > self.maximum:
            raise ConfigError(f"must be at most {_bytes(self.maximum)}, got {value!r}")
        return size


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n:,} bytes"


class CapacityType(_StrictType):
    """A cache capacity: bytes with a unit (500GB), a whole number of bytes (> 1), or a share with % (80%)."""

    name = "SIZE|SHARE%"
    toml_types = (str, int)
    toml_name = "a string such as \"500GB\" or \"80%\""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        return super().convert(value, param, ctx)

    def parse(self, value: Any) -> Capacity:
        return parse_capacity(value, what=None)


class RateType(_StrictType):
    """A byte rate per second (200MB/s, 1GiB; a bare number is bytes/s), or ``unlimited``."""

    name = "RATE"
    toml_types = (str, int)
    toml_name = "a rate (a string such as \"200MB/s\" or \"unlimited\", or bytes per second)"

    def parse(self, value: Any) -> int | None:
        if isinstance(value, str) and not value.strip():
            raise ConfigError("empty: give a rate such as 200MB/s, or 'unlimited'")
        return parse_rate(value, what=None)


class SecondsType(_StrictType):
    """A finite number of seconds above ``minimum`` (nan, inf and anything smaller refused)."""

    name = "SECONDS"
    toml_types = (str, int, float)
    toml_name = "a number of seconds"

    def __init__(self, minimum: float = 0.0, *, allow_minimum: bool = False) -> None:
        self.minimum = minimum
        self.allow_minimum = allow_minimum

    def parse(self, value: Any) -> float:
        return parse_seconds(value, what=None, minimum=self.minimum, allow_minimum=self.allow_minimum)


class ShareType(_StrictType):
    """A share in (0, 1], written 0.1 or 10% (nan refused)."""

    name = "SHARE"
    toml_types = (str, int, float)
    toml_name = "a share such as 0.1 or \"10%\""

    def parse(self, value: Any) -> float:
        text = str(value).strip()
        try:
            share = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            raise ConfigError(f"{value!r} is not a share (examples: 0.1, 10%)") from None
        if not 0 < share <= 1:  # also refuses nan
            raise ConfigError(f"a share must be in (0, 1] (or (0%, 100%]), got {value!r}")
        return share


#: A parsed ``--capacity``: ``(bytes, None)`` or ``(None, share of the disk)``.
Capacity = tuple[int | None, float | None]

SIZE = SizeType()
POSITIVE_SIZE = SizeType(minimum=1)
#: What a manifest's block size may be (see stager.manifest.build.IndexConfig).
BLOCK_SIZE = SizeType(minimum=4 << 10, maximum=1 << 30)
CAPACITY = CapacityType()
RATE = RateType()
SECONDS = SecondsType()
SHARE = ShareType()


def checked_by(parse: Callable[[str], Any]) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """A click callback that checks a value with ``parse`` (which raises ConfigError) and keeps the text.

    The parser's message may start with the flag and the value (``--shard '5/2': ...``); that
    part is left to the error handler, which names the flag, the variable or the file's key.
    """

    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is None:
            return value
        try:
            parse(value)
        except ConfigError as exc:
            message = str(exc)
            for opt in getattr(param, "opts", ()):
                if message.startswith(f"{opt} {value!r}: "):  # "--shard '5/2': need ..."
                    message = message[len(f"{opt} {value!r}: "):]
                elif message.startswith(f"{opt}: "):  # "--metrics-address: 'x' is not ..."
                    message = message[len(f"{opt}: "):]
            raise click.BadParameter(message, ctx=ctx, param=param) from exc
        return value

    return callback
