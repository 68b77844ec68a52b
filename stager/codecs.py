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
"""

from __future__ import annotations

from typing import Iterator

import pyarrow as pa

#: The layout's codec name -> pyarrow's. The manifest records the layout's (without the level).
CODECS = {"zstd": "zstd", "gz": "gzip", "gzip": "gzip", "bz2": "bz2", "br": "brotli", "brotli": "brotli",
          "snappy": "snappy"}
STREAMING = frozenset({"zstd", "gzip", "bz2", "brotli"})
PIECE = 4 << 20  # decompressed bytes per piece


def codec_name(compression: str) -> str:
    """The codec of a layout's ``compression`` value (``"zstd:7"`` -> ``"zstd"``).

    Raises:
        ValueError: no codec stager knows (the message names the value and the ones it knows).
    """
    name = str(compression).split(":", 1)[0].strip().lower()
    if name not in CODECS:
        raise ValueError(f"compression {compression!r} is not one stager decompresses "
                         f"(known: {', '.join(sorted(CODECS))})")
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


__all__ = ["CODECS", "codec_name", "decompress"]
