"""Parquet token files: a token column (``tokens`` by default) of lists of integers, one row per document.

The column may be a ``list``, ``large_list`` or ``fixed_size_list`` of any
integer type (the rules in :mod:`stager.manifest.layouts.columns`, shared
with the index). The file's memory map is read as an Arrow buffer and only
the token column is decoded; the flattened values of each row group are Arrow
buffers viewed by NumPy without a copy. Parquet pages are compressed, so decoding produces those
buffers once per open; several row groups are joined into one array.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ...errors import CorruptData
from ...manifest.layouts.columns import flat_values
from .base import ColumnReader, Source, as_buffer, check_tokens


def joined(chunks, name: str, column: str, dtype: str | None) -> np.ndarray:
    """The tokens of every chunk of a token column, rows concatenated (no copy for a single chunk)."""
    parts = [part for part in (flat_values(chunk, name, column) for chunk in chunks) if len(part)]
    if not parts:
        return np.zeros(0, np.dtype(dtype or "uint32"))
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


class ParquetReader(ColumnReader):
    suffixes = (".parquet",)

    def open(self, source: Source, name: str, dtype: str | None, tokens: int) -> np.ndarray:
        try:
            table = pq.read_table(pa.BufferReader(pa.py_buffer(as_buffer(source, name))), columns=[self.column])
        except (pa.ArrowException, OSError, KeyError) as exc:
            raise CorruptData(f"{name}: cannot read column {self.column!r}: {exc}") from exc
        return check_tokens(joined(table.column(self.column).chunks, name, self.column, dtype), name, dtype, tokens)
