"""Shard readers, one per format, chosen by the shard's file name.

==========  ===================================  =====================================
suffix      reader                               tokens as
==========  ===================================  =====================================
.bin        :class:`~.flat.FlatReader`           memory map, dtype from the manifest
.npy        :class:`~.npy.NpyReader`             memory map after the .npy header
.parquet    :class:`~.parquet.ParquetReader`     Arrow buffers of the token list column
==========  ===================================  =====================================

Readers only ever get a complete cache file (what a plan's ``ready``
returns), never a partial one, as the memory map the iterator checked against
the blob's digest before handing it over (:mod:`stager.cache.reader`). A new format is a new module
with a :class:`ShardReader` and a line in :func:`reader_for`.
"""

from __future__ import annotations

from .base import ShardReader, check_tokens
from .flat import FlatReader
from .npy import NpyReader
from .parquet import ParquetReader
from ...errors import ConfigError


def reader_for(name: str, *, token_column: str = "tokens") -> ShardReader:
    """The reader for the shard at ``name`` (its path in the dataset).

    Raises:
        ConfigError: no reader knows the file's suffix.
    """
    for reader in (FlatReader(), NpyReader(), ParquetReader(token_column)):
        if name.endswith(reader.suffixes):
            return reader
    raise ConfigError(f"{name}: no token reader for this file type (known: .bin, .npy, .parquet)")


__all__ = ["FlatReader", "NpyReader", "ParquetReader", "ShardReader", "check_tokens", "reader_for"]
