"""``stager replicate SRC DST``: bulk verified copy of a dataset between two stores, resumable."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import click

from ..config import DEFAULT_BLOCK_SIZE, RetryConfig, SourceConfig, load_toml
from ..errors import ConfigError, StagerError
from ..event_loop import run_async
from ..manifest.build import AUTO, TOKEN_DTYPES, IndexConfig
from ..progress import byte_progress, stderr_console
from ..replicate import ReplicateConfig, Replicator, Shard, parse_shard, shard_from_env
from ..replicate.copier import DEFAULT_PART_SIZE
from ..replicate.replicator import MAX_PART_SIZE
from ..replicate.plan import Action
from . import cli
from .options import BLOCK_SIZE, RATE, SECONDS, SecondsType, SizeType, checked_by, parse_storage_options


def _profile(name: str | None, side: str) -> dict[str, Any]:
    """Storage options of ``[profiles.NAME]`` in the config file."""
    if not name:
        return {}
    root = click.get_current_context().find_root()
    path = root.params.get("config_path")
    if not path:
        raise ConfigError(f"--{side}-profile {name}: profiles live in the config file; give --config or STAGER_CONFIG")
    table = load_toml(path).get("profiles", {}).get(name)
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: no [profiles.{name}] table (asked for by --{side}-profile)")
    return dict(table)


def _side(url: str, profile: str | None, pairs: tuple[str, ...], side: str) -> SourceConfig:
    options = _profile(profile, side)
    flags = parse_storage_options(pairs)
    for key, value in flags.items():  # flags win; nested tables merge
        if isinstance(value, dict) and isinstance(options.get(key), dict):
            options[key] = {**options[key], **value}
        else:
            options[key] = value
    return SourceConfig(url=url, storage_options=options)


@cli.command("replicate")
@click.argument("src")
@click.argument("dst")
@click.option("--src-option", "-s", multiple=True, metavar="KEY=VALUE",
              help="fsspec storage option of the source (repeatable), e.g. -s endpoint_url=https://a.example -s key=..")
@click.option("--dst-option", "-d", multiple=True, metavar="KEY=VALUE",
              help="fsspec storage option of the destination (repeatable).")
@click.option("--src-profile", envvar="STAGER_SRC_PROFILE", metavar="NAME",
              help="Source storage options from [profiles.NAME] in the config file (flags override).")
@click.option("--dst-profile", envvar="STAGER_DST_PROFILE", metavar="NAME",
              help="Destination storage options from [profiles.NAME] in the config file.")
@click.option("--dry-run", is_flag=True, help="Print the plan (counts, bytes, sample paths) and copy nothing.")
@click.option("--delete", is_flag=True, help="Remove destination files the source does not have (never by default).")
@click.option("--trust-size", is_flag=True,
              help="Take a destination object of the right size as copied when no destination manifest or "
                   "journal vouches for it (default: read and hash it to decide).")
@click.option("--verify", is_flag=True, help="Read back every destination object and check every digest.")
@click.option("--finalize", is_flag=True,
              help="Copy nothing: check the destination (trusting shards that left a done-marker) and write "
                   "its manifest if complete.")
@click.option("--shard", envvar="STAGER_SHARD", metavar="I/N", callback=checked_by(parse_shard),
              help="Copy only shard I of N. Default: from SLURM_ARRAY_TASK_ID/SLURM_PROCID or "
                   "JOB_COMPLETION_INDEX with STAGER_SHARD_COUNT, else 0/1.")
@click.option("--state-dir", envvar="STAGER_REPLICATE_STATE", type=click.Path(file_okay=False),
              help="Local state (journal, plan). Default: $XDG_STATE_HOME/stager/replicate/<hash of SRC and DST> "
                   "(~/.local/state/stager/replicate/... without XDG_STATE_HOME).")
@click.option("--watch", is_flag=True, help="Keep replicating files of SRC as they become complete (checkpoints).")
@click.option("--interval", type=SecondsType(0.05, allow_minimum=True), default=10.0, show_default=True,
              envvar="STAGER_INTERVAL", help="--watch: seconds between listings of the source (at least 0.05).")
@click.option("--quiet-period", type=SecondsType(0, allow_minimum=True), default=60.0, show_default=True,
              envvar="STAGER_QUIET_PERIOD",
              help="--watch: seconds; a file unchanged this long counts as complete even without a marker.")
@click.option("--ready-marker", multiple=True, metavar="NAME", envvar="STAGER_READY_MARKER",
              help="--watch: file names that mark their folder complete (repeatable, or space-separated in "
                   "the variable; default: _SUCCESS, COMPLETE, commit_success.txt, .metadata).")
@click.option("--idle-exit", type=SecondsType(0, allow_minimum=True), default=None, envvar="STAGER_IDLE_EXIT",
              help="--watch: stop after this many seconds without a new complete file (default: never).")
@click.option("--concurrency", type=click.IntRange(1, 4096), default=256, envvar="STAGER_CONCURRENCY",
              show_default=True, help="The most requests in flight per side: the number in flight starts at 16 "
                                      "and follows each side (more while throughput grows, fewer on SlowDown).")
@click.option("--part-size", type=SizeType(minimum=1, maximum=MAX_PART_SIZE), default=DEFAULT_PART_SIZE,
              show_default="8MiB", envvar="STAGER_PART_SIZE",
              help="Multipart part size for large objects (whole manifest blocks, at least 5MiB; at most 5GiB).")
@click.option("--buffer", type=SizeType(minimum=1 << 20), default=128 << 20, show_default="128MiB",
              envvar="STAGER_BUFFER",
              help="Bytes held by transfers in flight (at least 1MiB): bounds memory, and what a killed run "
                   "copies again.")
@click.option("--bandwidth", type=RATE, envvar="STAGER_BANDWIDTH", default=None,
              help="Cap on each side's bandwidth in bytes per second, e.g. 500MB/s (a bare number is bytes/s); "
                   "'unlimited' or unset: no cap. 0 is refused.")
@click.option("--retry-deadline", type=SECONDS, default=RetryConfig().deadline, show_default=True,
              envvar="STAGER_RETRY_DEADLINE",
              help="Seconds (finite, > 0) one request may take across all its retries before a side counts as "
                   "down.")
@click.option("--block-size", type=BLOCK_SIZE, default=DEFAULT_BLOCK_SIZE, show_default="1MiB",
              envvar="STAGER_BLOCK_SIZE",
              help="Block size when the source has no manifest and is indexed on the fly (and for --watch).")
@click.option("--dtype", type=click.Choice((AUTO,) + TOKEN_DTYPES + ("none",)), default=AUTO, show_default=True,
              envvar="STAGER_DTYPE",
              help="When the source is indexed on the fly: the token dtype of its .bin shards, as `stager index "
                   "--dtype` (the same default).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
def replicate_command(src: str, dst: str, src_option: tuple[str, ...], dst_option: tuple[str, ...],
                      src_profile: str | None, dst_profile: str | None, dry_run: bool, delete: bool,
                      trust_size: bool, verify: bool, finalize: bool, shard: str | None, state_dir: str | None,
                      watch: bool, interval: float, quiet_period: float, ready_marker: tuple[str, ...],
                      idle_exit: float | None, concurrency: int, part_size: int, buffer: int, bandwidth: int | None,
                      retry_deadline: float, block_size: int, dtype: str, as_json: bool) -> None:
    """Copy every object of SRC's manifest to DST, verified, and write DST's manifest last.

    SRC and DST are any fsspec URLs or paths (s3://, gs://, az://, file://; https:// as a
    source only). Only what is missing or different at DST is copied; a run killed at any
    point and started again continues where it stopped. Exits 0 only when this shard's
    objects are all at DST and verified.
    """
    _lean_arrow()
    # --finalize and --watch run once, whatever array task or pod they happen to run in.
    which = parse_shard(shard) if shard else Shard() if finalize or watch else shard_from_env()
    retry = RetryConfig(deadline=retry_deadline, request_timeout=min(RetryConfig().request_timeout, retry_deadline))
    config = ReplicateConfig(
        src=_side(src, src_profile, src_option, "src"), dst=_side(dst, dst_profile, dst_option, "dst"),
        shard=which, state_dir=state_dir, dry_run=dry_run, delete=delete, trust_size=trust_size, verify=verify,
        finalize=finalize, concurrency=concurrency, part_size=part_size, buffer=buffer,
        bandwidth=bandwidth, retry=retry,
        index=IndexConfig(block_size=block_size, bin_dtype=None if dtype == "none" else dtype),
    )
    if watch:
        from ..replicate.watch import WatchConfig, watch_replicate

        if which.count != 1 or dry_run or delete or finalize:
            raise ConfigError("--watch replicates as files appear: it takes no --shard, --dry-run, --delete or --finalize")
        watch_config = WatchConfig(interval=interval, quiet_period=quiet_period,
                                   markers=tuple(ready_marker) or WatchConfig().markers, idle_exit=idle_exit,
                                   block_size=block_size)
        summary = run_async(watch_replicate(config, watch_config, on_round=None if as_json else _print_round))
        _report(summary, as_json)
        return
    replicator = Replicator(config)
    summary = run_async(_with_progress(replicator, show=not as_json and stderr_console().is_terminal))
    if dry_run and not as_json:
        _print_plan(summary)
        return
    _report(summary, as_json)


def _lean_arrow() -> None:
    """Give Arrow's freed memory back to the system while this command runs.

    pyarrow's default allocator (mimalloc) keeps what decoding and validating the
    manifest used, about twice the table itself, for the rest of the run; the
    system allocator returns it. This command decodes a manifest once or twice,
    so the allocator's speed does not matter, while its peak memory does.
    """
    import pyarrow as pa

    pa.set_memory_pool(pa.system_memory_pool())


def _report(summary: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(summary, sort_keys=True))
    else:
        click.echo(_summary_line(summary))
    if summary.get("failed"):
        raise StagerError(f"{summary['failed']} object(s) could not be replicated (first: {summary['errors'][0]})")


async def _with_progress(replicator: Replicator, *, show: bool) -> dict[str, Any]:
    if not show:
        return await replicator.run()
    with byte_progress("replicating") as bar:
        shown = 0
        total_set = False

        def refresh() -> None:
            nonlocal shown, total_set
            plan = replicator.plan_summary
            if plan is not None and not total_set:
                copies, copy_bytes = plan.to_copy
                checks, check_bytes = plan.to_check
                bar.set_total(copies + checks, copy_bytes + check_bytes)
                total_set = True
            stats = replicator.stats
            bar.advance(stats.bytes_done - shown)
            shown = stats.bytes_done
            work = plan.to_copy[0] + plan.to_check[0] if plan else 0
            retries = replicator.src_stats.retries + replicator.dst_stats.retries
            text = f"{replicator.phase}: {stats.objects_done:,}/{work:,} objects, {retries} retries"
            if stats.failed:
                text += f", {stats.failed} failed"
            bar.describe(text)

        async def tick() -> None:
            while True:
                await asyncio.sleep(0.25)
                refresh()

        ticker = asyncio.create_task(tick())
        try:
            return await replicator.run()
        finally:
            ticker.cancel()
            refresh()  # the bar ends where the run did


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"  # pragma: no cover


def _summary_line(s: dict[str, Any]) -> str:
    if "rounds" in s:  # --watch
        return (f"watched {s['source']} for {s['seconds']:.0f}s: {s['copied_objects']} file(s) replicated "
                f"({_size(s['copied_bytes'])}) in {s['rounds']} round(s); {s['pending']} not yet complete")
    parts = [f"replicated shard {s['shard']} of {s['source']} to {s['destination']}: {s['objects']:,} objects "
             f"({_size(s['bytes'])}): {s['copied_objects']:,} copied ({_size(s['copied_bytes'])}"
             + (f", {_size(s['resumed_bytes'])} resumed" if s["resumed_bytes"] else "") + "), "
             f"{s['checked_objects']:,} checked in place, {s['skipped_objects']:,} already there"]
    if s["deleted_objects"] or s["extra_objects"]:
        kept = s["extra_objects"] - s["deleted_objects"]
        parts.append(f"{s['deleted_objects']} deleted" + (f", {kept} extra kept (--delete removes them)" if kept else ""))
    parts.append(f"{s['retries']['source']}+{s['retries']['destination']} retries, "
                 f"{s['corrupt_blocks_rejected']} corrupt blocks rejected")
    if s["manifest_published"]:
        parts.append("manifest written")
    elif s["complete"]:
        parts.append("destination already complete")
    elif not s["failed"]:
        parts.append("waiting for the other shards (the last one writes the manifest)")
    parts.append(f"{s['seconds']:.1f}s, {s['mb_per_s']:.0f} MB/s")
    return "; ".join(parts)


def _print_plan(s: dict[str, Any]) -> None:
    plan = s["plan"]
    click.echo(f"plan for shard {s['shard']} of {s['source']} -> {s['destination']}: "
               f"{plan['objects']:,} objects, {_size(plan['bytes'])}")
    groups = {"copy": [], "check": [], "skip": []}
    for name, entry in plan["actions"].items():
        action = Action[name.upper()]
        key = "copy" if action.is_copy else "check" if action.is_check else "skip"
        groups[key].append((action, entry))
    for key, entries in groups.items():
        count = sum(e["objects"] for _, e in entries)
        size = sum(e["bytes"] for _, e in entries)
        click.echo(f"  {key:<6} {count:>10,} objects {_size(size):>10}")
        for action, entry in entries:
            click.echo(f"         {entry['objects']:>10,} {action.reason}")
            if key != "skip":
                for path in entry["sample"]:
                    click.echo(f"             {path}")
    verb = "delete" if s["delete"] else "keep"
    click.echo(f"  {verb:<6} {plan['extra_objects']:>10,} objects {_size(plan['extra_bytes']):>10} "
               "at the destination only" + ("" if s["delete"] else " (--delete removes them)"))
    for path in plan["extra_sample"]:
        click.echo(f"             {path}")
    if s.get("note"):
        click.echo(f"note: {s['note']}")


def _print_round(text: str) -> None:
    stderr_console().print(text)
