"""The TOML config file of the command line: checked as a whole, then turned into click's defaults.

The file's layout: top-level keys name an option of some command (by flag,
``retry_deadline`` for ``--retry-deadline``, or by parameter name) and apply to
every command that has it; a ``[command]`` table applies to that command only
and wins; ``[storage_options]`` holds the sources' fsspec options and
``[profiles.NAME]`` the storage options that replicate's ``--src-profile`` and
``--dst-profile`` name. Anything else (a misspelt key or table, a value of the
wrong type) is refused with one line naming the file and the key, before any
command runs, so a typo never silently means a default.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Mapping

import click

from ..config import load_toml
from ..errors import ConfigError

#: Parameters that are not settings a file can hold.
NOT_IN_FILE = frozenset({"config_path", "config_file", "help"})
TABLES = ("storage_options", "profiles")


@dataclass(frozen=True)
class ConfigFile:
    """A checked config file: click's ``default_map`` and, for each value, where in the file it came from."""

    path: str
    default_map: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: (command, parameter name) -> "key 'capacity'" or "[stage] key 'concurrency'"
    origins: dict[tuple[str, str], str] = field(default_factory=dict)


def load_config_file(path: str, commands: Mapping[str, click.Command]) -> ConfigFile:
    """Read, check and map the config file at ``path`` for ``commands``.

    Raises:
        ConfigError: unreadable, not TOML, an unknown key or table, or a value of the wrong type
            (one line naming the file and the key).
    """
    return check_config(load_toml(path), path, commands)


def check_config(data: Mapping[str, Any], path: str, commands: Mapping[str, click.Command]) -> ConfigFile:
    """Check the parsed config ``data`` (read from ``path``, which messages name) and map it for ``commands``.

    Raises:
        ConfigError: an unknown key or table, or a value of the wrong type.
    """
    keys = {name: _option_keys(command) for name, command in commands.items()}
    everywhere: dict[str, list[click.Option]] = {}
    for options in keys.values():
        for key, option in options.items():
            everywhere.setdefault(key, []).append(option)
    for key, value in data.items():
        if key in commands:
            _check_table(path, key, value, keys[key])
        elif key == "storage_options":
            _check_storage_options(path, f"[{key}]", value)
        elif key == "profiles":
            _check_profiles(path, value)
        elif isinstance(value, dict):
            raise ConfigError(f"{path}: unknown table [{key}]{_suggest(key, [*commands, *TABLES], '[', ']')}")
        elif _norm(key) in everywhere:
            for option in everywhere[_norm(key)]:
                _check_type(path, f"key '{key}'", value, option)
        else:
            raise ConfigError(f"{path}: unknown key '{key}'{_suggest(_norm(key), everywhere)}")
    return _mapped(path, data, commands, keys)


def _norm(key: str) -> str:
    return key.replace("-", "_")


def _option_keys(command: click.Command) -> dict[str, click.Option]:
    """The keys that name an option of ``command``: its long flags and its parameter names."""
    result: dict[str, click.Option] = {}
    for param in command.params:
        if not isinstance(param, click.Option) or param.name in NOT_IN_FILE or param.hidden:
            continue
        result[param.name] = param
        for opt in param.opts:
            if opt.startswith("--"):
                result[_norm(opt[2:])] = param
    return result


def _check_table(path: str, command: str, table: Any, options: Mapping[str, click.Option]) -> None:
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: '{command}' must be a table ([{command}]), got {table!r}")
    for key, value in table.items():
        if key == "storage_options" and "storage_option" in options:
            _check_storage_options(path, f"[{command}] key 'storage_options'", value)
        elif _norm(key) in options:
            _check_type(path, f"[{command}] key '{key}'", value, options[_norm(key)])
        else:
            raise ConfigError(f"{path}: [{command}] unknown key '{key}' (not an option of `stager {command}`)"
                              f"{_suggest(_norm(key), options)}")


def _check_storage_options(path: str, where: str, value: Any) -> None:
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: {where} must be a table of fsspec storage options, got {value!r}")


def _check_profiles(path: str, value: Any) -> None:
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: 'profiles' must hold tables ([profiles.NAME]), got {value!r}")
    for name, table in value.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: [profiles] key '{name}' must be a table ([profiles.{name}]) of storage "
                              f"options, got {table!r}")


def _check_type(path: str, where: str, value: Any, option: click.Option) -> None:
    types, described = _expected(option)
    if option.multiple:
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    else:
        ok = isinstance(value, types) and (bool in types or not isinstance(value, bool))
    if not ok:
        raise ConfigError(f"{path}: {where} must be {described}, got {value!r}")


def _expected(option: click.Option) -> tuple[tuple[type, ...], str]:
    if option.multiple:
        return (list,), "a list of strings"
    if option.is_flag and not option.count:
        return (bool,), "true or false"
    kind = option.type
    if hasattr(kind, "toml_types"):
        return kind.toml_types, kind.toml_name
    if isinstance(kind, click.types.IntParamType):
        return (int,), "a whole number"
    if isinstance(kind, click.types.FloatParamType):
        return (int, float), "a number"
    if isinstance(kind, click.Choice):
        return (str,), "one of " + ", ".join(repr(c) for c in kind.choices)
    return (str,), "a string"


def _suggest(key: str, known: Any, before: str = "'", after: str = "'") -> str:
    close = difflib.get_close_matches(key, sorted(known), n=1)
    return f" (did you mean {before}{close[0]}{after}?)" if close else ""


def _mapped(path: str, data: Mapping[str, Any], commands: Mapping[str, click.Command],
            keys: Mapping[str, Mapping[str, click.Option]]) -> ConfigFile:
    shared = {k: v for k, v in data.items() if k not in commands and k != "profiles"}
    result = ConfigFile(path)
    for name in commands:
        options = keys[name]
        for where, table in ((None, shared), (name, data.get(name, {}))):
            for key, value in table.items():
                origin = f"[{where}] key '{key}'" if where else f"key '{key}'"
                if key == "storage_options":
                    if "storage_option" not in options:
                        continue
                    param, value = "storage_option", _storage_pairs(value)
                    origin = f"[{where}] key 'storage_options'" if where else "[storage_options]"
                elif _norm(key) in options:
                    param = options[_norm(key)].name
                else:
                    continue
                result.default_map.setdefault(name, {})[param] = value
                result.origins[(name, param)] = origin
    return result


def _storage_pairs(table: Mapping[str, Any], prefix: str = "") -> list[str]:
    """A storage-options table as ``-o`` pairs; nested tables become dotted keys."""
    pairs: list[str] = []
    for key, value in table.items():
        if isinstance(value, dict):
            pairs.extend(_storage_pairs(value, f"{prefix}{key}."))
        else:
            import json

            text = value if isinstance(value, str) else json.dumps(value)
            pairs.append(f"{prefix}{key}={text}")
    return pairs
