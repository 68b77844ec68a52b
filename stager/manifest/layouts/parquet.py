"""Parquet token shards: a token column of every shape, counted from the file's footer.

The token column (``--token-column``; by default ``tokens``, else ``input_ids``
as in the Hugging Face Hub's Parquet exports) may be a ``list``,
``large_list`` or ``fixed_size_list`` of any integer type, with any encoding
and compression (e.g. ``fixed_size_list<uint16>[2048]`` in BYTE_STREAM_SPLIT +
zstd). Its token count comes from the footer: a probe keeps the last bytes
of the file as it is hashed, and a footer larger than those is read from the
origin at the end. The manifest records the column, so the iterator reads
the same one.

A token file's column is also decoded once, here, into the flat token stream
the iterator maps (codec ``parquet-tokens``, :mod:`.decoded`): the manifest
records its size and digest, and the iterator decodes the file once into the
cache instead of at every open. So the probe keeps the whole file as it is
hashed (one file per concurrent hash in memory, as a compressed MDS shard's
probe does), and the decoding runs on a thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import struct

import pyarrow as pa
import pyarrow.parquet as pq

from ...errors import CorruptData, ManifestError
from .base import NOT_TOKENS, DatasetLayout, Probe, TokenInfo
from .columns import find_column, parquet_tokens
from .decoded import DecodedMeasure, decoded_tokens

TAIL = 1 << 20  # bytes of a file's end kept while hashing: most footers fit


class FileProbe(Probe):
    """Keeps the bytes of a file as they are hashed (its footer is at its end; its column is decoded)."""

    def __init__(self) -> None:
        self.data = bytearray()

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def tail(self) -> bytes:
        """The last :data:`TAIL` bytes."""
        return bytes(self.data[-TAIL:])

    def feed(self, data: bytes) -> None:
        self.data += data

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
        return FileProbe()

    async def describe(self, path: str, size: int, probe: Probe | None) -> TokenInfo:
        assert isinstance(probe, FileProbe)
        name = f"{self.root}/{path}"
        tail = probe.tail
        if len(tail) < 8 or tail[-4:] != b"PAR1":
            raise ManifestError(f"{name}: not a Parquet file (no PAR1 footer)")
        footer = struct.unpack_from("<I", tail, len(tail) - 8)[0] + 8
        if footer > size - 4:
            raise ManifestError(f"{name}: Parquet footer of {footer} bytes does not fit in {size} bytes")
        if footer > len(tail):  # a footer larger than the tail
            tail = bytes(probe.data[-footer:]) if probe.size == size else \
                bytes(await self.store.read_range(path, size - footer, size))
        try:
            meta = pq.read_metadata(pa.BufferReader(tail))
            found = find_column(meta.schema.to_arrow_schema(), self.column)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise ManifestError(f"{name}: not a readable Parquet file: {exc}") from exc
        if found is None:
            return NOT_TOKENS
        column, dtype = found
        tokens = parquet_tokens(meta, column)
        if probe.size != size:  # not fed the whole file (a caller that hashes without probing): no decoding
            return TokenInfo(dtype, tokens, "parquet", column)
        data, probe.data = probe.data, bytearray()
        measure = await asyncio.to_thread(_measure, data, name, column, dtype)
        if measure.tokens != tokens:
            raise ManifestError(f"{name}: column {column!r} holds {measure.tokens} tokens, its footer counts {tokens}")
        return TokenInfo(dtype, tokens, "parquet", column, "parquet-tokens", measure.size,
                         measure.digest.hexdigest())


def _measure(data: bytearray, name: str, column: str, dtype: str) -> DecodedMeasure:
    """Size, digest and token count of the decoded form of a Parquet file's token column.

    Raises:
        ManifestError: the column cannot be decoded (names the file).
    """
    measure = DecodedMeasure()
    try:
        for values in decoded_tokens("parquet-tokens", memoryview(data), name, column, dtype):
            measure.update(values)
    except CorruptData as exc:
        raise ManifestError(str(exc)) from exc
    return measure
