"""The reader interface: a verified cache file in, its tokens as one flat array out."""

from __future__ import annotations

import abc
import mmap
from pathlib import Path

import numpy as np

from ...errors import CorruptData


class ShardReader(abc.ABC):
    """Opens the tokens of one shard format.

    ``open`` gets the path of a complete, verified cache file and what the
    manifest says of it; it returns a 1-D array of every token of the shard,
    zero-copy where the format allows (a read-only memory map), and checks
    that the file holds what the manifest promised.
    """

    suffixes: tuple[str, ...] = ()

    @abc.abstractmethod
    def open(self, path: Path, name: str, dtype: str | None, tokens: int) -> np.ndarray:
        """The shard's tokens.

        Args:
            path: the verified cache file.
            name: the shard's path in the dataset (for error messages).
            dtype: the token dtype the manifest records (None if it records none).
            tokens: the token count the manifest records.

        Raises:
            CorruptData: the file does not hold ``tokens`` tokens of ``dtype`` (names the shard).
        """


def check_tokens(array: np.ndarray, name: str, dtype: str | None, tokens: int) -> np.ndarray:
    """``array`` if it is 1-D with the manifest's count (and dtype, when one is recorded)."""
    if array.ndim != 1:
        raise CorruptData(f"{name}: tokens are not a flat array (shape {array.shape})")
    if len(array) != tokens:
        raise CorruptData(f"{name}: holds {len(array)} tokens, the manifest says {tokens}")
    if dtype is not None and array.dtype.name != dtype:
        raise CorruptData(f"{name}: tokens are {array.dtype.name}, the manifest says {dtype}")
    return array


def prefer_large_pages(mapped: "mmap.mmap | None") -> None:
    """Let page faults on this map bring the file into the page cache in huge pages.

    The cache may write blobs past the page cache (``O_DIRECT``), so the first
    reader of a blob brings it in, through this map's page faults. Brought in
    that way it lands in small pages, and every later process mapping the file
    slices samples out of it up to 1.5x slower (measured) than out of a file
    brought in by a read or a write. With ``MADV_HUGEPAGE`` the faults read
    ahead in 2 MiB pages instead. Where the kernel declines (no transparent
    huge pages), nothing changes.
    """
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if mapped is None or advice is None:
        return
    try:
        mapped.madvise(advice)
    except (OSError, ValueError):
        pass
