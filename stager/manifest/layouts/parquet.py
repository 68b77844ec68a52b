"""Parquet token shards: a token column of every shape, counted from the file's footer.

The token column (``--token-column``; by default ``tokens``, else ``input_ids``
as in the Hugging Face Hub's Parquet exports) may be a ``list``,
``large_list`` or ``fixed_size_list`` of any integer type, with any encoding
and compression (e.g. ``fixed_size_list<uint16>[2048]`` in BYTE_STREAM_SPLIT +
zstd). Its token count comes from the footer: a probe keeps the last bytes
of the file as it is hashed, and a footer larger than those is read from the
origin at the end. The manifest records the column, so the iterator reads
the same one.
"""

from __future__ import annotations

import struct

import pyarrow as pa
import pyarrow.parquet as pq

from ...errors import ManifestError
from .base import NOT_TOKENS, DatasetLayout, Probe, TokenInfo
from .columns import find_column, parquet_tokens

TAIL = 1 << 20  # bytes of a file's end kept while hashing: most footers fit


class TailProbe(Probe):
    """Keeps the last :data:`TAIL` bytes of a file."""

    def __init__(self) -> None:
        self.tail = b""
        self.size = 0

    def feed(self, data: bytes) -> None:
        self.size += len(data)
        self.tail = (self.tail + bytes(data))[-TAIL:] if len(data) < TAIL else bytes(data[-TAIL:])

    def finish(self) -> TokenInfo:  # pragma: no cover - the layout reads the tail itself
        return NOT_TOKENS


class ParquetLayout(DatasetLayout):
    """Every ``.parquet`` file of a listing."""

    name = "parquet"

    def __init__(self, store, column: str | None) -> None:
        self.store, self.column = store, column
        self.root = store.url.rstrip("/")

    def claims(self, path: str) -> bool:
        return path.endswith(".parquet")

    def probe(self, path: str, size: int) -> Probe | None:
        return TailProbe()

    async def describe(self, path: str, size: int, probe: Probe | None) -> TokenInfo:
        assert isinstance(probe, TailProbe)
        name = f"{self.root}/{path}"
        tail = probe.tail
        if len(tail) < 8 or tail[-4:] != b"PAR1":
            raise ManifestError(f"{name}: not a Parquet file (no PAR1 footer)")
        footer = struct.unpack_from("<I", tail, len(tail) - 8)[0] + 8
        if footer > size - 4:
            raise ManifestError(f"{name}: Parquet footer of {footer} bytes does not fit in {size} bytes")
        if footer > len(tail):  # a footer larger than what was kept: read it from the origin
            tail = bytes(await self.store.read_range(path, size - footer, size))
        try:
            meta = pq.read_metadata(pa.BufferReader(tail))
            found = find_column(meta.schema.to_arrow_schema(), self.column)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise ManifestError(f"{name}: not a readable Parquet file: {exc}") from exc
        if found is None:
            return NOT_TOKENS
        column, dtype = found
        return TokenInfo(dtype, parquet_tokens(meta, column), "parquet", column)
