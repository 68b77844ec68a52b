"""One line for a bad flag, ``STAGER_*`` variable or config-file value, naming where it came from.

click checks every value the same way whether it was typed, read from the
environment or taken from the config file (its ``default_map``), and says
"Invalid value for '--concurrency'" for all three. A user who never typed
``--concurrency`` looks for the variable or the file's key instead, so the
message names that.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource

if TYPE_CHECKING:
    from .config_file import ConfigFile


def usage_error_line(exc: click.UsageError, config: ConfigFile | None) -> str:
    """The message of a usage error as one line (without the ``stager: error:`` prefix)."""
    ctx = exc.ctx
    where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
    if (not isinstance(exc, click.BadParameter) or isinstance(exc, click.MissingParameter) or exc.param is None
            or ctx is None):
        return exc.format_message() + where
    param = exc.param
    message = exc.message
    source = ctx.get_parameter_source(param.name) if param.name else None
    if source is ParameterSource.ENVIRONMENT:
        name = _set_variable(param)
        if name is not None:
            return f"{name}={os.environ[name]}: {message}"
    if source is ParameterSource.DEFAULT_MAP and config is not None:
        origin = config.origins.get((ctx.info_name or "", param.name or ""))
        if origin is not None:
            return f"{config.path}: {origin}: {message}"
    flag = "/".join(param.opts) if isinstance(param, click.Option) else param.human_readable_name
    return f"{flag}: {message}{where}"


def _set_variable(param: click.Parameter) -> str | None:
    """The variable (of the parameter's) that is set, the one click read the value from."""
    names = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar or ())
    return next((n for n in names if os.environ.get(n)), None)
