"""``stager demo``: generate, index, and stage a dataset through a faulty local origin."""

from __future__ import annotations

from pathlib import Path

import click

from ..event_loop import run_async
from . import cli


@cli.command("demo")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), default=Path("demo-data"),
              show_default=True, help="Where the generated dataset and the cache go.")
@click.option("--shards", type=click.IntRange(1, 10_000), default=24, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the data and of the faults.")
def demo_command(directory: Path, shards: int, seed: int) -> None:
    """Run the main job on a generated dataset: index it, stage it through a slow, faulty origin, verify."""
    from ..demo import DemoConfig, run_demo

    run_async(run_demo(DemoConfig(directory=directory, shards=shards, seed=seed), click.echo))
