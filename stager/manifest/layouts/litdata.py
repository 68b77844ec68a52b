"""LitData optimized datasets of tokens (``TokensLoader``, or ``PyTreeLoader`` items of one token leaf):
``index.json`` + ``chunk-R-I.bin``.

``index.json`` holds ``chunks: [{filename, chunk_size, chunk_bytes, dim}]`` and
``config: {data_format, compression, item_loader, ...}``. A chunk file is::

    num_items u32   offsets u32[num_items + 1]   item bytes...

and with ``TokensLoader`` every item is raw tokens (``no_header_tensor:<torch
dtype index>`` or ``no_header_numpy:<numpy type index>``), so after the header
the chunk is ``dim`` flat tokens: for stager a flat token shard that starts
past the header, memory-mapped. ``TokensLoader(block_size=B)`` cuts each chunk
into ``dim // B`` samples from its start, which is what stager's windows of
``seq_len=B`` are. Indexing checks each chunk against ``index.json`` as it is
hashed (size, item count, offsets, token count).

Chunks compressed whole (``config.compression: zstd`` with ``compression_level:
chunk``, files ``chunk-R-I.zstd.bin``) are the compressed files in the
manifest; each is decompressed once as it is indexed and checked as above
(``chunk_bytes`` is the decompressed size), see :mod:`.compressed`.

litdata's default for ``compression="zstd"`` is zstd frames inside each
``.bin`` (``compression_level: batch``, a frame table, or ``sample``, one frame
per item), which it writes only for ``PyTreeLoader`` chunks: items of one leaf
each (``no_header_tensor``/``no_header_numpy``, one document per item) read as
their documents concatenated. Those chunks are the compressed files in the
manifest too (``chunk_bytes`` is the file's size, ``dim`` is unset); indexing
checks the frame table, every offset and size word against the file and the
item count against ``chunk_size``, and their decompressed form is the
``TokensLoader`` layout of the same items, which the LitData reader maps
(codecs ``zstd-batch`` and ``zstd-sample``, :func:`stager.codecs.unframe`).

Uncompressed ``PyTreeLoader`` chunks (litdata's plain ``optimize(fn=...,
output_dir=...)`` with a function returning a token tensor or array) hold the
same items with nothing compressed: the classic header, then each item's leaf
size word and its tokens. With a size word before every item the tokens are no
one stream to map, so they take the same way as the framed chunks (codec
``litdata-pytree``): the file is the shard in the manifest (``chunk_bytes`` is
its size), indexing checks its item count against ``chunk_size``, every offset
against the file, every size word against the item it heads and every item's
tokens to be whole of the dtype, and its "decompressed" form, the size words
taken out, is the ``TokensLoader`` layout the reader maps, made once into the
cache and checked there against its digest.

Encrypted chunks are refused, and so are ``PyTreeLoader`` items of more than
one leaf (a dict of tokens and labels, say: stager reads one token stream) and
``PyTreeLoader`` chunks compressed whole (``compression_level: chunk``).
"""

from __future__ import annotations

import posixpath
import struct

import numpy as np

from ...codecs import FRAMED, LITDATA_FORMS, PYTREE, codec_name
from ...errors import ManifestError
from .base import NOT_TOKENS, IndexedLayout, Probe, TokenInfo, read_index_json
from .compressed import InflatingProbe

#: litdata.constants._TORCH_DTYPES_MAPPING, the integer entries.
TORCH_DTYPES = {11: "uint8", 12: "int8", 13: "int16", 14: "int16", 15: "int32", 16: "int32", 17: "int64",
                18: "int64", 20: "uint16"}
#: litdata.constants._NUMPY_SCTYPES, the integer entries (by position).
NUMPY_DTYPES = {0: "int8", 1: "int16", 2: "int32", 3: "int64", 4: "uint8", 5: "uint16", 6: "uint32", 7: "uint64"}


def chunk_dtype(name: str, config: dict, framed: bool = False, pytree: bool = False) -> str:
    """The token dtype of a TokensLoader dataset (or, ``framed``, a PyTreeLoader one of zstd frames;
    ``pytree``, an uncompressed PyTreeLoader one), from its ``config.data_format``."""
    formats = config.get("data_format")
    if pytree and isinstance(formats, list) and len(formats) != 1:
        raise ManifestError(f"{name}: its PyTreeLoader items hold {len(formats)} leaves ({formats!r}); stager reads "
                            f"items of one no_header_tensor or no_header_numpy leaf, the tokens")
    loaders = ("PyTreeLoader",) if framed or pytree else (None, "TokensLoader")
    if config.get("item_loader") not in loaders or not isinstance(formats, list) or len(formats) != 1:
        wanted = ("PyTreeLoader, one no_header_tensor or no_header_numpy leaf per item" if framed else
                  "TokensLoader (one no_header_tensor or no_header_numpy item)")
        raise ManifestError(f"{name}: a LitData dataset stager reads {'with zstd frames ' if framed else ''}is "
                            f"written with {wanted}; this one has {config.get('item_loader')!r} and {formats!r}")
    serializer, _, code = str(formats[0]).partition(":")
    table = {"no_header_tensor": TORCH_DTYPES, "no_header_numpy": NUMPY_DTYPES}.get(serializer)
    if table is None or not code.isdigit() or int(code) not in table:
        raise ManifestError(f"{name}: data format {formats[0]!r} is not integer tokens")
    return table[int(code)]


class ChunkProbe(Probe):
    """Checks one chunk's header against ``index.json`` as the chunk is hashed.

    ``framed``: the chunk is the TokensLoader layout made of PyTreeLoader items (zstd-framed or not),
    whose size and token count ``index.json`` does not say (its ``chunk_bytes`` is the file's, size
    words or frames and all): only the item count is checked against it, each item's tokens checked to
    be whole of the dtype, and the tokens counted.
    """

    def __init__(self, name: str, index_name: str, chunk: dict, dtype: str, framed: bool = False) -> None:
        self.name, self.index_name, self.chunk, self.dtype, self.framed = name, index_name, chunk, dtype, framed
        self.header = bytearray()
        self.size = 0

    def feed(self, data: bytes) -> None:
        self.size += len(data)
        want = (int(self.chunk["chunk_size"]) + 2) * 4
        if len(self.header) < want:
            self.header += data[:want - len(self.header)]

    def finish(self) -> TokenInfo:
        items = int(self.chunk["chunk_size"])
        itemsize = np.dtype(self.dtype).itemsize
        start = (items + 2) * 4
        if len(self.header) < start:
            raise ManifestError(f"{self.name}: {self.size} bytes, too short for the header of {items} items "
                                f"that {self.index_name} lists (truncated)")
        count = struct.unpack_from("<I", self.header, 0)[0]
        offsets = np.frombuffer(bytes(self.header), "<u4", items + 1, 4)
        if count != items:
            raise ManifestError(f"{self.name}: holds {count} items, {self.index_name} says {items}")
        if offsets[0] != start or (np.diff(offsets.astype(np.int64)) < 0).any() or offsets[-1] != self.size:
            raise ManifestError(f"{self.name}: its offsets run from {int(offsets[0])} to {int(offsets[-1])}, "
                                f"the file has {self.size} bytes and a header of {start} (truncated or corrupt)")
        if self.framed:
            if (ragged := np.flatnonzero(np.diff(offsets.astype(np.int64)) % itemsize)).size:
                n = int(ragged[0])
                raise ManifestError(f"{self.name}: item {n}'s leaf holds {int(offsets[n + 1]) - int(offsets[n])} "
                                    f"bytes, not whole {self.dtype} tokens")
            return TokenInfo(self.dtype, (self.size - start) // itemsize, "litdata")
        dim = int(self.chunk["dim"])
        if self.size != int(self.chunk["chunk_bytes"]) or (self.size - start) != dim * itemsize:
            raise ManifestError(f"{self.name}: {self.size} bytes, {self.index_name} says {self.chunk['chunk_bytes']} "
                                f"bytes holding {dim} {self.dtype} tokens")
        return TokenInfo(self.dtype, dim, "litdata")


class LitDataLayout(IndexedLayout):
    """The chunks listed by each LitData ``index.json`` of a listing."""

    name = "litdata"
    title = "LitData"

    def make_probe(self, name: str, index_name: str, entry: dict, extra: object) -> Probe:
        dtype, codec = extra  # type: ignore[misc]
        if codec is None:
            return ChunkProbe(name, index_name, entry, dtype)
        if codec in LITDATA_FORMS:  # chunk_bytes is the file's size; the decompressed size is found
            # an uncompressed chunk's item count is the file's own: its messages name the file
            inner = ChunkProbe(name if codec == PYTREE else f"{name} (decompressed)", index_name, entry, dtype,
                               framed=True)
            return InflatingProbe(name, index_name, codec, None, inner, size=int(entry["chunk_bytes"]))
        inner = ChunkProbe(f"{name} (decompressed)", index_name, entry, dtype)
        return InflatingProbe(name, index_name, codec, int(entry["chunk_bytes"]), inner)


def parse_index(name: str, data: bytes, sizes: dict[str, int], folder: str) -> dict | None:
    """A LitData ``index.json``'s content, or None when it is another layout's (MDS has one too)."""
    content = read_index_json(name, data, sizes, folder, lambda f: f.startswith("chunk-") and f.endswith(".bin"))
    if not isinstance(content, dict) or "chunks" not in content or "config" not in content:
        return None
    return content


async def find(store, sizes: dict[str, int], required: bool) -> LitDataLayout | None:
    """The LitData datasets of a listing (path -> size), each ``index.json`` checked against the files.

    Raises:
        ManifestError: a bad ``index.json``, a chunk it lists that is missing, encrypted or compressed
            in a way stager cannot read; with ``required``, no LitData ``index.json`` at all.
    """
    root = store.url.rstrip("/")
    chunks: dict[str, tuple[str, dict, tuple[str, str | None]]] = {}
    for index in (p for p in sizes if posixpath.basename(p) == "index.json"):
        name = f"{root}/{index}"
        content = parse_index(name, await store.read(index), sizes, posixpath.dirname(index))
        if content is None:
            continue
        try:
            config = content["config"]
            codec = _chunk_codec(name, config)
            if codec is None and config.get("item_loader") == "PyTreeLoader":
                codec = PYTREE  # a size word before each item's tokens, taken out once into the cache
            framed = codec in LITDATA_FORMS
            dtype = chunk_dtype(name, config, codec in FRAMED.values(), codec == PYTREE)
            for chunk in content["chunks"]:
                path = posixpath.join(posixpath.dirname(index), chunk["filename"])
                for key in ("chunk_size", "chunk_bytes") + (() if framed else ("dim",)):  # PyTreeLoader's is None
                    if not isinstance(chunk[key], int) or isinstance(chunk[key], bool) or chunk[key] < 0:
                        raise ManifestError(f"{name}: chunk {chunk['filename']!r}: {key} {chunk[key]!r} "
                                            f"is not a count")
                if path not in sizes:
                    raise ManifestError(f"{name}: lists {chunk['filename']}, which is not there")
                # litdata names a chunk it compressed whole chunk-R-I.<compression>.bin (and leaves others as they
                # are); zstd frames, or size words, are inside every chunk of a PyTreeLoader dataset
                compressed = codec is not None and (
                    framed or str(chunk["filename"]).endswith(f".{config['compression']}.bin"))
                chunks[path] = (index, chunk, (dtype, codec if compressed else None))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ManifestError(f"{name}: not a LitData index (missing or bad {exc})") from exc
    return LitDataLayout.found(root, chunks, required)


def _chunk_codec(name: str, config: dict) -> str | None:
    """The codec of a dataset's compressed chunks (whole, or zstd frames inside: :data:`FRAMED`), None if
    they are not compressed.

    Raises:
        ManifestError: encrypted chunks, a compression level or codec stager does not know.
    """
    if config.get("encryption"):
        raise ManifestError(f"{name}: encrypted LitData chunks are not supported (optimize without encryption)")
    compression = config.get("compression")
    if not compression:
        return None
    level = str(config.get("compression_level") or "chunk").strip().lower()  # unset: whole chunks, as litdata reads it
    if level in FRAMED:
        if not str(compression).startswith("zstd"):
            raise ManifestError(f"{name}: LitData compression_level {level!r} with compression {compression!r}: "
                                f"litdata writes zstd frames only")
        return FRAMED[level]
    if level != "chunk":
        raise ManifestError(f"{name}: LitData compression_level {level!r} is none of chunk, batch, sample")
    try:
        return codec_name(compression)
    except ValueError as exc:
        raise ManifestError(f"{name}: {exc}") from exc
