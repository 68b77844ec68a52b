"""Building a manifest by hashing every file under a source (``stager index``).

Files are listed once, filtered by ``--include``/``--exclude`` globs (the
manifest's own folder is always left out), then hashed in parallel: each file
is read in order, block by block, with a few blocks read ahead, each read
feeding both the whole-file and the block digests. Only bytes something
vouches for are recorded (the origin's MD5, or two reads that agree; see
:mod:`.object_hash`), so a body corrupted in transit is retried, never taken
for the dataset's truth.
Token metadata is filled in by format: ``.bin`` shards take the dtype given
(their token count is size / itemsize; by default, ``auto``, uint16 where the
size is a whole number of them, else the file is a plain file, no tokens),
``.npy`` shards are read from their header. Parquet files, and layouts with
index files of their own (Megatron, Hugging Face Arrow, ...), are found and
described by :mod:`.layouts`.
"""

from __future__ import annotations

import asyncio
import fnmatch
import io
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..config import DEFAULT_BLOCK_SIZE
from ..errors import ConfigError, ManifestError, first_error
from . import MANIFEST_DIR
from .layouts import find_layouts
from .model import Manifest, ShardEntry
from .object_hash import hash_object, reads_expected

TOKEN_DTYPES = ("uint16", "uint32", "int32", "int64", "uint8")
#: ``bin_dtype`` meaning: a ``.bin`` file is a token shard of :data:`AUTO_BIN_DTYPE` if its size
#: allows, else a plain file. A folder of model weights then indexes, stages and mounts as is
#: (the iterator refuses its ``.bin`` files by name), and a token folder gets its token counts.
AUTO = "auto"
AUTO_BIN_DTYPE = "uint16"


@dataclass(frozen=True, slots=True)
class IndexConfig:
    """What ``stager index`` hashes and how."""

    block_size: int = DEFAULT_BLOCK_SIZE
    include: Sequence[str] = ()
    exclude: Sequence[str] = ()
    bin_dtype: str | None = AUTO  # dtype of flat .bin token shards; None: not token shards; AUTO: see above
    token_column: str = "tokens"  # the default also finds Hugging Face's input_ids
    layout: str = "auto"  # --format: which layout to look for (stager.manifest.layouts.FORMATS)
    concurrency: int = 16  # block reads in flight across all files
    read_ahead: int = 4  # blocks read ahead within one file
    allow_empty: bool = False  # an empty manifest when nothing is found (else ManifestError: a typo in the URL?)

    def __post_init__(self) -> None:
        if self.bin_dtype is not None and self.bin_dtype not in TOKEN_DTYPES + (AUTO,):
            raise ConfigError(f"dtype {self.bin_dtype!r} is not one of {', '.join(TOKEN_DTYPES + (AUTO,))}")
        if not 4096 <= self.block_size <= 1 << 30:
            raise ConfigError(f"block size must be in 4KiB..1GiB, got {self.block_size}")


def selected(path: str, config: IndexConfig) -> bool:
    """Whether ``path`` belongs in the manifest under the include/exclude globs."""
    if path == MANIFEST_DIR or path.startswith(MANIFEST_DIR + "/"):
        return False
    if config.include and not any(fnmatch.fnmatchcase(path, g) for g in config.include):
        return False
    return not any(fnmatch.fnmatchcase(path, g) for g in config.exclude)


async def list_selected(store, config: IndexConfig = IndexConfig()) -> list:
    """The objects of ``store`` that ``config`` selects, checked before any byte is read.

    Raises:
        OriginError: listing failed beyond the retry budget.
        ManifestError: nothing is selected (unless ``config.allow_empty``): a typo in the URL is
            no empty dataset; or a ``.bin`` file does not fit a dtype given outright.
    """
    listed = await store.list()
    objects = [o for o in listed if selected(o.path, config)]
    if not objects and not config.allow_empty:
        why = f"{len(listed)} listed, none selected by --include/--exclude" if listed else "nothing there"
        raise ManifestError(f"{store.url}: no files to index ({why}); check the URL, or give --allow-empty "
                            "to write an empty manifest")
    if config.bin_dtype not in (None, AUTO):  # a dtype given outright: every .bin must fit it
        itemsize = np.dtype(config.bin_dtype).itemsize
        for obj in objects:
            if obj.path.endswith(".bin") and obj.size % itemsize:
                raise ManifestError(f"{store.url.rstrip('/')}/{obj.path}: {obj.size} bytes is not a whole number "
                                    f"of {config.bin_dtype} tokens (--dtype {AUTO} indexes such files as plain "
                                    "files, --dtype none every .bin file)")
    return objects


async def build_manifest(
    store,
    config: IndexConfig = IndexConfig(),
    *,
    objects: Sequence | None = None,
    on_listed: Callable[[int, int], None] | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> Manifest:
    """Hash every selected file of ``store`` and return its manifest (not yet saved).

    Args:
        store: a :class:`stager.store.Store` rooted at the dataset.
        config: globs, block size, token dtype, parallelism.
        objects: what :func:`list_selected` returned, if the caller listed already.
        on_listed: called once with (file count, total bytes) after listing.
        on_bytes: called with each block's size as it is read (see :mod:`.object_hash`).

    Raises:
        OriginError: listing or reading failed beyond the retry budget.
        ManifestError: a file changed size while it was read, or nothing matched (unless ``allow_empty``).
    """
    if objects is None:
        objects = await list_selected(store, config)
    layouts = await find_layouts(store, {o.path: o.size for o in objects}, config.layout, config.token_column)
    if on_listed:  # the bytes to read: twice those of objects nothing vouches for
        on_listed(len(objects), sum(o.size * reads_expected(store, o) for o in objects))
    gate = asyncio.Semaphore(config.concurrency)

    async def hash_one(obj) -> ShardEntry:
        hashed = await hash_object(store, obj, config.block_size, gate=gate, read_ahead=config.read_ahead,
                                   new_probe=lambda: layouts.probe(obj.path, obj.size), on_bytes=on_bytes)
        info = await layouts.describe(obj.path, obj.size, hashed.probe)
        if info is not None:
            return ShardEntry(obj.path, obj.size, hashed.digest, hashed.blocks, info.dtype, info.tokens, obj.mtime,
                              info.layout, info.column, info.codec, info.raw_size, info.raw_digest)
        dtype, tokens = token_info(obj.path, obj.size, hashed.head, config)
        return ShardEntry(obj.path, obj.size, hashed.digest, hashed.blocks, dtype, tokens, obj.mtime)

    try:
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(hash_one(o)) for o in objects]
    except BaseExceptionGroup as group:  # report the error that stopped the index, not a group of them
        raise first_error(group) from None
    return Manifest.from_entries((t.result() for t in tasks), config.block_size)


def plain_bin_files(manifest: Manifest) -> list[str]:
    """The ``.bin`` files of ``manifest`` recorded as plain files (no token count)."""
    return [p for p, t in zip(manifest.paths, manifest.tokens.tolist()) if t < 0 and p.endswith(".bin")]


def token_info(path: str, size: int, head: bytes, config: IndexConfig) -> tuple[str | None, int | None]:
    """The token dtype and count of a flat or ``.npy`` shard, from its name and its first bytes."""
    if path.endswith(".bin") and config.bin_dtype:
        dtype = AUTO_BIN_DTYPE if config.bin_dtype == AUTO else config.bin_dtype
        itemsize = np.dtype(dtype).itemsize
        if size % itemsize:
            if config.bin_dtype == AUTO:
                return None, None  # not tokens: a plain file
            raise ManifestError(f"{path}: {size} bytes is not a whole number of {dtype} tokens")
        return dtype, size // itemsize
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
