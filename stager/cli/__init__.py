"""The ``stager`` command line (click).

Settings come from, highest first: flags, ``STAGER_*`` environment variables
(each option names its variable in ``--help``), then a TOML file given by
``--config`` or ``STAGER_CONFIG``. In that file, top-level keys apply to every
command that has an option of that name, and a ``[command]`` table applies to
one command only::

    cache = "/nvme/stager"
    capacity = "80%"
    [storage_options]
    endpoint_url = "http://127.0.0.1:9000"
    [stage]
    concurrency = 32

A :class:`~stager.errors.StagerError` ends the command with one line on stderr
and exit status 1; a traceback means a bug.
"""

from __future__ import annotations

import gc
import importlib
import logging
import os
import sys
from typing import Any

import click

from .. import __version__
from ..config import load_toml
from ..errors import StagerError

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130


def _default_map(config: dict[str, Any], commands: dict[str, click.Command]) -> dict[str, dict[str, Any]]:
    """Turn the TOML layout (shared top-level keys, per-command tables) into click's default_map."""
    shared = {k: v for k, v in config.items() if not isinstance(v, dict) or k == "storage_options"}
    result: dict[str, dict[str, Any]] = {}
    for name, command in commands.items():
        params = {p.name for p in command.params}
        # A key names an option by its flag (``cache`` for ``--cache``) or by its parameter name.
        by_flag = {opt.lstrip("-").replace("-", "_"): p.name for p in command.params
                   for opt in getattr(p, "opts", ()) if opt.startswith("--")}
        merged = {**shared, **config.get(name, {})}
        values: dict[str, Any] = {}
        for key, value in merged.items():
            key = key.replace("-", "_")
            if key == "storage_options" and "storage_option" in params and isinstance(value, dict):
                values["storage_option"] = [f"{k}={v}" for k, v in value.items()]
            elif key in params:
                values[key] = value
            elif by_flag.get(key) is not None:
                values[by_flag[key]] = value
        result[name] = values
    return result


#: Each subcommand and the module that defines it: a command's module (and what it
#: imports) is loaded only when that command runs or help lists it, so a short command
#: does not pay for every other one's start-up.
COMMAND_MODULES = {
    "demo": "demo",
    "index": "index",
    "mount": "mount",
    "replicate": "replicate",
    "serve": "serve",
    "stage": "stage",
    "status": "status",
    "unmount": "mount",
    "verify": "status",
}


class StagerGroup(click.Group):
    """A click group that loads its subcommands on first use and the TOML config before their options."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(COMMAND_MODULES) | set(self.commands))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.commands and name in COMMAND_MODULES:
            importlib.import_module(f"{__name__}.{COMMAND_MODULES[name]}")  # registers itself on this group
            gc.freeze()  # what the imports made lives for the whole run: never scan it again
        return self.commands.get(name)

    def all_commands(self) -> dict[str, click.Command]:
        """Every subcommand, loading their modules."""
        for module in sorted(set(COMMAND_MODULES.values())):
            importlib.import_module(f"{__name__}.{module}")
        return dict(self.commands)

    def make_context(self, info_name, args, parent=None, **extra):  # type: ignore[override]
        config_path = _find_config_path(args)
        if config_path:
            extra["default_map"] = _default_map(load_toml(config_path), self.all_commands())
        return super().make_context(info_name, args, parent=parent, **extra)


def _find_config_path(args: list[str]) -> str | None:
    for i, arg in enumerate(args):
        if arg == "--config" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return os.environ.get("STAGER_CONFIG") or None


@click.group(cls=StagerGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="stager")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), envvar="STAGER_CONFIG",
              help="TOML config file (flags and STAGER_* variables take precedence).")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
def cli(config_path: str | None, verbose: int) -> None:
    """stager: pre-stage tokenized shards into a node-local cache, verified, ahead of training."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI, turning stager errors into one line and a non-zero exit."""
    # The cyclic collector's default pace (every 700 new containers) spends a tenth of
    # staging a gigabyte scanning the futures and buffers of a busy loop, which free
    # themselves by reference counting; a slower pace keeps the collector for real cycles.
    gc.set_threshold(10_000, 50, 50)
    # No command does linear algebra; OpenBLAS would start a thread per core, which spin
    # for a while after numpy's import, beside the transfer.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        cli.main(args=argv, prog_name="stager", standalone_mode=False)
    except StagerError as exc:
        click.echo(f"stager: error: {exc}", err=True)
        sys.exit(EXIT_ERROR)
    except click.exceptions.Abort:
        click.echo("stager: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except KeyboardInterrupt:
        click.echo("stager: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    finally:
        # The interpreter's exit collects every object still alive (the modules, a manifest):
        # a tenth of a second after the work is done. Frozen, they are only freed.
        gc.freeze()
