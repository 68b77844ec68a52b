"""Writing token shards and their manifest (used by the demo, tests and benchmarks).

Three shard formats, each a flat sequence of token ids:

- ``bin``: raw little-endian integers (uint16 or uint32), the format most
  tokenizer pipelines emit; the dtype lives in the manifest.
- ``npy``: a NumPy array file (header + little-endian data).
- ``parquet``: a table with a ``tokens`` list column, one row per document.

Shards are written to a temporary name and renamed, the manifest is computed
from the bytes in memory as they are written (no second read) and saved last,
atomically, so a reader never sees a manifest for shards that are not there.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Iterable, Literal, Sequence

import numpy as np

from .config import DEFAULT_BLOCK_SIZE
from .errors import ConfigError
from .hashing import StreamHasher
from .manifest import MANIFEST_PATH, Manifest, ShardEntry, encode_manifest

ShardFormat = Literal["bin", "npy", "parquet"]
FORMATS: tuple[str, ...] = ("bin", "npy", "parquet")


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def encode_shard(tokens: np.ndarray, fmt: ShardFormat, *, doc_len: int = 4096) -> bytes:
    """The bytes of one shard holding ``tokens`` (1-D) in format ``fmt``."""
    tokens = np.ascontiguousarray(tokens)
    if tokens.ndim != 1:
        raise ConfigError(f"token arrays must be 1-D, got shape {tokens.shape}")
    little = tokens.astype(tokens.dtype.newbyteorder("<"), copy=False)
    if fmt == "bin":
        return little.tobytes()
    if fmt == "npy":
        buf = io.BytesIO()
        np.save(buf, little, allow_pickle=False)
        return buf.getvalue()
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        offsets = np.append(np.arange(0, len(little), doc_len), len(little)).astype(np.int32)
        column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(little))
        buf = io.BytesIO()
        pq.write_table(pa.table({"tokens": column}), buf, compression="zstd")
        return buf.getvalue()
    raise ConfigError(f"unknown shard format {fmt!r} (choose from {', '.join(FORMATS)})")


def write_token_shards(
    directory: str | os.PathLike[str],
    shards: Iterable[np.ndarray],
    *,
    fmt: ShardFormat = "bin",
    prefix: str = "shard",
    block_size: int = DEFAULT_BLOCK_SIZE,
    names: Sequence[str] | None = None,
) -> Manifest:
    """Write one shard per array under ``directory`` and the manifest beside them.

    Args:
        directory: local folder (created if missing).
        shards: 1-D integer arrays (uint16 or uint32 for ``bin``).
        fmt: ``bin``, ``npy`` or ``parquet``.
        prefix: file names are ``{prefix}-{i:05d}.{fmt}`` unless ``names`` are given
            (relative paths, may contain folders).
        block_size: the manifest's block size.

    Returns:
        The manifest that was saved at ``directory/.stager/manifest.parquet``.
    """
    root = Path(directory)
    entries = []
    for i, tokens in enumerate(shards):
        tokens = np.asarray(tokens)
        if tokens.dtype.name not in ("uint16", "uint32", "int32", "int64", "uint8"):
            raise ConfigError(f"shard {i}: token dtype {tokens.dtype} is not supported")
        name = names[i] if names is not None else f"{prefix}-{i:05d}.{fmt}"
        data = encode_shard(tokens, fmt)
        _atomic_write(root / name, data)
        hasher = StreamHasher(block_size)
        hasher.update(data)
        digest, blocks = hasher.finish()
        entries.append(ShardEntry(name, len(data), digest, tuple(blocks), tokens.dtype.name, int(tokens.size),
                                  os.stat(root / name).st_mtime))
    manifest = Manifest.from_entries(entries, block_size)
    _atomic_write(root / MANIFEST_PATH, encode_manifest(manifest))
    return manifest


def generate_corpus(
    directory: str | os.PathLike[str],
    *,
    shards: int = 8,
    tokens_per_shard: int = 1 << 20,
    vocab: int = 50257,
    fmt: ShardFormat = "bin",
    seed: int = 0,
    block_size: int = DEFAULT_BLOCK_SIZE,
    jitter: float = 0.25,
) -> Manifest:
    """Write a synthetic token corpus (random ids, shard lengths varied by ``jitter``) and its manifest."""
    rng = np.random.default_rng(seed)
    dtype = np.uint16 if vocab <= 1 << 16 else np.uint32
    lengths = (tokens_per_shard * (1 + jitter * (rng.random(shards) * 2 - 1))).astype(np.int64).clip(1)
    arrays = (rng.integers(0, vocab, n, dtype=dtype) for n in lengths)
    return write_token_shards(directory, arrays, fmt=fmt, block_size=block_size)
