"""LitData optimized datasets written with ``TokensLoader``: ``index.json`` + ``chunk-R-I.bin``.

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
(``chunk_bytes`` is the decompressed size), see :mod:`.compressed`. zstd frames
inside a ``.bin`` (``compression_level: batch`` or ``sample``, litdata's
default for zstd) and encrypted chunks are refused: their tokens are not one
stream stager can map.
"""

from __future__ import annotations

import posixpath
import struct

import numpy as np

from ...codecs import codec_name
from ...errors import ManifestError
from .base import NOT_TOKENS, IndexedLayout, Probe, TokenInfo, read_index_json
from .compressed import InflatingProbe

#: litdata.constants._TORCH_DTYPES_MAPPING, the integer entries.
TORCH_DTYPES = {11: "uint8", 12: "int8", 13: "int16", 14: "int16", 15: "int32", 16: "int32", 17: "int64",
                18: "int64", 20: "uint16"}
#: litdata.constants._NUMPY_SCTYPES, the integer entries (by position).
NUMPY_DTYPES = {0: "int8", 1: "int16", 2: "int32", 3: "int64", 4: "uint8", 5: "uint16", 6: "uint32", 7: "uint64"}


def chunk_dtype(name: str, config: dict) -> str:
    """The token dtype of a TokensLoader dataset, from its ``config.data_format``."""
    formats = config.get("data_format")
    if config.get("item_loader") not in (None, "TokensLoader") or not isinstance(formats, list) or len(formats) != 1:
        raise ManifestError(f"{name}: a LitData dataset stager reads is written with TokensLoader "
                            f"(one no_header_tensor or no_header_numpy item), this one has {formats!r}")
    serializer, _, code = str(formats[0]).partition(":")
    table = {"no_header_tensor": TORCH_DTYPES, "no_header_numpy": NUMPY_DTYPES}.get(serializer)
    if table is None or not code.isdigit() or int(code) not in table:
        raise ManifestError(f"{name}: data format {formats[0]!r} is not integer tokens")
    return table[int(code)]


class ChunkProbe(Probe):
    """Checks one chunk's header against ``index.json`` as the chunk is hashed."""

    def __init__(self, name: str, index_name: str, chunk: dict, dtype: str) -> None:
        self.name, self.index_name, self.chunk, self.dtype = name, index_name, chunk, dtype
        self.header = bytearray()
        self.size = 0

    def feed(self, data: bytes) -> None:
        self.size += len(data)
        want = (int(self.chunk["chunk_size"]) + 2) * 4
        if len(self.header) < want:
            self.header += data[:want - len(self.header)]

    def finish(self) -> TokenInfo:
        items, dim = int(self.chunk["chunk_size"]), int(self.chunk["dim"])
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
            dtype = chunk_dtype(name, config)
            codec = _chunk_codec(name, config)
            for chunk in content["chunks"]:
                path = posixpath.join(posixpath.dirname(index), chunk["filename"])
                for key in ("chunk_size", "chunk_bytes", "dim"):
                    if not isinstance(chunk[key], int) or isinstance(chunk[key], bool) or chunk[key] < 0:
                        raise ManifestError(f"{name}: chunk {chunk['filename']!r}: {key} {chunk[key]!r} "
                                            f"is not a count")
                if path not in sizes:
                    raise ManifestError(f"{name}: lists {chunk['filename']}, which is not there")
                # litdata names a chunk it compressed whole chunk-R-I.<compression>.bin (and leaves others as they are)
                compressed = codec is not None and str(chunk["filename"]).endswith(f".{config['compression']}.bin")
                chunks[path] = (index, chunk, (dtype, codec if compressed else None))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ManifestError(f"{name}: not a LitData index (missing or bad {exc})") from exc
    return LitDataLayout.found(root, chunks, required)


def _chunk_codec(name: str, config: dict) -> str | None:
    """The codec of a dataset's chunks compressed whole, None if they are not compressed.

    Raises:
        ManifestError: encrypted chunks, zstd frames inside the chunks, or a codec stager does not know.
    """
    if config.get("encryption"):
        raise ManifestError(f"{name}: encrypted LitData chunks are not supported (optimize without encryption)")
    compression = config.get("compression")
    if not compression:
        return None
    level = config.get("compression_level") or "chunk"
    if level != "chunk":
        raise ManifestError(f"{name}: LitData compression_level {level!r} (zstd frames inside each chunk) is not "
                            f"supported; optimize with compression_level='chunk' (whole .zstd.bin chunks) or "
                            f"without compression")
    try:
        return codec_name(compression)
    except ValueError as exc:
        raise ManifestError(f"{name}: {exc}") from exc
