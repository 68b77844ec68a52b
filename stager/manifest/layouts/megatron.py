"""Megatron-LM indexed datasets: ``PREFIX.bin`` (tokens) + ``PREFIX.idx`` (the index).

The ``.idx`` file, as Megatron's ``_IndexWriter`` writes it (little-endian)::

    b"MMIDIDX\\x00\\x00"  version u64 (1)  dtype code u8
    sequence count u64   document count u64
    sequence lengths  int32[sequence count]    (tokens)
    sequence pointers int64[sequence count]    (byte offsets into .bin)
    document index    int64[document count]    (0, ..., sequence count)
    [sequence modes   int8[sequence count]]    (multimodal datasets only)

The ``.bin`` file is every sequence's tokens, back to back, in the dtype the
header names: for stager a flat token shard, memory-mapped as ``.bin`` shards
are. Indexing reads each ``.idx`` header first (so the ``.bin`` gets its dtype),
then checks the whole ``.idx`` as it is hashed: its size, pointers that
follow the lengths exactly, a document index from 0 to the sequence count,
and a ``.bin`` exactly as long as the sequences; any disagreement is refused,
naming the file, before a training job could meet it.
"""

from __future__ import annotations

import struct

import numpy as np

from ...errors import ManifestError
from .base import NOT_TOKENS, DatasetLayout, Probe, TokenInfo

MAGIC = b"MMIDIDX\x00\x00"
HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequence count, document count
#: Megatron's DType codes (megatron/core/datasets/indexed_dataset.py).
DTYPE_CODES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float64", 7: "float32", 8: "uint16"}
TOKEN_DTYPES = frozenset({"uint8", "int8", "int16", "int32", "int64", "uint16"})


class IdxHeader:
    """The fixed part of one ``.idx`` file, checked against the file's size."""

    def __init__(self, name: str, data: bytes, size: int) -> None:
        if len(data) < HEADER.size:
            raise ManifestError(f"{name}: truncated Megatron index ({size} bytes, the header alone is {HEADER.size})")
        magic, version, code, self.sequences, self.documents = HEADER.unpack_from(data)
        if magic != MAGIC:
            raise ManifestError(f"{name}: not a Megatron index (no MMIDIDX header)")
        if version != 1:
            raise ManifestError(f"{name}: Megatron index version {version} is not supported (this stager reads 1)")
        if code not in DTYPE_CODES or DTYPE_CODES[code] not in TOKEN_DTYPES:
            raise ManifestError(f"{name}: dtype code {code} is not an integer token type")
        self.dtype = DTYPE_CODES[code]
        self.itemsize = np.dtype(self.dtype).itemsize
        body = HEADER.size + 12 * self.sequences + 8 * self.documents
        if size not in (body, body + self.sequences):  # + one mode byte per sequence (multimodal)
            raise ManifestError(f"{name}: {size} bytes, but its header promises {self.sequences} sequences and "
                                f"{self.documents} documents ({body} bytes): truncated or not this format")


class IdxProbe(Probe):
    """Checks a whole ``.idx`` against its ``.bin`` while it is hashed."""

    def __init__(self, name: str, header: IdxHeader, bin_name: str, bin_size: int) -> None:
        self.name, self.header, self.bin_name, self.bin_size = name, header, bin_name, bin_size
        self.data = bytearray()

    def feed(self, data: bytes) -> None:
        self.data += data

    def finish(self) -> TokenInfo:
        h, n = self.header, self.header.sequences
        at = HEADER.size
        lengths = np.frombuffer(self.data, "<i4", n, at)
        pointers = np.frombuffer(self.data, "<i8", n, at + 4 * n)
        documents = np.frombuffer(self.data, "<i8", h.documents, at + 12 * n)
        if (lengths < 0).any():
            raise ManifestError(f"{self.name}: negative sequence length at sequence {int(np.argmax(lengths < 0))}")
        expected = np.concatenate([[0], np.cumsum(lengths.astype(np.int64) * h.itemsize)])
        wrong = np.flatnonzero(pointers != expected[:-1])
        if len(wrong):
            i = int(wrong[0])
            raise ManifestError(f"{self.name}: sequence {i} starts at byte {int(pointers[i])} of {self.bin_name}, "
                                f"its lengths say {int(expected[i])}")
        if int(expected[-1]) != self.bin_size:
            raise ManifestError(f"{self.bin_name}: {self.bin_size} bytes, but {self.name} indexes "
                                f"{int(expected[-1])} bytes of {n} sequences (truncated, or another index)")
        if h.documents and (documents[0] != 0 or documents[-1] != n or (np.diff(documents) < 0).any()):
            raise ManifestError(f"{self.name}: document index does not run from 0 to {n} sequences")
        return NOT_TOKENS


class MegatronLayout(DatasetLayout):
    """Every ``.bin``/``.idx`` pair of a listing."""

    name = "megatron"

    def __init__(self, root: str, headers: dict[str, IdxHeader], sizes: dict[str, int]) -> None:
        self.root = root
        self.headers = headers  # by prefix
        self.sizes = sizes

    def claims(self, path: str) -> bool:
        return path.endswith((".bin", ".idx")) and path[:-4] in self.headers

    def probe(self, path: str, size: int) -> Probe | None:
        if path.endswith(".idx"):
            prefix = path[:-4]
            return IdxProbe(f"{self.root}/{path}", self.headers[prefix], f"{self.root}/{prefix}.bin",
                            self.sizes[prefix + ".bin"])
        return None

    async def describe(self, path: str, size: int, probe: Probe | None) -> TokenInfo:
        if probe is not None:
            return probe.finish()
        header = self.headers[path[:-4]]
        if size % header.itemsize:
            raise ManifestError(f"{self.root}/{path}: {size} bytes is not a whole number of {header.dtype} tokens")
        return TokenInfo(header.dtype, size // header.itemsize, "megatron")


async def find(store, sizes: dict[str, int], required: bool) -> MegatronLayout | None:
    """The Megatron pairs among ``sizes`` (path -> size), their headers read and checked.

    Raises:
        ManifestError: an ``.idx`` without its ``.bin`` (or, ``required``, none at all), a bad header.
    """
    root = store.url.rstrip("/")
    prefixes = [p[:-4] for p in sizes if p.endswith(".idx")]
    if not prefixes:
        if required:
            raise ManifestError(f"{root}: --format megatron, but there is no .idx file")
        return None
    headers = {}
    for prefix in prefixes:
        idx, bin_ = prefix + ".idx", prefix + ".bin"
        data = await store.read_range(idx, 0, min(HEADER.size, sizes[idx])) if sizes[idx] else b""
        if not required and not data.startswith(MAGIC):
            continue  # another tool's .idx file: not Megatron's, and not ours to judge
        if bin_ not in sizes:
            raise ManifestError(f"{root}/{idx}: Megatron index without its data file {bin_}")
        headers[prefix] = IdxHeader(f"{root}/{idx}", data, sizes[idx])
    if not headers:
        return None
    return MegatronLayout(root, headers, sizes)
