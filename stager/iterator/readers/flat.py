"""Flat token files (``.bin``): raw little-endian integers, dtype from the manifest.

The file's memory map is viewed as an array: no copy, no read until a sample
touches a page (the iterator's check has touched them all once already). The
map stays valid even if the cache evicts the file (POSIX keeps unlinked files
alive while mapped), and it is unmapped when the last array viewing it goes
away, never earlier.
"""

from __future__ import annotations

import numpy as np

from ...errors import ManifestError
from .base import ShardReader, Source, as_buffer, check_tokens, map_file

__all__ = ["FlatReader", "map_file"]


class FlatReader(ShardReader):
    suffixes = (".bin",)

    def open(self, source: Source, name: str, dtype: str | None, tokens: int) -> np.ndarray:
        if dtype is None:
            raise ManifestError(f"{name}: a flat token file needs a dtype in the manifest (stager index --dtype)")
        array = np.frombuffer(as_buffer(source, name), dtype=np.dtype(dtype).newbyteorder("<"))
        if not array.dtype.isnative:  # big-endian hosts only
            array = array.astype(array.dtype.newbyteorder("="))
        return check_tokens(array, name, dtype, tokens)
