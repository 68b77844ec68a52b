"""NumPy ``.npy`` token files: the header parsed by NumPy, the data viewed in the file's map (no copy)."""

from __future__ import annotations

import io
import math

import numpy as np
from numpy.lib import format as npy_format

from ...errors import CorruptData
from .base import ShardReader, Source, as_buffer, check_tokens

_HEADER_MAX = 1 << 16  # bytes of the file handed to the header parser (NumPy's own header limit is 10,000)


class NpyReader(ShardReader):
    suffixes = (".npy",)

    def open(self, source: Source, name: str, dtype: str | None, tokens: int) -> np.ndarray:
        data = as_buffer(source, name)
        head = io.BytesIO(bytes(memoryview(data)[:_HEADER_MAX]))
        try:
            version = npy_format.read_magic(head)
            if version == (1, 0):
                shape, fortran, found = npy_format.read_array_header_1_0(head)
            else:
                shape, fortran, found = npy_format.read_array_header_2_0(head)
        except (ValueError, OSError, EOFError, SyntaxError) as exc:
            raise CorruptData(f"{name}: not a readable .npy file: {exc}") from exc
        if found.hasobject or len(shape) != 1:
            raise CorruptData(f"{name}: a token .npy must hold a flat integer array, got {found} {shape}")
        count = math.prod(shape)
        offset = head.tell()
        if len(data) - offset != count * found.itemsize:
            raise CorruptData(f"{name}: the .npy header promises {count} items of {found}, the file holds "
                              f"{len(data) - offset} bytes of data")
        array = np.frombuffer(data, dtype=found, count=count, offset=offset)
        if not array.dtype.isnative:
            array = array.astype(array.dtype.newbyteorder("="))
        return check_tokens(array, name, dtype, tokens)
