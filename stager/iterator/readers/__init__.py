"""Shard readers, one per format, chosen by the shard's file name.

==========  ===================================  =====================================
suffix      reader                               tokens as
==========  ===================================  =====================================
.bin        :class:`~.flat.FlatReader`           memory map, dtype from the manifest
.npy        :class:`~.npy.NpyReader`             memory map after the .npy header
.parquet    :class:`~.parquet.ParquetReader`     Arrow buffers of the token list column
.arrow      :class:`~.arrow.ArrowReader`         Arrow IPC stream, memory-mapped
==========  ===================================  =====================================

The manifest may name a shard's layout (its optional ``layout`` column, set by
``stager index`` for the layouts it recognises): then the layout chooses the
reader, whatever the suffix (a Megatron ``.bin`` is flat tokens whose dtype
came from its ``.idx``), and the manifest's ``column`` names the token column.

Readers only ever get a complete cache file (what a plan's ``ready``
returns), never a partial one, as the memory map the iterator checked against
the blob's digest before handing it over (:mod:`stager.cache.reader`). For a compressed shard (the
manifest's ``codec``) the reader gets its decompressed form instead, made once into the cache and
checked against the manifest's ``raw_digest`` (:mod:`stager.cache.inflate`). A Parquet or Arrow shard
whose manifest names a decoding (``parquet-tokens``, ``arrow-tokens``) is read the same way, its decoded
form being flat tokens: :class:`~.flat.FlatReader` maps it (:mod:`stager.manifest.layouts.decoded`); a
manifest without one keeps the column readers above. A new format is a new module
with a :class:`ShardReader` and a line in :func:`reader_for`.
"""

from __future__ import annotations

from .arrow import ArrowReader
from .base import ShardReader, check_tokens
from .flat import FlatReader
from .litdata import LitDataReader
from .mds import MdsReader
from .npy import NpyReader
from .parquet import ParquetReader
from ...codecs import DECODED
from ...errors import ConfigError


def reader_for(name: str, *, token_column: str = "tokens", layout: str | None = None,
               column: str | None = None, codec: str | None = None) -> ShardReader:
    """The reader for the shard at ``name`` (its path in the dataset).

    Args:
        name: the shard's path in the dataset.
        token_column: the token column of Parquet / Arrow shards when the manifest names none.
        layout: the shard's layout as the manifest records it (None: chosen by suffix).
        column: the token column the manifest records.
        codec: the shard's codec as the manifest records it: a token column decoding
            (:data:`stager.codecs.DECODED`) is read from its decoded form, flat tokens.

    Raises:
        ConfigError: no reader knows the layout or the file's suffix.
    """
    column = column or token_column
    if codec in DECODED:
        return FlatReader()
    if layout is not None:
        by_layout = {"flat": FlatReader, "megatron": FlatReader, "npy": NpyReader, "litdata": LitDataReader,
                     "parquet": lambda: ParquetReader(column), "arrow": lambda: ArrowReader(column),
                     "mds": lambda: MdsReader(column)}
        if layout not in by_layout:
            raise ConfigError(f"{name}: no token reader for layout {layout!r} in this stager "
                              f"(known: {', '.join(sorted(by_layout))})")
        return by_layout[layout]()
    for reader in (FlatReader(), NpyReader(), ParquetReader(column), ArrowReader(column)):
        if name.endswith(reader.suffixes):
            return reader
    raise ConfigError(f"{name}: no token reader for this file type (known: .bin, .npy, .parquet, .arrow)")


__all__ = ["ArrowReader", "FlatReader", "LitDataReader", "MdsReader", "NpyReader", "ParquetReader", "ShardReader", "check_tokens", "reader_for"]
