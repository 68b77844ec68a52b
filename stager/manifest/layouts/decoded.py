"""Parquet and Arrow token columns decoded once into the flat token stream the flat reader maps.

A Parquet file's pages are encoded and compressed, and an Arrow stream's
token column comes in record batches (Hugging Face writes 1,000 rows each):
reading either as it is decodes or joins the whole column at every open of
the shard. So ``stager index`` records, for a Parquet or Arrow token shard, a
``codec`` (``parquet-tokens``, ``arrow-tokens``: :data:`stager.codecs.DECODED`)
with the size and xxh3-128 of its *decoded form*: every token of the column,
rows concatenated in order (the rules of :mod:`.columns`, which the readers of
older manifests follow too, so the tokens are the same), little-endian, of
the column's integer type, which is the manifest's dtype. The shard's blob
stays the file as the origin holds it (staged and verified as any), and the
cache keeps the decoded form as a blob of its own, made once and checked
(:mod:`stager.cache.inflate`), which the iterator then maps like a flat
``.bin``. The pieces come a row group (Parquet) or a record batch (Arrow) at
a time; a chunk of another dtype than the manifest's, a null token id or a
file pyarrow cannot read is :class:`~stager.errors.CorruptData` naming it.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from ...codecs import DECODED
from ...errors import CorruptData
from .columns import flat_values

ARROW_FILE_MAGIC = b"ARROW1"


def arrow_chunks(data: bytes | memoryview, name: str, column: str) -> Iterator[pa.Array]:
    """The token column of an Arrow IPC stream (or file, Feather v2), one record batch at a time, each a view
    of ``data`` (kept alive by the arrays).

    Raises:
        CorruptData: not a readable Arrow IPC stream or file, or no such column.
    """
    try:
        source = pa.BufferReader(pa.py_buffer(data))
        if source.read(6) == ARROW_FILE_MAGIC:
            source.seek(0)
            file = pa.ipc.open_file(source)
            schema, batches = file.schema, (file.get_batch(i) for i in range(file.num_record_batches))
        else:
            source.seek(0)
            stream = pa.ipc.open_stream(source)
            schema, batches = stream.schema, stream
        if column not in schema.names:
            raise CorruptData(f"{name}: has no column {column!r}")
        index = schema.get_field_index(column)
        for batch in batches:
            yield batch.column(index)
    except CorruptData:
        raise
    except (pa.ArrowException, OSError) as exc:
        raise CorruptData(f"{name}: not a readable Arrow IPC stream: {exc}") from exc


def parquet_chunks(data: bytes | memoryview, name: str, column: str) -> Iterator[pa.Array]:
    """The token column of a Parquet file, one row group at a time (only that column decoded).

    Raises:
        CorruptData: not a readable Parquet file, or no such column.
    """
    try:
        file = pq.ParquetFile(pa.BufferReader(pa.py_buffer(data)))
        if column not in file.schema_arrow.names:
            raise CorruptData(f"{name}: has no column {column!r}")
        for group in range(file.num_row_groups):
            yield from file.read_row_group(group, columns=[column]).column(column).chunks
    except CorruptData:
        raise
    except (pa.ArrowException, OSError, KeyError) as exc:
        raise CorruptData(f"{name}: cannot read column {column!r}: {exc}") from exc


def decoded_tokens(codec: str, data: bytes | memoryview, name: str, column: str,
                   dtype: str | None) -> Iterator[np.ndarray]:
    """The decoded form of a token shard, a chunk at a time: each chunk's tokens as a little-endian array.

    Args:
        codec: ``parquet-tokens`` or ``arrow-tokens``.
        data: the whole shard file.
        name: the shard (for messages).
        column: its token column.
        dtype: the manifest's dtype (None: the column's own, as found).

    Raises:
        CorruptData: the file cannot be read, its column holds null token ids, or tokens of another dtype.
        ValueError: ``codec`` is no decoding.
    """
    if codec not in DECODED:
        raise ValueError(f"codec {codec!r} is no token column decoding (known: {', '.join(DECODED)})")
    chunks = parquet_chunks if DECODED[codec] == "parquet" else arrow_chunks
    for chunk in chunks(data, name, column):
        values = flat_values(chunk, name, column)
        if dtype is not None and values.dtype.name != dtype:
            raise CorruptData(f"{name}: column {column!r} holds {values.dtype.name} tokens, the manifest says {dtype}")
        if len(values):
            yield values.astype(values.dtype.newbyteorder("<"), copy=False)


class DecodedMeasure:
    """Size and xxh3-128 of a decoded form, fed its chunks in order (the index's side)."""

    def __init__(self) -> None:
        self.digest = xxhash.xxh3_128()
        self.size = 0
        self.tokens = 0

    def update(self, values: np.ndarray) -> None:
        little = values.astype(values.dtype.newbyteorder("<"), copy=False)
        self.digest.update(memoryview(np.ascontiguousarray(little)).cast("B"))
        self.size += little.nbytes
        self.tokens += len(little)


__all__ = ["DecodedMeasure", "arrow_chunks", "decoded_tokens", "parquet_chunks"]
