"""MosaicML Streaming (MDS) datasets: ``index.json`` (``version: 2``) + ``shard.NNNNN.mds`` files.

``index.json`` lists ``shards``, each with ``raw_data`` (and, compressed,
``zip_data``) ``{basename, bytes, hashes}``, ``samples``, ``column_names``,
``column_encodings``, ``column_sizes``, ``compression`` and ``hashes``. A shard
file is::

    num_samples u32   offsets u32[num_samples + 1]   config JSON   samples...

and a sample is one u32 size per column of variable size, then the columns
in order. The token column (``--token-column``: ``tokens``, else
``input_ids``) must be an ``ndarray`` encoding with a fixed integer dtype
(``ndarray:uint16``, ``ndarray:int32:2048``, ...); its tokens, sample after
sample, are the shard's token stream. Indexing follows each shard as it is
hashed, one sample at a time, checking the sample count and offsets against
``index.json``, counting tokens, and checking the layout's own hashes
(``sha1``, ``xxh64``, ...); a shard that disagrees is refused naming it.

A compressed shard (``zip_data``: ``shard.00000.mds.zstd``, ``compression:
zstd``, ``zstd:N``, ``gz``, ``bz2``, ``br``, ``snappy``) is the compressed file
in the manifest, its own size and hashes (``zip_data``) checked as it is
hashed; then it is decompressed once and followed as above against
``raw_data`` (:mod:`.compressed`). Where the decompressed file lies beside it
too, that one is the shard (read in place, nothing to decompress).
"""

from __future__ import annotations

import hashlib
import posixpath
import struct

import numpy as np
import xxhash

from ...codecs import codec_name
from ...errors import ManifestError
from .base import NOT_TOKENS, IndexedLayout, Probe, TokenInfo, read_index_json
from .columns import candidates
from .compressed import InflatingProbe

INTEGER_DTYPES = frozenset({"uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64"})
SHAPE_DTYPES = {0: "uint8", 1: "uint16", 2: "uint32", 3: "uint64"}


class TokenColumn:
    """Where a sample's tokens are: the token column's place, encoding and dtype.

    Raises:
        ManifestError: no token column, or one whose encoding is not a fixed integer ndarray.
    """

    def __init__(self, name: str, shard: dict, wanted: str | None) -> None:
        names, encodings, sizes = shard["column_names"], shard["column_encodings"], shard["column_sizes"]
        if not (len(names) == len(encodings) == len(sizes)):
            raise ManifestError(f"{name}: column_names, column_encodings and column_sizes differ in length")
        found = next((c for c in candidates(wanted) if c in names), None)
        if found is None:
            raise ManifestError(f"{name}: no token column {' or '.join(candidates(wanted))} "
                                f"among {', '.join(map(str, names))} (--token-column names another)")
        self.column = found
        self.position = names.index(found)
        parts = str(encodings[self.position]).split(":")
        if parts[0] != "ndarray" or len(parts) < 2 or parts[1] not in INTEGER_DTYPES:
            raise ManifestError(f"{name}: column {found!r} is {encodings[self.position]!r}; stager reads token "
                                f"columns of a fixed integer dtype (ndarray:uint16, ndarray:int32:2048, ...)")
        self.dtype = parts[1]
        self.itemsize = np.dtype(self.dtype).itemsize
        self.shape = tuple(int(x) for x in parts[2].split(",")) if len(parts) > 2 and parts[2] else None
        self.sizes = [None if s is None else int(s) for s in sizes]

    def locate(self, sample: memoryview) -> tuple[int, int]:
        """(byte offset, token count) of the tokens inside one sample's bytes.

        Raises:
            ValueError: the sample is shorter than its sizes say, or the array does not add up.
        """
        at, sizes = 0, []
        for size in self.sizes:
            if size is None:
                size = struct.unpack_from("<I", sample, at)[0]
                at += 4
            sizes.append(size)
        start = at + sum(sizes[:self.position])
        length = sizes[self.position]
        if start + length > len(sample):
            raise ValueError(f"a sample of {len(sample)} bytes whose column sizes add up to more")
        shape = self.shape
        if shape is None:
            byte = sample[start]
            ndim, width = byte >> 2, 1 << (byte % 4)
            shape = np.frombuffer(sample, SHAPE_DTYPES[byte % 4], ndim, start + 1)
            start, length = start + 1 + ndim * width, length - 1 - ndim * width
        count = length // self.itemsize
        if length < 0 or length % self.itemsize or int(np.prod(shape)) != count:
            raise ValueError(f"a {self.column!r} array of shape {tuple(int(x) for x in shape)} in {length} bytes")
        return start, count


def shard_slices(data: memoryview, column: TokenColumn, samples: int) -> tuple[np.ndarray, np.ndarray]:
    """Byte offsets and token counts of the tokens of each sample of a whole shard's bytes."""
    count = struct.unpack_from("<I", data, 0)[0]
    if count != samples:
        raise ValueError(f"holds {count} samples")
    offsets = np.frombuffer(data, "<u4", count + 1, 4).astype(np.int64)
    located = _locate_all(data, column, offsets)
    if located is not None:
        return located
    starts, counts = np.empty(count, np.int64), np.empty(count, np.int64)
    for i in range(count):
        begin, end = int(offsets[i]), int(offsets[i + 1])
        start, n = column.locate(data[begin:end])
        starts[i], counts[i] = begin + start, n
    return starts, counts


def _locate_all(data: memoryview, column: TokenColumn, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """What :meth:`TokenColumn.locate` gives for every sample, in numpy over the whole offset table:
    None when the samples' array headers differ (then each sample is parsed on its own)."""
    raw = np.frombuffer(data, np.uint8)
    begins, ends = offsets[:-1], offsets[1:]
    variable = sum(size is None for size in column.sizes)
    if len(begins) == 0 or int(ends[-1]) > len(raw) or bool(np.any(ends - begins < 4 * variable)):
        return None
    sizes, k = [], 0
    for size in column.sizes:
        if size is None:
            size = _uints_at(raw, begins + 4 * k, 4)
            k += 1
        sizes.append(np.broadcast_to(np.asarray(size, np.int64), begins.shape))
    start = begins + 4 * variable + sum(sizes[:column.position], np.zeros_like(begins))
    length = sizes[column.position].copy()
    if bool(np.any(start + length > ends)) or bool(np.any(length < 1 if column.shape is None else length < 0)):
        return None
    shape_count = np.full(begins.shape, int(np.prod(column.shape)) if column.shape is not None else 0, np.int64)
    if column.shape is None:
        byte = raw[start]
        if bool(np.any(byte != byte[0])):
            return None
        ndim, width = int(byte[0]) >> 2, 1 << (int(byte[0]) % 4)
        if bool(np.any(length < 1 + ndim * width)):
            return None
        shape_count[:] = 1
        for d in range(ndim):
            shape_count *= _uints_at(raw, start + 1 + d * width, width)
        start, length = start + 1 + ndim * width, length - 1 - ndim * width
    counts = length // column.itemsize
    if bool(np.any(length % column.itemsize)) or bool(np.any(shape_count != counts)):
        return None  # the per-sample parse names what is wrong
    return start, counts


def _uints_at(raw: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """The little-endian unsigned integers of ``width`` bytes at byte offsets ``at`` of ``raw``."""
    return raw[at[:, None] + np.arange(width)].view(f"<u{width}")[:, 0].astype(np.int64)


def _hasher(algo: str):
    if algo in hashlib.algorithms_guaranteed:
        return hashlib.new(algo)
    if algo in xxhash.algorithms_available:
        return getattr(xxhash, algo)()
    return None


class ShardProbe(Probe):
    """Follows one MDS shard as it is hashed: header, then each sample as it completes."""

    def __init__(self, name: str, index_name: str, shard: dict, column: TokenColumn) -> None:
        self.name, self.index_name, self.shard, self.column = name, index_name, shard, column
        self.samples = int(shard["samples"])
        self.buffer = bytearray()
        self.consumed = 0  # bytes of the file before buffer[0]
        self.offsets: np.ndarray | None = None
        self.next_sample = 0
        self.tokens = 0
        self.size = 0
        self.failure: str | None = None
        hashes = (shard["raw_data"].get("hashes") or {})
        self.hashers = {algo: (h, digest) for algo, digest in hashes.items() if (h := _hasher(algo)) is not None}

    def feed(self, data: bytes) -> None:
        self.size += len(data)
        for hasher, _ in self.hashers.values():
            hasher.update(data)
        if self.failure:
            return
        self.buffer += data
        try:
            self._drain()
        except (ValueError, IndexError, KeyError, struct.error) as exc:
            self.failure = str(exc)

    def _drain(self) -> None:
        if self.offsets is None:
            if len(self.buffer) < 4:
                return
            count = struct.unpack_from("<I", self.buffer, 0)[0]
            if count != self.samples:
                raise ValueError(f"holds {count} samples, {self.index_name} says {self.samples}")
            if len(self.buffer) < 4 * (count + 2):
                return
            self.offsets = np.frombuffer(bytes(self.buffer[4:4 * (count + 2)]), "<u4").astype(np.int64)
            if (np.diff(self.offsets) < 0).any() or self.offsets[0] < 4 * (count + 2):
                raise ValueError("its offset table is not in order")
        view = memoryview(self.buffer)
        try:
            while self.next_sample < self.samples:
                begin = int(self.offsets[self.next_sample]) - self.consumed
                end = int(self.offsets[self.next_sample + 1]) - self.consumed
                if end > len(self.buffer):
                    break
                self.tokens += self.column.locate(view[begin:end])[1]
                self.next_sample += 1
        finally:
            view.release()
        keep = int(self.offsets[self.next_sample]) - self.consumed if self.next_sample < self.samples else len(self.buffer)
        if keep > 0:
            del self.buffer[:keep]
            self.consumed += keep

    def finish(self) -> TokenInfo:
        expected = int(self.shard["raw_data"]["bytes"])
        if self.size != expected:
            raise ManifestError(f"{self.name}: {self.size} bytes, {self.index_name} says {expected} (truncated?)")
        for algo, (hasher, digest) in self.hashers.items():
            if hasher.hexdigest() != digest:
                raise ManifestError(f"{self.name}: its {algo} is {hasher.hexdigest()}, {self.index_name} says {digest}")
        if self.failure:
            raise ManifestError(f"{self.name}: disagrees with {self.index_name}: {self.failure}")
        if self.offsets is None or self.next_sample != self.samples or int(self.offsets[-1]) != self.size:
            raise ManifestError(f"{self.name}: its samples end at byte "
                                f"{'?' if self.offsets is None else int(self.offsets[-1])} of {self.size} "
                                f"(truncated or corrupt)")
        return TokenInfo(self.column.dtype, self.tokens, "mds", self.column.column)


class MdsLayout(IndexedLayout):
    """The shards listed by each MDS ``index.json`` of a listing."""

    name = "mds"
    title = "MDS"

    def make_probe(self, name: str, index_name: str, entry: dict, extra: object) -> Probe:
        column, codec = extra  # type: ignore[misc]
        assert isinstance(column, TokenColumn)
        if codec is None:
            return ShardProbe(name, index_name, entry, column)
        inner = ShardProbe(f"{name} (decompressed)", index_name, entry, column)
        zipped = entry["zip_data"]
        hashers = {algo: (h, digest) for algo, digest in (zipped.get("hashes") or {}).items()
                   if (h := _hasher(algo)) is not None}
        return InflatingProbe(name, index_name, codec, int(entry["raw_data"]["bytes"]), inner,
                              size=int(zipped["bytes"]), hashers=hashers)

async def find(store, sizes: dict[str, int], column: str | None, required: bool) -> MdsLayout | None:
    """The MDS datasets of a listing (path -> size), each ``index.json`` checked against the files.

    Raises:
        ManifestError: a bad ``index.json``, a shard that is missing, compressed with a codec stager
            does not know, or has no token column; with ``required``, no MDS ``index.json`` at all.
    """
    root = store.url.rstrip("/")
    shards: dict[str, tuple[str, dict, tuple[TokenColumn, str | None]]] = {}
    for index in (p for p in sizes if posixpath.basename(p) == "index.json"):
        name = f"{root}/{index}"
        content = read_index_json(name, await store.read(index), sizes, posixpath.dirname(index),
                                  lambda f: ".mds" in f)
        if not isinstance(content, dict) or "shards" not in content:
            continue  # another layout's index.json (LitData has one too)
        try:
            if content.get("version") != 2:
                raise ManifestError(f"{name}: MDS index version {content.get('version')!r} is not supported "
                                    f"(this stager reads 2)")
            for shard in content["shards"]:
                if shard.get("format") != "mds":
                    raise ManifestError(f"{name}: shard format {shard.get('format')!r} is not mds")
                folder = posixpath.dirname(index)
                path, codec = posixpath.join(folder, shard["raw_data"]["basename"]), None
                if shard.get("zip_data") and path not in sizes:  # compressed (and only so, as MDSWriter leaves it)
                    path = posixpath.join(folder, shard["zip_data"]["basename"])
                    try:
                        codec = codec_name(shard.get("compression") or "")
                    except ValueError as exc:
                        raise ManifestError(f"{name}: shard {shard['zip_data']['basename']}: {exc}") from exc
                    if path not in sizes:
                        raise ManifestError(f"{name}: lists {shard['zip_data']['basename']}, which is not there")
                    for key, value in (("zip_data", shard["zip_data"]["bytes"]), ("raw_data", shard["raw_data"]["bytes"])):
                        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                            raise ManifestError(f"{name}: shard {shard['zip_data']['basename']}: {key} bytes "
                                                f"{value!r} is not a size")
                elif path not in sizes:
                    raise ManifestError(f"{name}: lists {shard['raw_data']['basename']}, which is not there")
                if not isinstance(shard["samples"], int) or shard["samples"] < 0:
                    raise ManifestError(f"{name}: shard {shard['raw_data']['basename']}: samples "
                                        f"{shard['samples']!r} is not a count")
                shards[path] = (index, shard, (TokenColumn(name, shard, column), codec))
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            if isinstance(exc, ManifestError):
                raise
            raise ManifestError(f"{name}: not an MDS index (missing or bad {exc})") from exc
    return MdsLayout.found(root, shards, required)
