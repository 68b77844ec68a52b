"""The compression codecs of the shard formats stager reads in place: a whole compressed shard in, its
decompressed bytes out, piece by piece.

MosaicML Streaming compresses whole MDS shards (``compression: zstd``, ``zstd:7``, ``gz``, ``bz2``,
``br``, ``snappy``) and LitData whole chunks (``compression: zstd`` with ``compression_level:
chunk``); each file is one stream of its codec. stager keeps the compressed bytes as the shard's blob
(staged and verified like any other) and the decompressed form beside it (:mod:`stager.cache.inflate`).
The codecs are pyarrow's (a dependency already): zstd, gzip, bz2 and brotli stream, so decompressing
a shard holds a piece of it in memory, not the whole; snappy (a block format without a stream) is
decompressed in one piece of its known size.

A codec is named as the layout names it; the level after ``:`` only mattered to the writer.

LitData's default for ``compression="zstd"`` keeps zstd frames inside a ``.bin`` chunk instead
(``compression_level: batch``: a frame table after the magic ``LDFZ01``, one frame per
``compression_batch_size`` items; ``sample``: the classic chunk header, each item its own frame), and
writes it only for ``PyTreeLoader`` chunks, whose items each start with a u32 per leaf giving the
leaf's size. The manifest names those two ``zstd-batch`` and ``zstd-sample`` (:data:`FRAMED`), and
their decompressed form is not the chunk's own bytes but what stager's LitData reader maps: the
``TokensLoader`` layout of the same items (``num_items``, ``num_items + 1`` offsets, then each item's
one leaf, its tokens, back to back), see :func:`unframe`. Every offset, frame and size word is checked
against the file on the way, frame by frame, so a truncated chunk or a frame table that disagrees is
refused, never read past.

One more LitData name, :data:`PYTREE` (``litdata-pytree``): an uncompressed ``PyTreeLoader`` chunk,
litdata's plain ``optimize()`` without compression, the classic chunk header and each item its one leaf
after the leaf's u32 size word. Nothing is compressed, but the tokens are not one stream either: its
"decompressed" form is the same ``TokensLoader`` layout, the size words taken out, each checked against
the item it heads (:func:`unframe`). :data:`LITDATA_FORMS` are the three names whose decompressed form
is that layout.

Two more names a manifest's ``codec`` may say, :data:`DECODED`: ``parquet-tokens`` and ``arrow-tokens``,
a Parquet file's or an Arrow IPC stream's token column decoded into the flat token stream the flat
reader maps (the values of every row in order, little-endian, of the manifest's dtype). They are no
compression of the file's bytes but the same mechanism (decoded once into the cache, checked against the
manifest's ``raw_digest``); the decoding needs the token column's rules, so it lives with them
(:mod:`stager.manifest.layouts.decoded`), and :func:`decompress` refuses them. A decoded form may
hold its tokens narrower than the column (:func:`stored_dtype`), which its size says.
"""

from __future__ import annotations

import struct
from typing import Iterator

import numpy as np
import pyarrow as pa

#: LitData's zstd frames inside a chunk, by its ``compression_level`` -> the manifest's codec name.
FRAMED = {"batch": "zstd-batch", "sample": "zstd-sample"}
#: LitData's uncompressed PyTreeLoader chunks: the manifest's codec for their size words taken out.
PYTREE = "litdata-pytree"
#: The manifest's codecs whose decompressed form is a LitData chunk's TokensLoader layout (:func:`unframe`).
LITDATA_FORMS = frozenset({*FRAMED.values(), PYTREE})
#: The layout's codec name (and the LitData ones) -> pyarrow's (None: nothing to decompress). The manifest
#: records the layout's (without the level).
CODECS = {"zstd": "zstd", "gz": "gzip", "gzip": "gzip", "bz2": "bz2", "br": "brotli", "brotli": "brotli",
          "snappy": "snappy", **{name: "zstd" for name in FRAMED.values()}, PYTREE: None}
#: A Parquet or Arrow token column decoded into flat tokens: the manifest's codec -> the layout it decodes.
DECODED = {"parquet-tokens": "parquet", "arrow-tokens": "arrow"}
STREAMING = frozenset({"zstd", "gzip", "bz2", "brotli"})
PIECE = 4 << 20  # decompressed bytes per piece
#: The narrower forms a decoded token column may be stored in, narrowest first.
NARROW_FORMS = (np.dtype("<u2"), np.dtype("<u4"))


def stored_dtype(dtype: str, tokens: int, raw_size: int) -> str:
    """The dtype a decoded form holds its tokens in: ``dtype``, or a narrower unsigned one that
    ``raw_size`` (bytes for ``tokens`` tokens) says it was stored in.

    Raises:
        ValueError: ``raw_size`` is no whole number of tokens of ``dtype`` or of a narrower form of it.
    """
    wide = np.dtype(dtype)
    if raw_size == tokens * wide.itemsize:
        return wide.name
    for form in NARROW_FORMS:
        if form.itemsize < wide.itemsize and raw_size == tokens * form.itemsize and wide.kind in "iu":
            return form.name
    raise ValueError(f"{raw_size} bytes are not {tokens} tokens of {dtype} nor of a narrower form of it")



def codec_name(compression: str) -> str:
    """The codec of a layout's ``compression`` value (``"zstd:7"`` -> ``"zstd"``).

    Raises:
        ValueError: no codec stager knows (the message names the value and the ones it knows).
    """
    name = str(compression).split(":", 1)[0].strip().lower()
    if name not in CODECS or name in LITDATA_FORMS:  # the LitData ones are the manifest's names, no layout's
        raise ValueError(f"compression {compression!r} is not one stager decompresses "
                         f"(known: {', '.join(sorted(set(CODECS) - LITDATA_FORMS))})")
    if not pa.Codec.is_available(CODECS[name]):
        raise ValueError(f"compression {compression!r}: this pyarrow was built without {CODECS[name]}")
    return name


def decompress(codec: str, data: bytes | memoryview, size: int, piece: int = PIECE) -> Iterator[memoryview]:
    """The decompressed bytes of ``data``, one whole ``codec`` stream, in pieces of at most ``piece`` bytes.

    Args:
        codec: a name :func:`codec_name` returned.
        data: the whole compressed file.
        size: the decompressed size the layout's index (or the manifest) promises: never more is
            produced, and less is an error.

    Raises:
        ValueError: the stream is truncated or corrupt, or holds more or fewer than ``size`` bytes.
    """
    if codec in DECODED:
        raise ValueError(f"{codec} is decoded with its token column's rules (stager.manifest.layouts.decoded), "
                         f"not decompressed")
    if codec in LITDATA_FORMS:
        yield from _sized(unframe(codec, data, size), size, piece)
        return
    name = CODECS[codec]
    source = pa.py_buffer(data)
    if name not in STREAMING:
        try:
            whole = pa.Codec(name).decompress(source, decompressed_size=size)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise ValueError(f"not a whole {codec} stream of {size} bytes: {exc}") from exc
        view = memoryview(whole)
        for start in range(0, len(view), piece):
            yield view[start:start + piece]
        return
    produced = 0
    try:
        stream = pa.CompressedInputStream(pa.BufferReader(source), name)
        while True:
            chunk = stream.read(min(piece, size - produced + 1))
            if not chunk:
                break
            produced += len(chunk)
            if produced > size:
                raise ValueError(f"decompresses to more than {size} bytes")
            yield memoryview(chunk)
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"not a whole {codec} stream: {exc}") from exc
    if produced != size:
        raise ValueError(f"decompresses to {produced} bytes, not {size}")


def _sized(pieces: Iterator[memoryview], size: int, piece: int) -> Iterator[memoryview]:
    """``pieces`` cut to at most ``piece`` bytes each, checked to add up to ``size``."""
    produced = 0
    for whole in pieces:
        for start in range(0, len(whole), piece):
            produced += len(whole[start:start + piece])
            if produced > size:
                raise ValueError(f"decompresses to more than {size} bytes")
            yield whole[start:start + piece]
    if produced != size:
        raise ValueError(f"decompresses to {produced} bytes, not {size}")


FRAMED_MAGIC = b"LDFZ01\0\0"
_PREFIX = struct.Struct("<8sHHIII")  # magic, version, flags, num_items, frame_rows, n_frames
_FRAME = np.dtype([("first_item", "<u4"), ("n_items", "<u4"), ("offset", "<u8"), ("length", "<u4"),
                   ("raw_length", "<u4")])
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_LIMIT = (1 << 32) - 1  # a chunk's offsets are u32
_JOINED = 512  # mean bytes an item from which joining its slices beats masking its size word out (measured)


def unframe(codec: str, data: bytes | memoryview, limit: int | None = None) -> Iterator[memoryview]:
    """The ``TokensLoader`` layout of a LitData ``PyTreeLoader`` chunk, of zstd frames (``zstd-batch`` or
    ``zstd-sample``) or uncompressed (``litdata-pytree``).

    The chunk's items each hold one leaf (``[u32 size][size bytes]``); the output is ``num_items``
    (u32), ``num_items + 1`` offsets (u32, from ``(num_items + 2) * 4``), then the leaves back to back:
    the header first, then the leaves a frame (``batch``), an item (``sample``) or up to :data:`PIECE`
    bytes of items (``litdata-pytree``) at a time.

    Args:
        codec: ``zstd-batch``, ``zstd-sample`` or ``litdata-pytree``.
        data: the whole chunk file.
        limit: the most decompressed bytes to produce (None: the header's word).

    Raises:
        ValueError: no such chunk: truncated, a frame table, offset or size word that disagrees with the
            file or with another, a frame that does not decompress to its size, or an item of more than
            one leaf (the message says which).
    """
    view = memoryview(data).cast("B")
    if codec == "zstd-batch":
        yield from _unframe_batch(view)
    elif codec == "zstd-sample":
        yield from _unframe_sample(view, limit)
    elif codec == PYTREE:
        yield from _unframe_pytree(view)
    else:
        raise ValueError(f"codec {codec!r} is no LitData framing")


def _tokens_header(leaves: np.ndarray) -> memoryview:
    """``num_items``, then the offsets of leaves of these sizes laid end to end after the header."""
    count = len(leaves)
    offsets = np.empty(count + 1, np.int64)
    offsets[0] = (count + 2) * 4
    np.cumsum(leaves, out=offsets[1:])
    offsets[1:] += offsets[0]
    if offsets[-1] > _LIMIT:
        raise ValueError(f"its items hold {int(offsets[-1])} bytes, more than a chunk's u32 offsets reach")
    return memoryview(struct.pack("<I", count) + offsets.astype("<u4").tobytes())


def _leaves(raw: memoryview | bytes, sizes: np.ndarray, first: int) -> memoryview:
    """The one leaf of each item in ``raw`` (items of ``sizes`` bytes), checked against its size word."""
    data = np.frombuffer(raw, np.uint8)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    words_at = starts[:, None] + np.arange(4)
    words = data[words_at].astype(np.int64) @ np.array([1, 1 << 8, 1 << 16, 1 << 24], np.int64)
    wrong = np.flatnonzero(words != sizes - 4)
    if len(wrong):
        n = int(wrong[0])
        raise ValueError(f"item {first + n} is {int(sizes[n])} bytes, its leaf size word says {int(words[n])} "
                         f"(+4): not one leaf, or corrupt")
    keep = np.ones(len(data), bool)
    keep[words_at.ravel()] = False
    return memoryview(data[keep])


def _unframe_batch(view: memoryview) -> Iterator[memoryview]:
    if len(view) < _PREFIX.size or bytes(view[:8]) != FRAMED_MAGIC:
        raise ValueError(f"{len(view)} bytes with no {FRAMED_MAGIC[:6].decode()} frame table at the start "
                         f"(not a compression_level 'batch' chunk, or truncated)")
    _, version, _, count, rows, frames = _PREFIX.unpack_from(view, 0)
    if version != 1:
        raise ValueError(f"framed zstd version {version}, stager reads version 1")
    if count == 0 or rows == 0 or frames != -(-count // rows):
        raise ValueError(f"its header says {count} items in {frames} frames of {rows}, which do not agree")
    table = _PREFIX.size + 4 * (count + 1)
    payload = table + _FRAME.itemsize * frames
    if len(view) < payload:
        raise ValueError(f"{len(view)} bytes, too short for the offsets and frame table of {count} items "
                         f"in {frames} frames its header promises ({payload} bytes; truncated)")
    offsets = np.frombuffer(view, "<u4", count + 1, _PREFIX.size).astype(np.int64)
    sizes = np.diff(offsets)
    if offsets[0] != 0 or (sizes < 4).any():
        raise ValueError("its item offsets do not run up from 0 by at least an item's 4-byte leaf size word")
    yield _tokens_header(sizes - 4)
    codec, cursor = pa.Codec("zstd"), payload
    for i, frame in enumerate(np.frombuffer(view, _FRAME, frames, table).tolist()):
        first, items, offset, length, raw_length = frame
        want = (i * rows, min(rows, count - i * rows), int(offsets[min(count, (i + 1) * rows)] - offsets[i * rows]))
        if (first, items, raw_length) != want:
            raise ValueError(f"frame {i} says items {first}+{items} of {raw_length} bytes, its header's offsets "
                             f"say items {want[0]}+{want[1]} of {want[2]} bytes")
        if offset < cursor or offset + length > len(view) or length == 0:
            raise ValueError(f"frame {i} lies at bytes {offset}..{offset + length}, the file has {len(view)} bytes "
                             f"and frame data from byte {cursor} (truncated or corrupt)")
        try:
            raw = codec.decompress(view[offset:offset + length], decompressed_size=raw_length, asbytes=True)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise ValueError(f"frame {i} is not a zstd frame of {raw_length} bytes: {exc}") from exc
        if len(raw) != raw_length:
            raise ValueError(f"frame {i} decompresses to {len(raw)} bytes, not {raw_length}")
        yield _leaves(memoryview(raw), sizes[first:first + items], first)
        cursor = offset + length
    if cursor != len(view):
        raise ValueError(f"its frames end at byte {cursor}, the file has {len(view)} bytes")


def _content_size(frame: memoryview) -> int | None:
    """The decompressed size a zstd frame's header records (None: it records none).

    Raises:
        ValueError: not a zstd frame, or too short for its header.
    """
    if len(frame) < 6 or bytes(frame[:4]) != _ZSTD_MAGIC:
        raise ValueError("not a zstd frame")
    descriptor = frame[4]
    single = (descriptor >> 5) & 1
    width = (1 if single else 0, 2, 4, 8)[descriptor >> 6]
    at = 5 + (0 if single else 1) + (0, 1, 2, 4)[descriptor & 3]
    if width == 0:
        return None
    if len(frame) < at + width:
        raise ValueError("too short for its zstd frame header")
    return int.from_bytes(frame[at:at + width], "little") + (256 if width == 2 else 0)


def _chunk_offsets(view: memoryview) -> tuple[int, int, np.ndarray]:
    """A classic chunk header's item count, its size and its offsets, checked to run up through the file."""
    if len(view) < 4:
        raise ValueError(f"{len(view)} bytes, too short for a chunk header")
    count = struct.unpack_from("<I", view, 0)[0]
    start = (count + 2) * 4
    if count == 0 or len(view) < start:
        raise ValueError(f"{len(view)} bytes, too short for the header of the {count} items it says it holds "
                         f"(truncated)")
    offsets = np.frombuffer(view, "<u4", count + 1, 4).astype(np.int64)
    if offsets[0] != start or (np.diff(offsets) <= 0).any() or offsets[-1] != len(view):
        raise ValueError(f"its offsets run from {int(offsets[0])} to {int(offsets[-1])}, the file has {len(view)} "
                         f"bytes and a header of {start} (truncated or corrupt)")
    return count, start, offsets


def _unframe_pytree(view: memoryview) -> Iterator[memoryview]:
    count, _, offsets = _chunk_offsets(view)
    sizes = np.diff(offsets)
    if (short := np.flatnonzero(sizes < 4)).size:
        n = int(short[0])
        raise ValueError(f"item {n} holds {int(sizes[n])} bytes, fewer than the 4 of its leaf size word")
    data = np.frombuffer(view, np.uint8)
    words = data[offsets[:-1, None] + np.arange(4)].astype(np.int64) @ np.array([1, 1 << 8, 1 << 16, 1 << 24])
    if (wrong := np.flatnonzero(words != sizes - 4)).size:
        n = int(wrong[0])
        raise ValueError(f"item {n} is {int(sizes[n])} bytes, its leaf size word says {int(words[n])} (+4): "
                         f"not one leaf, or corrupt")
    yield _tokens_header(sizes - 4)
    first = 0
    while first < count:  # items up to PIECE bytes at a time (at least one), so memory stays at a piece
        last = max(first + 1, int(np.searchsorted(offsets, offsets[first] + PIECE, "right")) - 1)
        begin, end = int(offsets[first]), int(offsets[last])
        if end - begin >= _JOINED * (last - first):  # long items: their slices joined (a copy, item by item)
            bounds = offsets[first:last + 1].tolist()
            yield memoryview(b"".join([view[a + 4:b] for a, b in zip(bounds[:-1], bounds[1:])]))
        else:  # short ones: one mask over the piece's bytes, without a step per item
            keep = np.ones(end - begin, bool)
            keep[(offsets[first:last, None] - begin + np.arange(4)).ravel()] = False
            yield memoryview(data[begin:end][keep])
        first = last


def _unframe_sample(view: memoryview, limit: int | None) -> Iterator[memoryview]:
    count, start, offsets = _chunk_offsets(view)
    frames = [view[int(a):int(b)] for a, b in zip(offsets[:-1], offsets[1:])]
    try:
        sizes = [_content_size(frame) for frame in frames]
    except ValueError as exc:
        raise ValueError(f"an item is not a zstd frame: {exc}") from exc
    known = None not in sizes
    raws = [] if known else [_inflate_one(frame, n, limit) for n, frame in enumerate(frames)]
    items = np.array(sizes if known else [len(r) for r in raws], np.int64)
    if (items < 4).any():
        raise ValueError("an item holds fewer than the 4 bytes of its leaf size word")
    if limit is not None and int(items.sum()) - 4 * count + start > limit:
        raise ValueError(f"its items decompress to more than {limit} bytes")
    yield _tokens_header(items - 4)
    codec = pa.Codec("zstd")
    for n, frame in enumerate(frames):
        raw = memoryview(_inflate_one(frame, n, None, int(items[n]), codec) if known else raws[n])
        word = int.from_bytes(raw[:4], "little")
        if word != len(raw) - 4:
            raise ValueError(f"item {n} is {len(raw)} bytes, its leaf size word says {word} (+4): not one leaf, "
                             f"or corrupt")
        yield raw[4:]


def _inflate_one(frame: memoryview, n: int, limit: int | None, size: int | None = None,
                 codec: pa.Codec | None = None) -> bytes:
    """Item ``n``'s zstd frame decompressed (to ``size`` bytes, or at most ``limit`` where it says none)."""
    try:
        if size is not None:
            raw = (codec or pa.Codec("zstd")).decompress(frame, decompressed_size=size, asbytes=True)
        else:
            stream = pa.CompressedInputStream(pa.BufferReader(pa.py_buffer(frame)), "zstd")
            raw = stream.read((limit if limit is not None else _LIMIT) + 1)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise ValueError(f"item {n} is not a whole zstd frame: {exc}") from exc
    if size is not None and len(raw) != size:
        raise ValueError(f"item {n} decompresses to {len(raw)} bytes, its frame header says {size}")
    return raw


__all__ = ["CODECS", "DECODED", "FRAMED", "LITDATA_FORMS", "NARROW_FORMS", "PYTREE", "codec_name", "decompress",
           "stored_dtype", "unframe"]
