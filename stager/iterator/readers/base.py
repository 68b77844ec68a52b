"""The reader interface: a verified cache file (mapped) in, its tokens as one flat array out."""

from __future__ import annotations

import abc
import mmap
from pathlib import Path

import numpy as np

from ...cache.reader import prefer_large_pages
from ...errors import CorruptData

#: What a reader opens: the bytes of a whole shard file (a read-only memory map the iterator checked),
#: or a path, mapped here unchecked.
Source = Path | memoryview | bytes


def map_file(path: Path, name: str) -> memoryview | bytes:
    """A read-only memory map of ``path`` (empty files map to ``b""``), not checked against any digest.

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


def as_buffer(source: Source, name: str) -> memoryview | bytes:
    """The bytes of ``source``: a buffer as it is, a path memory-mapped."""
    if isinstance(source, (memoryview, bytes)):
        return source
    return map_file(Path(source), name)


class ShardReader(abc.ABC):
    """Opens the tokens of one shard format.

    ``open`` gets the bytes of a complete, verified cache file (the
    iterator's checked memory map of it, see :mod:`stager.cache.reader`; or
    a path) and what the manifest says of it; it returns a 1-D array of every
    token of the shard, zero-copy where the format allows (views of the
    map), and checks that the file holds what the manifest promised.
    """

    suffixes: tuple[str, ...] = ()

    @abc.abstractmethod
    def open(self, source: Source, name: str, dtype: str | None, tokens: int) -> np.ndarray:
        """The shard's tokens.

        Args:
            source: the verified cache file's bytes (a read-only map), or its path.
            name: the shard's path in the dataset (for error messages).
            dtype: the token dtype the manifest records (None if it records none).
            tokens: the token count the manifest records.

        Raises:
            CorruptData: the file does not hold ``tokens`` tokens of ``dtype`` (names the shard).
        """


class ColumnReader(ShardReader):
    """A reader of formats that keep tokens in a named column (Parquet, Arrow, MDS); which one is set per
    dataset, else the format's own usual name (:attr:`default_column`)."""

    default_column = "tokens"

    def __init__(self, column: str | None = None) -> None:
        self.column = column or self.default_column


def check_tokens(array: np.ndarray, name: str, dtype: str | None, tokens: int) -> np.ndarray:
    """``array`` if it is 1-D with the manifest's count (and dtype, when one is recorded)."""
    if array.ndim != 1:
        raise CorruptData(f"{name}: tokens are not a flat array (shape {array.shape})")
    if len(array) != tokens:
        raise CorruptData(f"{name}: holds {len(array)} tokens, the manifest says {tokens}")
    if dtype is not None and array.dtype.name != dtype:
        raise CorruptData(f"{name}: tokens are {array.dtype.name}, the manifest says {dtype}")
    return array


__all__ = ["ColumnReader", "ShardReader", "Source", "as_buffer", "check_tokens", "map_file", "prefer_large_pages"]
