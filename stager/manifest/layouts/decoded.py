"""Parquet and Arrow token columns decoded once into the flat token stream the flat reader maps.

A Parquet file's pages are encoded and compressed, and an Arrow stream's
token column comes in record batches (Hugging Face writes 1,000 rows each):
reading either as it is decodes or joins the whole column at every open of
the shard. So ``stager index`` records, for a Parquet or Arrow token shard, a
``codec`` (``parquet-tokens``, ``arrow-tokens``: :data:`stager.codecs.DECODED`)
with the size and xxh3-128 of its *decoded form*: every token of the column,
rows concatenated in order (the rules of :mod:`.columns`, which the readers of
older manifests follow too, so the tokens are the same), little-endian, of
the column's integer type, which is the manifest's dtype, or *stored narrower*
(:func:`stager.codecs.stored_dtype`): a tokenizer's ``input_ids`` are ``int32`` or ``int64``
while most vocabularies fit 16 bits, so when every token of a shard lies in
``[0, 2**16)`` (or, for 64-bit columns, ``[0, 2**32)``) the decoded form holds
them as ``uint16`` (``uint32``), and the manifest's ``raw_size`` of two (four)
bytes a token says so. The iterator still yields the manifest's dtype; the
narrower form halves (or quarters) what the cache holds and what every warm
read and first-map check goes through. The shard's blob
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

from ...codecs import DECODED, NARROW_FORMS, stored_dtype
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


def narrowest(values: np.ndarray) -> np.dtype:
    """The narrowest of ``values``' own dtype and :data:`NARROW_FORMS` that holds every one of them."""
    if values.size and values.dtype.kind in "iu":
        low, high = int(values.min()), int(values.max())
        for form in NARROW_FORMS:
            if form.itemsize < values.dtype.itemsize and low >= 0 and high <= np.iinfo(form).max:
                return form
    return values.dtype.newbyteorder("<")


def decoded_tokens(codec: str, data: bytes | memoryview, name: str, column: str,
                   dtype: str | None, stored: str | None = None) -> Iterator[np.ndarray]:
    """The decoded form of a token shard, a chunk at a time: each chunk's tokens as a little-endian array.

    Args:
        codec: ``parquet-tokens`` or ``arrow-tokens``.
        data: the whole shard file.
        name: the shard (for messages).
        column: its token column.
        dtype: the manifest's dtype (None: the column's own, as found).
        stored: the dtype of the decoded form (:func:`stager.codecs.stored_dtype`; None: ``dtype``): tokens are
            narrowed to it, and a token that does not fit is corrupt data.

    Raises:
        CorruptData: the file cannot be read, its column holds null token ids, tokens of another dtype,
            or a token that does not fit the stored form.
        ValueError: ``codec`` is no decoding.
    """
    if codec not in DECODED:
        raise ValueError(f"codec {codec!r} is no token column decoding (known: {', '.join(DECODED)})")
    chunks = parquet_chunks if DECODED[codec] == "parquet" else arrow_chunks
    for chunk in chunks(data, name, column):
        values = flat_values(chunk, name, column)
        if dtype is not None and values.dtype.name != dtype:
            raise CorruptData(f"{name}: column {column!r} holds {values.dtype.name} tokens, the manifest says {dtype}")
        if not len(values):
            continue
        if stored is not None and stored != values.dtype.name:
            form = np.dtype(stored).newbyteorder("<")
            if narrowest(values).itemsize > form.itemsize:
                raise CorruptData(f"{name}: column {column!r} holds tokens outside {stored}, the form its "
                                  f"manifest says it is stored in")
            yield values.astype(form)
        else:
            yield values.astype(values.dtype.newbyteorder("<"), copy=False)


class DecodedMeasure:
    """Size and xxh3-128 of a decoded form, fed its chunks in order (the index's side).

    The form is the narrowest that holds every token (:func:`narrowest`): the tokens are hashed in
    their own width and, while all of them fit, in each narrower form too; :attr:`size` and
    :attr:`digest` are the narrowest form's once every chunk is in.
    """

    def __init__(self) -> None:
        self.tokens = 0
        self._width: np.dtype | None = None  # the column's own dtype, little-endian
        self._forms: dict[np.dtype, "xxhash.xxh3_128"] = {}  # the forms still possible, and their digests

    def update(self, values: np.ndarray) -> None:
        if self._width is None:
            self._width = values.dtype.newbyteorder("<")
            self._forms = {self._width: xxhash.xxh3_128()}
            self._forms.update((form, xxhash.xxh3_128()) for form in NARROW_FORMS
                               if form.itemsize < self._width.itemsize and self._width.kind in "iu")
        fits = narrowest(values).itemsize
        for form in [f for f in self._forms if f != self._width and f.itemsize < fits]:
            del self._forms[form]  # a token of this chunk does not fit it
        for form, digest in self._forms.items():
            digest.update(memoryview(np.ascontiguousarray(values.astype(form, copy=False))).cast("B"))
        self.tokens += len(values)

    @property
    def _form(self) -> np.dtype | None:
        return min(self._forms, key=lambda f: f.itemsize) if self._forms else None

    @property
    def size(self) -> int:
        form = self._form
        return 0 if form is None else self.tokens * form.itemsize

    @property
    def digest(self) -> "xxhash.xxh3_128":
        form = self._form
        return xxhash.xxh3_128() if form is None else self._forms[form]


__all__ = ["DecodedMeasure", "NARROW_FORMS", "arrow_chunks", "decoded_tokens", "narrowest", "parquet_chunks",
           "stored_dtype"]
