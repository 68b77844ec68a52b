"""``stager index SOURCE``: hash every shard and write the manifest beside the data."""

from __future__ import annotations

import asyncio

import click

from ..config import DEFAULT_BLOCK_SIZE, RetryConfig
from ..event_loop import run_async
from ..manifest import MANIFEST_PATH, load_manifest_data, save_manifest
from ..manifest.build import AUTO, TOKEN_DTYPES, IndexConfig, build_manifest, list_selected, plain_bin_files
from ..manifest.layouts import FORMATS
from ..progress import byte_progress
from ..store import open_store
from . import cli
from .options import BLOCK_SIZE, SECONDS, source_config, storage_option_flag


@cli.command("index")
@click.argument("source")
@storage_option_flag()
@click.option("--block-size", type=BLOCK_SIZE, default=DEFAULT_BLOCK_SIZE, envvar="STAGER_BLOCK_SIZE",
              show_default="1MiB",
              help="Block size for per-block digests (the unit of verification and of ranged reads).")
@click.option("--include", multiple=True, metavar="GLOB", help="Only paths matching a glob (repeatable).")
@click.option("--exclude", multiple=True, metavar="GLOB", help="Leave out paths matching a glob (repeatable).")
@click.option("--dtype", type=click.Choice((AUTO,) + TOKEN_DTYPES + ("none",)), default=AUTO, show_default=True,
              envvar="STAGER_DTYPE",
              help="Token dtype of flat .bin shards. 'auto': uint16 where a file's size is a whole number of "
                   "uint16 tokens, else a plain file (model weights, say); a dtype given outright must fit every "
                   ".bin file; 'none': .bin files are not token shards.")
@click.option("--token-column", default="tokens", show_default=True, envvar="STAGER_TOKEN_COLUMN",
              help="Column holding tokens in Parquet and Arrow shards ('tokens' also finds 'input_ids').")
@click.option("--format", "layout", type=click.Choice(FORMATS), default="auto", show_default=True,
              envvar="STAGER_FORMAT",
              help="The dataset's layout: found from its index files (auto), or this one, which must be there.")
@click.option("--concurrency", type=click.IntRange(1, 1024), default=16, envvar="STAGER_CONCURRENCY",
              show_default=True, help="Block reads in flight.")
@click.option("--retry-deadline", type=SECONDS, default=RetryConfig().deadline, show_default=True,
              envvar="STAGER_RETRY_DEADLINE",
              help="Seconds (finite, > 0) one read (a block, the manifest) may take across all its retries.")
@click.option("--dry-run", is_flag=True, help="Hash and summarise, but do not write the manifest.")
@click.option("--allow-empty", is_flag=True,
              help="Write an empty manifest when SOURCE holds no files (else that is an error: a typo in the URL?).")
@click.option("--check", is_flag=True, help="Only load and validate the existing manifest, and summarise it.")
def index_command(source: str, storage_option: tuple[str, ...], block_size: int, include: tuple[str, ...],
                  exclude: tuple[str, ...], dtype: str, token_column: str, layout: str, concurrency: int,
                  retry_deadline: float, dry_run: bool, allow_empty: bool, check: bool) -> None:
    """Hash every file under SOURCE and write SOURCE/.stager/manifest.parquet atomically.

    SOURCE is any fsspec URL (s3://bucket/prefix, gs://..., file:///path) or a local path.
    The manifest carries the digest of its own bytes; --check verifies it and every entry.
    """
    retry = RetryConfig(deadline=retry_deadline, request_timeout=min(RetryConfig().request_timeout, retry_deadline))
    config = IndexConfig(block_size=block_size, include=include, exclude=exclude,
                         bin_dtype=None if dtype == "none" else dtype, token_column=token_column,
                         layout=layout, concurrency=concurrency, allow_empty=allow_empty)

    async def run() -> None:
        store = open_store(source_config(source, storage_option), retry=retry, concurrency=concurrency)
        if check:
            try:
                loaded = await load_manifest_data(store)
            finally:
                await store.close()
            assert loaded is not None
            manifest = loaded.manifest
            tokens = int(manifest.tokens[manifest.tokens > 0].sum())
            sealed = ("digest verified" if loaded.sealed else
                      f"legacy format, not self-verifying (run `stager index {source}` again to add its digest)")
            click.echo(f"{store.url.rstrip('/')}/{MANIFEST_PATH}: valid, {len(manifest)} files, "
                       f"{manifest.total_bytes:,} bytes, {tokens:,} tokens, blocks of {manifest.block_size:,} bytes; "
                       f"{sealed}")
            return
        try:
            objects = await list_selected(store, config)  # refusals before the progress line starts
            with byte_progress("hashing") as progress:
                manifest = await build_manifest(store, config, objects=objects, on_listed=progress.set_total,
                                                on_bytes=progress.advance)
            if not dry_run:
                await save_manifest(store, manifest)
        finally:
            await store.close()
        where = "not written (dry run)" if dry_run else f"{store.url.rstrip('/')}/{MANIFEST_PATH}"
        token_shards = int((manifest.tokens >= 0).sum())
        layouts = sorted({layout for layout in manifest.layouts if layout})
        read_as = f" ({', '.join(layouts)})" if layouts else ""
        click.echo(f"indexed {len(manifest)} files, {manifest.total_bytes:,} bytes, {token_shards} token shards"
                   f"{read_as}; manifest {where}")
        plain = plain_bin_files(manifest) if config.bin_dtype == AUTO else []
        if plain:
            click.echo(f"note: {len(plain)} .bin file(s) are not whole uint16 tokens and are plain files, not token "
                       f"shards (the iterator refuses them): {', '.join(plain[:3])}{', ...' if len(plain) > 3 else ''}")

    run_async(run())
