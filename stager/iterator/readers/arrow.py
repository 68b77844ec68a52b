"""Arrow IPC stream files (``.arrow``, as Hugging Face ``save_to_disk`` writes them): the token column.

The file is memory-mapped and read as a stream of record batches without
copying a buffer; the token column's values of each batch are viewed by NumPy
in place. A file of one batch is read with no copy at all; batches are
joined into one array (one copy) otherwise, as Parquet row groups are.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from ...errors import CorruptData
from .base import ShardReader, check_tokens
from .parquet import joined


class ArrowReader(ShardReader):
    suffixes = (".arrow",)

    def __init__(self, column: str = "input_ids") -> None:
        self.column = column

    def open(self, path: Path, name: str, dtype: str | None, tokens: int) -> np.ndarray:
        try:
            # Not closed here: the arrays are views of the map, which lives as long as they do.
            reader = pa.ipc.open_stream(pa.memory_map(str(path)))
            if self.column not in reader.schema.names:
                raise CorruptData(f"{name}: has no column {self.column!r}")
            index = reader.schema.get_field_index(self.column)
            chunks = [batch.column(index) for batch in reader]
        except (pa.ArrowException, OSError) as exc:
            raise CorruptData(f"{name}: not a readable Arrow IPC stream: {exc}") from exc
        return check_tokens(joined(chunks, name, self.column, dtype), name, dtype, tokens)
