"""Flat token files (``.bin``): raw little-endian integers, dtype from the manifest.

The file is memory-mapped read-only and viewed as an array: no copy, no
read until a sample touches a page. The map stays valid even if the cache
evicts the file (POSIX keeps unlinked files alive while mapped), and it is
unmapped when the last array viewing it goes away, never earlier.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np

from ...errors import CorruptData, ManifestError
from .base import ShardReader, check_tokens, prefer_large_pages


def map_file(path: Path, name: str) -> memoryview | bytes:
    """A read-only memory map of ``path`` (empty files map to ``b""``).

    Raises:
        CorruptData: the file cannot be opened (names the shard).
    """
    try:
        with open(path, "rb") as fh:
            if fh.seek(0, 2) == 0:
                return b""
            mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            prefer_large_pages(mapped)
            return memoryview(mapped)
    except OSError as exc:
        raise CorruptData(f"{name}: cannot map the cached shard {path}: {exc.strerror}") from exc


class FlatReader(ShardReader):
    suffixes = (".bin",)

    def open(self, path: Path, name: str, dtype: str | None, tokens: int) -> np.ndarray:
        if dtype is None:
            raise ManifestError(f"{name}: a flat token file needs a dtype in the manifest (stager index --dtype)")
        array = np.frombuffer(map_file(path, name), dtype=np.dtype(dtype).newbyteorder("<"))
        if not array.dtype.isnative:  # big-endian hosts only
            array = array.astype(array.dtype.newbyteorder("="))
        return check_tokens(array, name, dtype, tokens)
