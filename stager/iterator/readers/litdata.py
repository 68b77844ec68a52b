"""LitData ``TokensLoader`` chunks: flat tokens after the chunk's header, memory-mapped (no copy).

A chunk is ``num_items`` (u32), ``num_items + 1`` offsets (u32), then the
items; with ``TokensLoader`` the items are raw tokens, so the tokens are the
file from byte ``(num_items + 2) * 4`` on, as litdata itself maps them.
"""

from __future__ import annotations

import struct

import numpy as np

from ...errors import CorruptData, ManifestError
from .base import ShardReader, Source, as_buffer, check_tokens


class LitDataReader(ShardReader):
    suffixes = ()  # chosen by the manifest's layout only: a chunk's suffix is .bin

    def open(self, source: Source, name: str, dtype: str | None, tokens: int) -> np.ndarray:
        if dtype is None:
            raise ManifestError(f"{name}: a LitData chunk needs a dtype in the manifest")
        mapped = as_buffer(source, name)
        if len(mapped) < 4:
            raise CorruptData(f"{name}: {len(mapped)} bytes is too short for a LitData chunk header")
        start = (struct.unpack_from("<I", mapped, 0)[0] + 2) * 4
        if start > len(mapped):
            raise CorruptData(f"{name}: its header says {start} bytes, the file has {len(mapped)}")
        array = np.frombuffer(mapped, dtype=np.dtype(dtype).newbyteorder("<"), offset=start)
        if not array.dtype.isnative:  # big-endian hosts only
            array = array.astype(array.dtype.newbyteorder("="))
        return check_tokens(array, name, dtype, tokens)
