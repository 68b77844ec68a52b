"""Parquet token files: a list column of token ids (``tokens`` by default), one row per document.

The file's memory map is read as an Arrow buffer and only the token column
is decoded; the flattened list values of each row group are Arrow buffers viewed by NumPy
without a copy. Parquet pages are compressed, so decoding produces those
buffers once per open; several row groups are joined into one array.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ...errors import CorruptData
from .base import ShardReader, Source, as_buffer, check_tokens


class ParquetReader(ShardReader):
    suffixes = (".parquet",)

    def __init__(self, column: str = "tokens") -> None:
        self.column = column

    def open(self, source: Source, name: str, dtype: str | None, tokens: int) -> np.ndarray:
        try:
            table = pq.read_table(pa.BufferReader(pa.py_buffer(as_buffer(source, name))), columns=[self.column])
        except (pa.ArrowException, OSError, KeyError) as exc:
            raise CorruptData(f"{name}: cannot read column {self.column!r}: {exc}") from exc
        column = table.column(self.column)
        if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
            raise CorruptData(f"{name}: column {self.column!r} is {column.type}, not a list of token ids")
        if column.null_count:
            raise CorruptData(f"{name}: column {self.column!r} has null documents")
        parts = []
        for chunk in column.chunks:
            values = chunk.flatten()
            if values.null_count:
                raise CorruptData(f"{name}: column {self.column!r} has null token ids")
            parts.append(values.to_numpy(zero_copy_only=True))
        if not parts:
            array = np.zeros(0, np.dtype(dtype or "uint32"))
        else:
            array = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return check_tokens(array, name, dtype, tokens)
