"""The in-memory manifest: one Arrow table, columns rather than a million objects.

A manifest of a million shards must load in well under a second, so the
manifest keeps the Parquet file's Arrow table as it is and hands out
:class:`ShardEntry` values only when asked for one. Columns:

========  ========================  ==============================================
path      string                    relative, '/'-separated, validated
size      int64                     bytes
digest    fixed_size_binary(16)     xxh3-128 of the whole shard (the blob's name)
blocks    list<uint64>              xxh3-64 of each ``block_size`` block
dtype     string, nullable          token dtype for token shards (uint16, ...)
tokens    int64, nullable           token count for token shards
mtime     float64, nullable         seconds since the epoch, from the origin
layout    string, optional          how a token shard is read (:data:`LAYOUTS`)
column    string, optional          the token column of Parquet / Arrow shards
codec     string, optional          a compressed shard's codec (:data:`CODECS`), or how its
                                    token column is decoded (``parquet-tokens``, ``arrow-tokens``)
raw_size  int64, optional           a compressed shard's decompressed size (a decoded one's: its
                                    flat tokens' bytes)
raw_digest fixed_size_binary(16),   xxh3-128 of a compressed shard's decompressed bytes (a
          optional                  decoded one's flat tokens)
========  ========================  ==============================================

``layout`` and ``column`` are optional: a manifest written before they existed
(or one without any shard that needs them) lacks them, and then every shard
is read by its file name's suffix, as before. A token shard's layout tells
the iterator which reader opens it: a Megatron ``.bin`` is read as flat
tokens with the dtype from its ``.idx``, a Hugging Face ``.arrow`` file by its
token column, and so on.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa

try:  # the kernel itself: see filled()
    from pyarrow._compute import call_function
except ImportError:  # pragma: no cover - a pyarrow that moved it
    from pyarrow.compute import call_function

from ..codecs import CODECS as CODEC_NAMES, DECODED, stored_dtype
from ..config import DEFAULT_BLOCK_SIZE

#: The format stager writes: version 2 carries its own digest (see :mod:`.seal`).
FORMAT_VERSION = 2
#: The format of earlier versions, without a digest: still read, judged by the structural checks alone.
LEGACY_FORMAT_VERSION = 1

SCHEMA = pa.schema(
    [
        pa.field("path", pa.string(), nullable=False),
        pa.field("size", pa.int64(), nullable=False),
        pa.field("digest", pa.binary(16), nullable=False),
        pa.field("blocks", pa.list_(pa.uint64()), nullable=False),
        pa.field("dtype", pa.string()),
        pa.field("tokens", pa.int64()),
        pa.field("mtime", pa.float64()),
    ]
)

#: Columns a manifest may carry or lack (older manifests lack them): read when present.
OPTIONAL_FIELDS = (
    pa.field("layout", pa.string()),
    pa.field("column", pa.string()),
    pa.field("codec", pa.string()),
    pa.field("raw_size", pa.int64()),
    pa.field("raw_digest", pa.binary(16)),
)

#: What the ``layout`` column may say: the format the iterator reads a token shard as.
LAYOUTS = frozenset({"flat", "npy", "parquet", "arrow", "megatron", "litdata", "mds"})
#: What the ``codec`` column may say: the codecs stager decompresses, by the layouts' own names (and
#: ``zstd-batch``, ``zstd-sample``: LitData's zstd frames inside a chunk; ``litdata-pytree``: an
#: uncompressed LitData PyTreeLoader chunk's size words taken out; ``parquet-tokens``,
#: ``arrow-tokens``: a token column decoded into flat tokens).
CODECS = frozenset(CODEC_NAMES) | frozenset(DECODED)


def filled(column: pa.ChunkedArray | pa.Array, value: object) -> pa.ChunkedArray | pa.Array:
    """``column`` with ``value`` in place of its nulls, through the compute kernel: ``fill_null``
    imports pyarrow.compute, whose wrappers cost a command's start-up 30 to 60 ms (see validate.py)."""
    return call_function("coalesce", [column, pa.scalar(value, column.type)])


def attach_optional(table: pa.Table, source: pa.Table) -> pa.Table:
    """``table`` with the optional columns of ``source`` that it holds, cast to their types."""
    for field in OPTIONAL_FIELDS:
        if field.name in source.schema.names and field.name not in table.schema.names:
            column = source.column(field.name)
            if column.type != field.type:
                column = column.cast(field.type)
            table = table.append_column(field, column)
    return table


@dataclass(frozen=True, slots=True)
class ShardEntry:
    """One shard of a dataset as the manifest describes it."""

    path: str
    size: int
    digest: str  # xxh3-128, 32 lowercase hex digits
    blocks: tuple[int, ...]  # xxh3-64 of each block
    dtype: str | None = None
    tokens: int | None = None
    mtime: float | None = None
    layout: str | None = None  # a token shard's reader (LAYOUTS); None: by its suffix
    column: str | None = None  # the token column of a Parquet / Arrow shard
    codec: str | None = None  # a compressed shard's codec (CODECS); None: read as it is
    raw_size: int | None = None  # a compressed shard's decompressed size
    raw_digest: str | None = None  # xxh3-128 of its decompressed bytes, 32 lowercase hex digits


class Manifest:
    """A validated dataset manifest (see :func:`stager.manifest.load_manifest`).

    Build one from entries with :meth:`from_entries`; read one with
    ``load_manifest``. Index access is by position: ``manifest[i]``.
    """

    __slots__ = ("table", "block_size", "__dict__")

    def __init__(self, table: pa.Table, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        self.table = table
        self.block_size = block_size

    @classmethod
    def from_entries(cls, entries: Iterable[ShardEntry], block_size: int = DEFAULT_BLOCK_SIZE) -> "Manifest":
        rows = sorted(entries, key=lambda e: e.path)
        table = pa.table(
            {
                "path": [e.path for e in rows],
                "size": [e.size for e in rows],
                "digest": [bytes.fromhex(e.digest) for e in rows],
                "blocks": [list(e.blocks) for e in rows],
                "dtype": [e.dtype for e in rows],
                "tokens": [e.tokens for e in rows],
                "mtime": [e.mtime for e in rows],
            },
            schema=SCHEMA,
        )
        for field in OPTIONAL_FIELDS:  # only when some shard needs them: older readers never see them
            values = [getattr(e, field.name) for e in rows]
            if field.name == "raw_digest":
                values = [None if v is None else bytes.fromhex(v) for v in values]
            if any(v is not None for v in values):
                table = table.append_column(field, pa.array(values, field.type))
        return cls(table, block_size)

    def __len__(self) -> int:
        return self.table.num_rows

    def __getitem__(self, index: int) -> ShardEntry:
        if not -len(self) <= index < len(self):
            raise IndexError(index)
        index %= len(self)
        return ShardEntry(
            path=self.paths[index],
            size=int(self.sizes[index]),
            digest=self.digest(index),
            blocks=tuple(self.block_digests(index)),
            dtype=self.dtypes[index],
            tokens=None if self.tokens[index] < 0 else int(self.tokens[index]),
            mtime=None if np.isnan(self.mtimes[index]) else float(self.mtimes[index]),
            layout=self.layouts[index],
            column=self.columns[index],
            codec=self.codecs[index],
            raw_size=None if self.codecs[index] is None else int(self.raw_sizes[index]),
            raw_digest=self.raw_digest(index),
        )

    def __iter__(self) -> Iterator[ShardEntry]:
        for i in range(len(self)):
            yield self[i]

    @cached_property
    def paths(self) -> list[str]:
        return self.table.column("path").to_pylist()

    @cached_property
    def sizes(self) -> np.ndarray:
        return self.table.column("size").to_numpy()

    @cached_property
    def dtypes(self) -> list[str | None]:
        return self.table.column("dtype").to_pylist()

    @cached_property
    def tokens(self) -> np.ndarray:
        """Token counts, -1 where the shard is not a token shard."""
        return filled(self.table.column("tokens"), -1).to_numpy()

    @cached_property
    def layouts(self) -> list[str | None]:
        """Each shard's layout (None: read by its suffix), from the optional ``layout`` column."""
        return self._optional("layout")

    @cached_property
    def columns(self) -> list[str | None]:
        """Each shard's token column (None: the reader's default), from the optional ``column`` column."""
        return self._optional("column")

    @cached_property
    def codecs(self) -> list[str | None]:
        """Each shard's codec (None: not compressed), from the optional ``codec`` column."""
        return self._optional("codec")

    @cached_property
    def raw_sizes(self) -> np.ndarray:
        """Each compressed shard's decompressed size, -1 where the shard is not compressed."""
        if "raw_size" not in self.table.schema.names:
            return np.full(len(self), -1, np.int64)
        return filled(self.table.column("raw_size"), -1).to_numpy()

    def stored_dtype(self, index: int) -> str | None:
        """The dtype shard ``index``'s tokens are held in where the iterator reads them: the manifest's,
        or for a decoded token column (:data:`stager.codecs.DECODED`) the narrower form its ``raw_size``
        says (:func:`stager.codecs.stored_dtype`; validated when the manifest loads)."""
        dtype = self.dtypes[index]
        if dtype is None or self.codecs[index] not in DECODED:
            return dtype
        return stored_dtype(dtype, int(self.tokens[index]), int(self.raw_sizes[index]))

    def raw_digest(self, index: int) -> str | None:
        """The xxh3-128 hex digest of compressed shard ``index``'s decompressed bytes (None: not compressed)."""
        if "raw_digest" not in self.table.schema.names:
            return None
        value = self.table.column("raw_digest")[index].as_py()
        return None if value is None else value.hex()

    def _optional(self, name: str) -> list:
        if name in self.table.schema.names:
            return self.table.column(name).to_pylist()
        return [None] * len(self)

    @cached_property
    def mtimes(self) -> np.ndarray:
        return filled(self.table.column("mtime"), np.nan).to_numpy()

    @cached_property
    def _digests(self) -> np.ndarray:
        col = self.table.column("digest").combine_chunks()
        return np.frombuffer(col.buffers()[1], dtype=np.uint8)[col.offset * 16 : (col.offset + len(col)) * 16].reshape(-1, 16)

    def digest(self, index: int) -> str:
        """The xxh3-128 hex digest of shard ``index`` (its blob name in the cache)."""
        return self._digests[index].tobytes().hex()

    @cached_property
    def _blocks(self) -> tuple[np.ndarray, np.ndarray]:
        col = self.table.column("blocks").combine_chunks()
        offsets = col.offsets.to_numpy()
        values = col.values.to_numpy()
        return offsets, values

    def block_digests(self, index: int) -> Sequence[int]:
        """The xxh3-64 digests of shard ``index``'s blocks."""
        offsets, values = self._blocks
        return values[offsets[index] : offsets[index + 1]].tolist()

    @cached_property
    def _by_path(self) -> dict[str, int]:
        return {p: i for i, p in enumerate(self.paths)}

    def index_of(self, path: str) -> int:
        """Position of the shard at ``path``; raises KeyError when absent."""
        return self._by_path[path]

    @property
    def total_bytes(self) -> int:
        return int(self.sizes.sum()) if len(self) else 0

    def filter(self, mask: Sequence[bool] | np.ndarray) -> "Manifest":
        """A manifest of the shards where ``mask`` is true."""
        return Manifest(self.table.filter(pa.array(np.asarray(mask, dtype=bool))), self.block_size)
