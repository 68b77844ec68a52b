"""``stager mount SOURCE MOUNTPOINT`` and ``stager unmount MOUNTPOINT``: the read-only FUSE view."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path

import click

from ..event_loop import run_async
from . import cli
from .cache_options import cache_config, cache_flags, fetch_config, fetch_flags, write_flags
from .options import SIZE, Capacity, source_config, storage_option_flag


@cli.command("mount")
@click.argument("source")
@click.argument("mountpoint", type=click.Path(file_okay=False, path_type=Path))
@storage_option_flag()
@cache_flags
@fetch_flags
@write_flags
@click.option("-f", "--foreground", is_flag=True,
              help="Stay attached and serve until Ctrl-C, SIGTERM or an unmount (default: return once mounted).")
@click.option("--readahead", type=SIZE, default="512MiB", show_default=True, envvar="STAGER_READAHEAD",
              help="How far ahead of a sequential reader to stage (0: no read-ahead).")
@click.option("--allow-other", is_flag=True, envvar="STAGER_ALLOW_OTHER",
              help="Let other users read the mount (non-root users need user_allow_other in /etc/fuse.conf).")
@click.option("--log-file", type=click.Path(dir_okay=False, path_type=Path), default=None, envvar="STAGER_LOG_FILE",
              help="Log of a background mount (default: stager-mount-UID-NAME.log in the temp directory).")
@click.option("--socket", "socket_path", type=click.Path(dir_okay=False, path_type=Path), envvar="STAGER_SOCKET",
              default=None, help="The node daemon's socket (default: see `stager serve --help`); used when a "
                                 "daemon serves --cache.")
@click.option("--no-daemon", is_flag=True, envvar="STAGER_NO_DAEMON",
              help="Run the engine in the mount's process even when a daemon serves the cache.")
@click.option("--verify-reads", type=click.Choice(["first", "off"]), default="first", show_default=True,
              envvar="STAGER_VERIFY_READS",
              help="Hash each block of a cache file the first time this mount reads it, before serving it "
                   "(a block changed on disk is fetched again); off: trust the cache disk.")
def mount_command(source: str, mountpoint: Path, storage_option: tuple[str, ...], cache_dir: str | None,
                  capacity: Capacity, concurrency: int, bandwidth: int | None, no_hedge: bool, retry_deadline: float,
                  direct_writes: bool, durable: bool, foreground: bool, readahead: int, allow_other: bool,
                  log_file: Path | None, socket_path: Path | None, no_daemon: bool, verify_reads: str) -> None:
    """Mount SOURCE read-only at MOUNTPOINT, in the dataset's own layout, backed by the verified cache.

    Staging goes through the node daemon when one serves --cache (`stager serve`), else through
    an engine in the mount's own process. Listing never touches the origin. A read of a block not yet staged fetches that block
    urgently; sequential reads stage the following blocks and files ahead. A block that cannot
    be fetched within --retry-deadline seconds fails the read with EIO (the log names the shard).
    End it with `stager unmount MOUNTPOINT`, `fusermount3 -u MOUNTPOINT` or SIGTERM.
    """
    from stager.fuse import MountConfig, ReadAheadConfig, mount_in_background, serve

    config = MountConfig(
        source=source_config(source, storage_option), mountpoint=mountpoint,
        cache=dataclasses.replace(cache_config(cache_dir, capacity, direct_writes), verify_reads=verify_reads),
        fetch=fetch_config(concurrency, bandwidth, no_hedge, retry_deadline, durable),
        readahead=ReadAheadConfig(window_bytes=readahead),
        allow_other=allow_other, session="embedded" if no_daemon else "auto", socket=socket_path)
    if foreground:
        run_async(serve(config, on_ready=lambda: click.echo(
            f"mounted {source} at {config.mountpoint}; Ctrl-C or `stager unmount {config.mountpoint}` ends it",
            err=True)))
        return
    log_file = log_file or Path(tempfile.gettempdir()) / f"stager-mount-{os.getuid()}-{config.mountpoint.name}.log"
    pid = mount_in_background(config, log_file)
    click.echo(f"mounted {source} at {config.mountpoint} (pid {pid}, log {log_file}); "
               f"end it with: stager unmount {config.mountpoint}")


@cli.command("unmount")
@click.argument("mountpoint", type=click.Path(file_okay=False, path_type=Path))
@click.option("-z", "--lazy", is_flag=True, help="Detach now even if files are open; finish when they close.")
def unmount_command(mountpoint: Path, lazy: bool) -> None:
    """Unmount a `stager mount` and wait for its process to finish."""
    from stager.fuse import unmount

    unmount(mountpoint, lazy=lazy)
