"""Arrow IPC files (``.arrow``: streams, as Hugging Face ``save_to_disk`` writes them, or the file format): the token column.

The file's memory map (the one the iterator checked, see
:mod:`stager.cache.reader`) is read as a stream of record batches without
copying a buffer (:func:`~stager.manifest.layouts.decoded.arrow_chunks`, the
batches the index's decoded form holds too); the token column's values of
each batch are viewed by NumPy in place. A file of one batch is read with no
copy at all; batches are joined into one array (one copy) otherwise, as
Parquet row groups are. A manifest that records the file's decoded form
(codec ``arrow-tokens``) has the iterator map that instead, with no join.
"""

from __future__ import annotations

import numpy as np

from ...manifest.layouts.decoded import arrow_chunks
from .base import ColumnReader, Source, as_buffer, check_tokens
from .parquet import joined


class ArrowReader(ColumnReader):
    suffixes = (".arrow",)
    default_column = "input_ids"

    def open(self, source: Source, name: str, dtype: str | None, tokens: int) -> np.ndarray:
        # Not closed here: the arrays are views of the map, which lives as long as they do.
        chunks = list(arrow_chunks(as_buffer(source, name), name, self.column))
        return check_tokens(joined(chunks, name, self.column, dtype), name, dtype, tokens)
