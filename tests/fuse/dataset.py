"""A small dataset with nested directories and awkward sizes, indexed in 64 KiB blocks, for mount tests."""

from __future__ import annotations

import asyncio
import io
import random
from pathlib import Path

import numpy as np

from stager.config import SourceConfig
from stager.manifest import Manifest, save_manifest
from stager.manifest.build import IndexConfig, build_manifest
from stager.store import open_store

BLOCK = 64 * 1024


def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def dataset_files(seed: int = 0) -> dict[str, bytes]:
    """Relative path -> bytes: empty, one block, many blocks with a short tail, deep paths, odd names."""
    rng = random.Random(seed)

    def data(n: int) -> bytes:
        return rng.randbytes(n)

    return {
        "README.txt": b"a dataset for mount tests\n",
        "empty.bin": b"",
        "one-block.bin": data(BLOCK),
        "train/shard-000.bin": data(7 * BLOCK + 123),
        "train/shard-001.bin": data(3 * BLOCK),
        "train/shard-002.bin": data(5 * BLOCK + 1),
        "train/nested/deep/x.dat": data(1000),
        "val/shard-000.bin": data(2 * BLOCK + 7),
        "arrays/tokens.npy.bin": _npy(np.arange(150_000, dtype=np.uint16)),
        "names/with space.txt": b"spaces\n",
        "names/\u00fcn\u00efcode-\u65e5\u672c.txt": b"unicode\n",
        "dup/same-as-one-block.bin": b"",  # filled below: the same bytes as one-block.bin (one blob)
    }


def index(root: Path, block_size: int = BLOCK) -> Manifest:
    """Hash ``root`` and write its manifest beside the data (what ``stager index`` does)."""
    async def run() -> Manifest:
        store = open_store(SourceConfig(str(root)))
        try:
            manifest = await build_manifest(store, IndexConfig(block_size=block_size, bin_dtype=None))
            await save_manifest(store, manifest)
            return manifest
        finally:
            await store.close()

    return asyncio.run(run())


def make_dataset(root: Path, *, seed: int = 0, extra: dict[str, bytes] | None = None) -> tuple[dict[str, bytes], Manifest]:
    """Write the files under ``root`` and index them; returns (path -> bytes, manifest)."""
    files = {**dataset_files(seed), **(extra or {})}
    files["dup/same-as-one-block.bin"] = files["one-block.bin"]
    for path, data in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return files, index(root)
