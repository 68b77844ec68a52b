"""Token columns of Parquet and Arrow data: which shapes hold tokens, and how many.

A token column is a list of integers per row (a document, or a fixed-length
sequence): ``list``, ``large_list`` or ``fixed_size_list`` of any integer
type. Its tokens, for stager, are the values of every row in order: the rows
concatenated, as flat shards are. A null row holds no tokens (like an empty
one); a null token id inside a row is corrupt data. The index (counting from
a Parquet footer or an Arrow stream's batches) and the reader (flattening the
column) share these rules, so the count the manifest records is the count the
reader finds.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ...errors import CorruptData

#: Integer types a token column may hold (NumPy names, as the manifest's dtype column says them).
INTEGER_DTYPES = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64")

#: The column tried when none is named: stager's own, then Hugging Face's.
DEFAULT_COLUMNS = ("tokens", "input_ids")


def candidates(column: str | None) -> tuple[str, ...]:
    """The column names to look for: the one named, or both defaults when it is the default."""
    if column is None or column == DEFAULT_COLUMNS[0]:
        return DEFAULT_COLUMNS
    return (column,)


def token_dtype(field_type: pa.DataType) -> str | None:
    """The token dtype of a column of ``field_type``, or None when it is no list of integers."""
    if not (pa.types.is_list(field_type) or pa.types.is_large_list(field_type)
            or pa.types.is_fixed_size_list(field_type)):
        return None
    value_type = field_type.value_type
    if not pa.types.is_integer(value_type):
        return None
    name = str(value_type)
    return name if name in INTEGER_DTYPES else None


def find_column(schema: pa.Schema, column: str | None) -> tuple[str, str] | None:
    """(column name, dtype) of the token column of ``schema``, or None if it has none."""
    for name in candidates(column):
        if name in schema.names:
            dtype = token_dtype(schema.field(name).type)
            return (name, dtype) if dtype is not None else None
    return None


def flat_values(array: pa.Array, name: str, column: str) -> np.ndarray:
    """Every token id of one chunk of a token column, rows concatenated (zero-copy where Arrow allows).

    Raises:
        CorruptData: the column is no list of integers, or holds null token ids (names the shard).
    """
    if token_dtype(array.type) is None:
        raise CorruptData(f"{name}: column {column!r} is {array.type}, not a list of integer token ids")
    try:
        # Offsets from the file are untrusted: Arrow would read past its buffers (or abort) on bad ones.
        array.validate(full=True)
    except (pa.ArrowException, ValueError) as exc:
        raise CorruptData(f"{name}: column {column!r} is corrupt: {exc}") from exc
    values = array.flatten()
    if values.null_count:
        raise CorruptData(f"{name}: column {column!r} has null token ids")
    return values.to_numpy(zero_copy_only=True)


def parquet_tokens(meta, column: str) -> int:
    """Token count of ``column`` in a Parquet file, from its footer (``meta``: FileMetaData).

    The leaf column's ``num_values`` counts a level for every empty or null row
    too; its statistics count only the values present, so they are used when
    the writer recorded them.
    """
    leaf = next(i for i in range(meta.num_columns) if meta.schema.column(i).path.split(".")[0] == column)
    total = 0
    for group in range(meta.num_row_groups):
        chunk = meta.row_group(group).column(leaf)
        stats = chunk.statistics
        if stats is not None and stats.has_null_count:
            total += chunk.num_values - stats.null_count
        else:
            total += chunk.num_values
    return total
