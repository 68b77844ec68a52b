"""Compressed shards of a layout (MDS ``zip_data``, LitData ``.zstd.bin`` chunks): checked as they are
hashed, then decompressed once and checked again through the layout's own probe.

The shard in the manifest is the compressed file, as the origin holds it: its
size, digest and blocks are the compressed bytes', which the engine stages and
verifies like any other blob's. What the iterator reads is its decompressed
form, so :class:`InflatingProbe` keeps the compressed bytes as they are hashed
(checking the layout's own size and hashes of them, where it records any),
and at the end decompresses them once, in pieces, into the layout's probe of
an uncompressed shard (which checks sizes, sample counts and offsets and
counts tokens) and into an xxh3-128: the manifest records the codec, the
decompressed size and that digest, and the cache checks each decompressed
copy it makes against them (:mod:`stager.cache.inflate`). A compressed shard
that is truncated or corrupt, or decompresses to other bytes than its index
says, is refused naming it. A LitData chunk of zstd frames (``zstd-batch``,
``zstd-sample``: :func:`stager.codecs.unframe`) or of uncompressed PyTreeLoader
items (``litdata-pytree``, its size words taken out) has no decompressed size in
its index: the size is what its checked frames or items decompress to.
"""

from __future__ import annotations

import xxhash

from ...codecs import decompress, unframe
from ...errors import ManifestError
from .base import Probe, TokenInfo


class InflatingProbe(Probe):
    """Follows one compressed shard as it is hashed; decompresses it once in :meth:`finish`.

    Args:
        name: the compressed file (for messages).
        index_name: the layout's index that lists it.
        codec: its codec (a name :func:`stager.codecs.codec_name` returned).
        raw_size: the decompressed size the index promises (None: a LitData framing's, found as it is
            decompressed).
        inner: the layout's probe of the decompressed bytes.
        size: the compressed size the index promises (None: it says none).
        hashers: the layout's hashes of the compressed bytes: algorithm -> (hasher, hex digest).
    """

    def __init__(self, name: str, index_name: str, codec: str, raw_size: int | None, inner: Probe, *,
                 size: int | None = None, hashers: dict | None = None) -> None:
        self.name, self.index_name, self.codec, self.raw_size = name, index_name, codec, raw_size
        self.inner, self.expected_size, self.hashers = inner, size, hashers or {}
        self.data = bytearray()

    inflates = True  # its finish decompresses the shard: IndexedLayout.describe runs it in a thread

    def feed(self, data: bytes) -> None:
        self.data += data
        for hasher, _ in self.hashers.values():
            hasher.update(data)

    def finish(self) -> TokenInfo:
        if self.expected_size is not None and len(self.data) != self.expected_size:
            raise ManifestError(f"{self.name}: {len(self.data)} bytes, {self.index_name} says {self.expected_size} "
                                f"(truncated?)")
        for algo, (hasher, digest) in self.hashers.items():
            if hasher.hexdigest() != digest:
                raise ManifestError(f"{self.name}: its {algo} is {hasher.hexdigest()}, {self.index_name} says {digest}")
        digest, raw_size = xxhash.xxh3_128(), 0
        if self.raw_size is None:
            pieces, says = unframe(self.codec, memoryview(self.data)), f"LitData {self.codec} chunk"
        else:
            pieces = decompress(self.codec, memoryview(self.data), self.raw_size)
            says = f"{self.index_name} says {self.raw_size} bytes decompressed"
        try:
            for piece in pieces:
                digest.update(piece)
                raw_size += len(piece)
                self.inner.feed(bytes(piece))
        except ValueError as exc:
            raise ManifestError(f"{self.name}: {exc} ({says}; truncated or corrupt?)") from exc
        finally:
            self.data = bytearray()
        info = self.inner.finish()
        return TokenInfo(info.dtype, info.tokens, info.layout, info.column, self.codec, raw_size,
                         digest.hexdigest())
