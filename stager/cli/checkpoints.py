"""``stager checkpoints``: list a run's checkpoints, verify and repair them, apply retention, drain a folder.

Every store of a checkpoint takes the destination's storage options (``-o``)
unless ``--replica-option`` gives the replicas their own.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from ..config import SourceConfig
from ..errors import CheckpointError
from . import cli
from .options import SECONDS, parse_storage_options, storage_option_flag
from ..event_loop import run_async


def _options_for(url: str, dest_options: dict, replica_options: dict):
    """Storage options per store URL: the destination's for ``url`` and below it, else the replicas' (when given)."""
    root = url.rstrip("/")

    def options_for(target: str) -> dict:
        target = target.rstrip("/")
        if target == root or target.startswith(root + "/") or not replica_options:
            return dest_options
        return replica_options

    return options_for


def _replica_flags(fn):
    fn = click.option("--replica-option", "-r", "replica_option", multiple=True, metavar="KEY=VALUE",
                      help="Storage option of the replicas (repeatable); by default the destination's.")(fn)
    fn = click.option("--replica", "replicas", multiple=True, metavar="URL",
                      help="A replica (repeatable): for list and verify, where to look when the destination lost "
                           "the manifest; for drain, where else the checkpoint goes.")(fn)
    return storage_option_flag(help_side=" of the destination")(fn)


@cli.group("checkpoints")
def checkpoints() -> None:
    """Checkpoints drained through stager: list, verify (and repair), prune, drain a folder."""


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


@checkpoints.command("list")
@click.argument("url")
@_replica_flags
@click.option("--staging", type=click.Path(file_okay=False), help="This node's staging directory (shows staged saves).")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of a table.")
def list_command(url: str, storage_option: tuple[str, ...], replicas: tuple[str, ...], replica_option: tuple[str, ...],
                 staging: str | None, as_json: bool) -> None:
    """Each checkpoint under the run URL: size, state at each store (staged, draining, incomplete, complete,
    damaged), age; for an incomplete multi-node save, which nodes' parts are missing."""
    from ..checkpoint.inventory import list_checkpoints
    from ..checkpoint.staging import StagingDir

    options_for = _options_for(url, parse_storage_options(storage_option), parse_storage_options(replica_option))
    found = run_async(list_checkpoints(url, options_for, replicas, StagingDir(staging) if staging else None))
    if as_json:
        click.echo(json.dumps([{"name": c.name, "step": c.step, "size": c.size, "age_s": c.age, "stores": c.states,
                                "missing": c.missing, "complete": c.complete_everywhere} for c in found], indent=1))
        return
    if not found:
        click.echo(f"{url}: no checkpoints")
        return
    for c in found:
        size = "-" if c.size is None else f"{c.size / 1e6:.1f}MB"
        states = "  ".join(f"{u}={s}" for u, s in c.states.items())
        click.echo(f"{c.name}  {size}  age {_age(c.age)}  {states}")
        for store, nodes in c.missing.items():
            click.echo(f"  {store}: waiting for {', '.join(nodes)}")


@checkpoints.command("verify")
@click.argument("url")
@_replica_flags
@click.option("--no-repair", is_flag=True, help="Only report; send nothing.")
def verify_command(url: str, storage_option: tuple[str, ...], replicas: tuple[str, ...], replica_option: tuple[str, ...],
                   no_repair: bool) -> None:
    """Read back one checkpoint at every store, and repair a damaged or deleted file from a good copy."""
    from ..checkpoint.verify import verify_checkpoint

    options_for = _options_for(url, parse_storage_options(storage_option), parse_storage_options(replica_option))
    report = run_async(verify_checkpoint(url, options_for, replicas, repair=not no_repair))
    for store in report.stores:
        bad = report.bad.get(store, [])
        fixed = report.repaired.get(store, [])
        if not bad:
            click.echo(f"{store}: ok")
        else:
            click.echo(f"{store}: {len(bad)} bad ({', '.join(bad)}); repaired {len(fixed)}")
    if report.lost:
        raise CheckpointError(f"{url}: no store holds a good copy of {', '.join(report.lost)}")
    if not report.ok:
        bad = sum(len(v) for v in report.bad.values())
        raise CheckpointError(f"{url}: {bad} file(s) missing or damaged"
                              + ("; run verify without --no-repair to repair them" if no_repair else ""))


@checkpoints.command("prune")
@click.argument("url")
@_replica_flags
@click.option("--keep-last", type=int, required=True, help="Keep the K newest checkpoints complete at every store.")
@click.option("--keep-every", type=int, default=None, help="Also keep each checkpoint whose step is a multiple of M.")
@click.option("--dry-run", is_flag=True, help="Name what would be deleted; delete nothing.")
def prune_command(url: str, storage_option: tuple[str, ...], replicas: tuple[str, ...], replica_option: tuple[str, ...],
                  keep_last: int, keep_every: int | None, dry_run: bool) -> None:
    """Retention: delete checkpoints complete at every store beyond --keep-last/--keep-every (never the newest)."""
    from ..checkpoint.inventory import list_checkpoints
    from ..checkpoint.retention import delete_checkpoint, to_delete

    options_for = _options_for(url, parse_storage_options(storage_option), parse_storage_options(replica_option))

    async def run() -> None:
        found = await list_checkpoints(url, options_for, replicas)
        doomed = to_delete(found, keep_last, keep_every)
        for c in doomed:
            click.echo(f"{'would delete' if dry_run else 'deleting'} {c.name} at {', '.join(c.manifest.stores)}")
            if not dry_run:
                await delete_checkpoint(c, options_for)
        click.echo(f"kept {len(found) - len(doomed)} of {len(found)} checkpoint(s)")

    run_async(run())


@checkpoints.command("drain")
@click.argument("local_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("url")
@_replica_flags
@click.option("--staging", type=click.Path(file_okay=False), required=True,
              help="The staging directory whose drain queue takes the folder (its journal lives there).")
@click.option("--background", is_flag=True, help="Queue it and return; a drainer process (or the daemon) sends it.")
@click.option("--timeout", type=SECONDS, default=None, help="Give up waiting after this many seconds.")
def drain_command(local_dir: str, url: str, storage_option: tuple[str, ...], replicas: tuple[str, ...],
                  replica_option: tuple[str, ...], staging: str, background: bool, timeout: float | None) -> None:
    """Send a folder a framework just wrote (save_pretrained, Megatron, DeepSpeed) to URL and replicas, verified.

    The folder is hashed now and must not change until the drain ends; the manifest goes last.
    """
    from ..checkpoint.drain import Drain, queue_folder
    from ..checkpoint.drainer import drain_until_empty, spawn_drainer
    from ..checkpoint.staging import StagingDir

    dest = parse_storage_options(storage_option)
    rep = parse_storage_options(replica_option) or dest
    targets = [SourceConfig(url.rstrip("/"), dest)] + [SourceConfig(r.rstrip("/"), rep) for r in replicas]
    area = StagingDir(staging)
    entry = queue_folder(area, Path(local_dir), url.rstrip("/"), targets)
    if background:
        spawn_drainer(area.root)
        click.echo(f"queued {local_dir} for {url} ({entry.name})")
        return
    began = time.monotonic()
    drain = Drain(area)
    while not entry.drained:
        drain_until_empty(area, drain)
        if entry.drained:
            break
        if entry.name in drain.failed:
            raise CheckpointError(f"{local_dir}: not drained: {drain.stats.last_error}")
        if timeout is not None and time.monotonic() - began > timeout:
            raise CheckpointError(f"{local_dir}: not drained after {timeout:g}s (another drain holds {area.root})")
        time.sleep(0.2)  # another process holds the drain lock: it drains this entry too
    click.echo(f"drained {local_dir} to {', '.join(t.url for t in targets)}")
