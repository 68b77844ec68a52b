"""Building a manifest by hashing every file under a source (``stager index``).

Files are listed once, filtered by ``--include``/``--exclude`` globs (the
manifest's own folder is always left out), then hashed in parallel: each file
is read in order, block by block, with a few blocks read ahead, so every byte
crosses the network once and feeds both the whole-file and the block digests.
Token metadata is filled in by format: ``.bin`` shards take the dtype given
(their token count is size / itemsize), ``.npy`` shards are read from their
header. Parquet files, and layouts with index files of their own (Megatron,
Hugging Face Arrow, ...), are found and described by :mod:`.layouts`.
"""

from __future__ import annotations

import asyncio
import fnmatch
import io
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..config import DEFAULT_BLOCK_SIZE
from ..errors import ConfigError, ManifestError, OriginError
from ..hashing import StreamHasher, block_range
from . import MANIFEST_DIR
from .layouts import find_layouts
from .model import Manifest, ShardEntry

TOKEN_DTYPES = ("uint16", "uint32", "int32", "int64", "uint8")


@dataclass(frozen=True, slots=True)
class IndexConfig:
    """What ``stager index`` hashes and how."""

    block_size: int = DEFAULT_BLOCK_SIZE
    include: Sequence[str] = ()
    exclude: Sequence[str] = ()
    bin_dtype: str | None = "uint16"  # dtype of flat .bin token shards; None: not token shards
    token_column: str = "tokens"  # the default also finds Hugging Face's input_ids
    layout: str = "auto"  # --format: which layout to look for (stager.manifest.layouts.FORMATS)
    concurrency: int = 16  # block reads in flight across all files
    read_ahead: int = 4  # blocks read ahead within one file

    def __post_init__(self) -> None:
        if self.bin_dtype is not None and self.bin_dtype not in TOKEN_DTYPES:
            raise ConfigError(f"dtype {self.bin_dtype!r} is not one of {', '.join(TOKEN_DTYPES)}")
        if not 4096 <= self.block_size <= 1 << 30:
            raise ConfigError(f"block size must be in 4KiB..1GiB, got {self.block_size}")


def selected(path: str, config: IndexConfig) -> bool:
    """Whether ``path`` belongs in the manifest under the include/exclude globs."""
    if path == MANIFEST_DIR or path.startswith(MANIFEST_DIR + "/"):
        return False
    if config.include and not any(fnmatch.fnmatchcase(path, g) for g in config.include):
        return False
    return not any(fnmatch.fnmatchcase(path, g) for g in config.exclude)


async def build_manifest(
    store,
    config: IndexConfig = IndexConfig(),
    *,
    on_listed: Callable[[int, int], None] | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> Manifest:
    """Hash every selected file of ``store`` and return its manifest (not yet saved).

    Args:
        store: a :class:`stager.store.Store` rooted at the dataset.
        config: globs, block size, token dtype, parallelism.
        on_listed: called once with (file count, total bytes) after listing.
        on_bytes: called with each block's size as it is hashed.

    Raises:
        OriginError: listing or reading failed beyond the retry budget.
        ManifestError: a file changed size while it was read, or nothing matched.
    """
    objects = [o for o in await store.list() if selected(o.path, config)]
    layouts = await find_layouts(store, {o.path: o.size for o in objects}, config.layout, config.token_column)
    if on_listed:
        on_listed(len(objects), sum(o.size for o in objects))
    gate = asyncio.Semaphore(config.concurrency)

    async def read_block(path: str, size: int, index: int) -> bytes:
        start, end = block_range(index, size, config.block_size)
        async with gate:
            return await store.read_range(path, start, end)

    async def hash_one(obj) -> ShardEntry:
        hasher = StreamHasher(config.block_size)
        nblocks = -(-obj.size // config.block_size)
        probe = layouts.probe(obj.path, obj.size)
        pending: list[asyncio.Task[bytes]] = []
        head = b""
        try:
            for index in range(nblocks):
                while len(pending) < config.read_ahead and index + len(pending) < nblocks:
                    pending.append(asyncio.ensure_future(read_block(obj.path, obj.size, index + len(pending))))
                data = await pending.pop(0)
                hasher.update(data)
                if probe is not None:
                    probe.feed(data)
                if index == 0:
                    head = data[:4096]
                if on_bytes:
                    on_bytes(len(data))
        finally:
            for task in pending:
                task.cancel()
        digest, blocks = hasher.finish()
        if hasher.size != obj.size:
            raise ManifestError(f"{store.url}/{obj.path}: size changed while indexing ({obj.size} -> {hasher.size})")
        info = await layouts.describe(obj.path, obj.size, probe)
        if info is not None:
            return ShardEntry(obj.path, obj.size, digest, tuple(blocks), info.dtype, info.tokens, obj.mtime,
                              info.layout, info.column)
        dtype, tokens = token_info(obj.path, obj.size, head, config)
        return ShardEntry(obj.path, obj.size, digest, tuple(blocks), dtype, tokens, obj.mtime)

    try:
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(hash_one(o)) for o in objects]
    except* (ManifestError, OriginError) as group:  # one file's failure, reported as one error
        first = group.exceptions[0]
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None
    return Manifest.from_entries((t.result() for t in tasks), config.block_size)


def token_info(path: str, size: int, head: bytes, config: IndexConfig) -> tuple[str | None, int | None]:
    """The token dtype and count of a flat or ``.npy`` shard, from its name and its first bytes."""
    if path.endswith(".bin") and config.bin_dtype:
        itemsize = np.dtype(config.bin_dtype).itemsize
        if size % itemsize:
            raise ManifestError(f"{path}: {size} bytes is not a whole number of {config.bin_dtype} tokens")
        return config.bin_dtype, size // itemsize
    if path.endswith(".npy"):
        return _npy_info(path, head)
    return None, None


def _npy_info(path: str, head: bytes) -> tuple[str | None, int | None]:
    try:
        buf = io.BytesIO(head)
        version = np.lib.format.read_magic(buf)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _fortran, dtype = read_header(buf)
    except (ValueError, OSError) as exc:
        raise ManifestError(f"{path}: not a readable .npy file: {exc}") from exc
    if dtype.name not in TOKEN_DTYPES or dtype.byteorder == ">":
        return None, None
    return dtype.name, int(np.prod(shape))
