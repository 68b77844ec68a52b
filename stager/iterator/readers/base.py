"""The reader interface: a verified cache file in, its tokens as one flat array out."""

from __future__ import annotations

import abc
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
