"""``stager status`` and ``stager verify``: what the cache holds, and a scrub of it."""

from __future__ import annotations

import json

import click
from rich.table import Table

from ..cache import CacheTier
from ..errors import StagerError
from . import cli
from .cache_options import cache_config, cache_flags
from .progress import console


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


@cli.command("status")
@cache_flags
@click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout instead of a table.")
def status_command(cache_dir: str, capacity: str, as_json: bool) -> None:
    """Show what the cache holds: capacity, use, and each dataset's blobs (complete and partial)."""
    cache = CacheTier(cache_config(cache_dir, capacity))
    try:
        usage = cache.usage()
        datasets = cache.datasets()
    finally:
        cache.close()
    if as_json:
        click.echo(json.dumps({
            "cache": str(cache.directory),
            "capacity": usage.capacity, "used": usage.used, "free": usage.free,
            "complete_blobs": usage.complete, "partial_blobs": usage.partial,
            "datasets": [{"name": d.name, "blobs": d.blobs, "bytes": d.bytes, "complete": d.complete,
                          "partial": d.partial, "complete_bytes": d.complete_bytes} for d in datasets],
        }, sort_keys=True))
        return
    click.echo(f"cache {cache.directory}: {_size(usage.used)} used of {_size(usage.capacity)} "
               f"({usage.complete} complete blobs, {usage.partial} partial)")
    table = Table("dataset", "shards", "size", "complete", "partial", "staged")
    for d in datasets:
        share = d.complete_bytes / d.bytes if d.bytes else 1.0
        table.add_row(d.name, f"{d.blobs:,}", _size(d.bytes), f"{d.complete:,}", f"{d.partial:,}", f"{share:.0%}")
    if datasets:
        console.print(table)


@cli.command("verify")
@cache_flags
@click.option("--sample", type=click.FloatRange(0.0, 1.0, min_open=True), default=None,
              help="Re-hash only this share of the blobs (e.g. 0.1); default: all.")
@click.option("--no-repair", is_flag=True, help="Only report; do not drop blobs that fail.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
def verify_command(cache_dir: str, capacity: str, sample: float | None, no_repair: bool, as_json: bool) -> None:
    """Re-hash the cache against the recorded block digests; drop what fails so it is fetched again.

    Dropped blobs are fetched again (and verified) by the next `stager stage` or by the
    consumer that next needs them. Exits 1 when anything failed verification.
    """
    cache = CacheTier(cache_config(cache_dir, capacity))
    try:
        report = cache.verify(sample=sample, repair=not no_repair)
    finally:
        cache.close()
    if as_json:
        click.echo(json.dumps({
            "blobs_checked": report.blobs_checked, "blocks_checked": report.blocks_checked,
            "bytes_checked": report.bytes_checked, "repaired": report.repaired,
            "bad": [{"digest": b.digest, "state": b.state.name.lower(), "bad_blocks": list(b.bad_blocks),
                     "reason": b.reason} for b in report.bad],
        }, sort_keys=True))
    else:
        click.echo(f"verified {report.blobs_checked:,} blobs, {report.blocks_checked:,} blocks, "
                   f"{_size(report.bytes_checked)}: {len(report.bad)} bad"
                   + ("; dropped, they will be fetched again" if report.bad and report.repaired else ""))
        for bad in report.bad[:20]:
            click.echo(f"  {bad.digest}: {bad.reason}, blocks {list(bad.bad_blocks)[:10]}")
    if report.bad:
        raise StagerError(f"{len(report.bad)} blob(s) in {cache_dir} failed verification"
                          + (" and were dropped" if report.repaired else ""))
