"""The ``stager`` command line (click).

Settings come from, highest first: flags, ``STAGER_*`` environment variables
(``--help`` names each option's variable), then a TOML file given by
``--config`` or ``STAGER_CONFIG`` (checked as a whole first: see
:mod:`.config_file`). In that file, top-level keys apply to every command that
has an option of that name, and a ``[command]`` table applies to one command
only::

    cache = "/nvme/stager"
    capacity = "80%"
    [storage_options]
    endpoint_url = "http://127.0.0.1:9000"
    [stage]
    concurrency = 32

A :class:`~stager.errors.StagerError` (or a task group of them) ends the
command with one line on stderr and exit status 1; a bad flag, variable or
config value ends it with one line naming where the value came from and exit
status 2. A traceback means a bug.
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
from ..errors import StagerError, group_message
from ..open_files import raise_soft_limit
from .config_file import check_config, load_config_file
from .failure import usage_error_line

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130
#: Where the checked config file (a ConfigFile, or None) is kept in the context's meta.
CONFIG_META = "stager.config_file"


#: Each subcommand and the module that defines it: a command's module (and what it
#: imports) is loaded only when that command runs or help lists it, so a short command
#: does not pay for every other one's start-up.
COMMAND_MODULES = {
    "checkpoints": "checkpoints",
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


#: Each subcommand's summary, the first paragraph of its help: what ``stager --help`` lists, without
#: loading every command's module for it (that took half a second; a test holds the two equal).
COMMAND_SUMMARIES = {
    "checkpoints": "Checkpoints drained through stager: list, verify (and repair), prune, drain a folder.",
    "demo": "Run the main job on a generated dataset: index it, stage it through a slow, faulty origin, verify.",
    "index": "Hash every file under SOURCE and write SOURCE/.stager/manifest.parquet atomically.",
    "mount": "Mount SOURCE read-only at MOUNTPOINT, in the dataset's own layout, backed by the verified cache.",
    "replicate": "Copy every object of SRC's manifest to DST, verified, and write DST's manifest last.",
    "serve": "Run the node daemon: consumers on this node share its engine and cache through a Unix socket.",
    "stage": "Stage every shard of SOURCE into the cache, verifying each block against the manifest.",
    "status": "Show what the cache holds: capacity, use, and each dataset's blobs (complete and partial).",
    "unmount": "Unmount a `stager mount` and wait for its process to finish.",
    "verify": "Re-hash the cache against the recorded block digests; drop what fails so it is fetched again.",
}


class StagerCommand(click.Command):
    """A subcommand whose ``--help`` names each option's ``STAGER_*`` variable."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if isinstance(param, click.Option) and param.envvar:
                param.show_envvar = True


class StagerGroup(click.Group):
    """A click group that loads its subcommands on first use and the TOML config before their options."""

    command_class = StagerCommand

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(COMMAND_MODULES) | set(self.commands))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.commands and name in COMMAND_MODULES:
            importlib.import_module(f"{__name__}.{COMMAND_MODULES[name]}")  # registers itself on this group
            gc.freeze()  # what the imports made lives for the whole run: never scan it again
        return self.commands.get(name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list of ``--help``, from :data:`COMMAND_SUMMARIES` for the commands not loaded."""
        listed = [(name, self.commands.get(name) or click.Command(name, help=COMMAND_SUMMARIES[name]))
                  for name in self.list_commands(ctx)]
        listed = [(name, command) for name, command in listed if not command.hidden]
        if listed:
            limit = formatter.width - 6 - max(len(name) for name, _ in listed)
            with formatter.section("Commands"):
                formatter.write_dl([(name, command.get_short_help_str(limit)) for name, command in listed])

    def all_commands(self) -> dict[str, click.Command]:
        """Every subcommand, loading their modules."""
        for module in sorted(set(COMMAND_MODULES.values())):
            importlib.import_module(f"{__name__}.{module}")
        return dict(self.commands)

    def make_context(self, info_name, args, parent=None, **extra):  # type: ignore[override]
        config_path = _find_config_path(args)
        config = load_config_file(config_path, self.all_commands()) if config_path else None
        if config is not None:
            extra["default_map"] = config.default_map
        ctx = super().make_context(info_name, args, parent=parent, **extra)
        ctx.meta[CONFIG_META] = config  # shared with the subcommand's context: errors name the file's keys
        return ctx


def _default_map(config: dict[str, Any], commands: dict[str, click.Command]) -> dict[str, dict[str, Any]]:
    """click's default_map for a parsed config file (checked first; see :mod:`.config_file`)."""
    return check_config(config, "config file", commands).default_map


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
    if argv is None:  # this process is the command: room for a socket and a file per request in flight
        raise_soft_limit()
    if argv is None and "pandas" not in sys.modules:  # this process is the command, not a caller's
        # pyarrow imports pandas, when it is installed, the first time it converts an array (to tell
        # pandas objects apart): 0.3 s of CPU before stage's first shard request. No command uses pandas.
        sys.meta_path.insert(0, _WithoutPandas())
    try:
        cli.main(args=argv, prog_name="stager", standalone_mode=False)
    except StagerError as exc:
        click.echo(f"stager: error: {_one_line(str(exc))}", err=True)
        sys.exit(EXIT_ERROR)
    except BaseExceptionGroup as group:
        line = group_message(group)
        if line is None:
            raise  # something in it is not a stager error: a bug, whose traceback is wanted
        click.echo(f"stager: error: {_one_line(line)}", err=True)
        sys.exit(EXIT_ERROR)
    except click.exceptions.Abort:
        click.echo("stager: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except KeyboardInterrupt:
        click.echo("stager: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except click.exceptions.NoArgsIsHelpError as exc:  # plain `stager`: the help, as click shows it
        exc.show()
        sys.exit(exc.exit_code)
    except click.UsageError as exc:
        config = exc.ctx.meta.get(CONFIG_META) if exc.ctx is not None else None
        click.echo(f"stager: error: {_one_line(usage_error_line(exc, config))}", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"stager: error: {_one_line(exc.format_message())}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    finally:
        # The interpreter's exit collects every object still alive (the modules, a manifest):
        # a tenth of a second after the work is done. Frozen, they are only freed.
        gc.freeze()


class _WithoutPandas:
    """A module finder under which pyarrow's own ``import pandas`` fails, as where pandas is not installed.

    Only an import whose nearest Python frame (past the import machinery) is stager's own code is refused:
    stager never imports pandas, so that import came from a C extension it called (pyarrow). A library
    that imports pandas itself (an fsspec backend, say) still gets it.
    """

    _package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "pandas" and self._asked_by_stager():
            raise ModuleNotFoundError("pandas is not used by the stager command", name=name)
        return None

    @classmethod
    def _asked_by_stager(cls) -> bool:
        frame = sys._getframe(2)
        while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
            frame = frame.f_back
        return frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(cls._package + os.sep)


def _one_line(text: str) -> str:
    """An error message on one line, whatever a lower library put in it."""
    return " ".join(text.split())
