"""Arrow IPC files (``.arrow``: streams, as Hugging Face ``save_to_disk`` writes them, or the file format): the token column.

The file's memory map (the one the iterator checked, see
:mod:`stager.cache.reader`) is read as a stream of record batches without
copying a buffer; the token column's values of each batch are viewed by NumPy
in place. A file of one batch is read with no copy at all; batches are
joined into one array (one copy) otherwise, as Parquet row groups are.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ...errors import CorruptData
from .base import ColumnReader, Source, as_buffer, check_tokens
from .parquet import joined


class ArrowReader(ColumnReader):
    suffixes = (".arrow",)
    default_column = "input_ids"

    def open(self, source: Source, name: str, dtype: str | None, tokens: int) -> np.ndarray:
        try:
            # Not closed here: the arrays are views of the map, which lives as long as they do.
            source = pa.BufferReader(pa.py_buffer(as_buffer(source, name)))
            if source.read(6) == b"ARROW1":  # the IPC file format (Feather v2), not a stream
                source.seek(0)
                file = pa.ipc.open_file(source)
                schema, batches = file.schema, (file.get_batch(i) for i in range(file.num_record_batches))
            else:
                source.seek(0)
                stream = pa.ipc.open_stream(source)
                schema, batches = stream.schema, stream
            if self.column not in schema.names:
                raise CorruptData(f"{name}: has no column {self.column!r}")
            index = schema.get_field_index(self.column)
            chunks = [batch.column(index) for batch in batches]
        except (pa.ArrowException, OSError) as exc:
            raise CorruptData(f"{name}: not a readable Arrow IPC stream: {exc}") from exc
        return check_tokens(joined(chunks, name, self.column, dtype), name, dtype, tokens)
