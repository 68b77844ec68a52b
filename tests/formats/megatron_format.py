"""Megatron-LM's indexed dataset format, byte for byte, without importing megatron-core.

megatron-core's import pulls in its whole transformer stack (tens of seconds
on a busy machine), so most tests write and read datasets with these two
functions, which follow ``megatron/core/datasets/indexed_dataset.py``
(``IndexedDatasetBuilder`` / ``_IndexWriter`` and ``_IndexReader``);
``test_megatron.py::test_the_real_builder_writes_what_these_helpers_write``
proves them byte-identical to the real builder.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

CODES = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5, np.float64: 6, np.float32: 7, np.uint16: 8}
DTYPES = {code: np.dtype(t) for t, code in CODES.items()}


def write_dataset(prefix: Path, documents, dtype=np.uint16) -> None:
    """``prefix.bin`` and ``prefix.idx`` for ``documents`` (one sequence per document)."""
    dtype = np.dtype(dtype)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    lengths = [len(d) for d in documents]
    with open(f"{prefix}.bin", "wb") as fh:
        for doc in documents:
            fh.write(np.asarray(doc, dtype=dtype).tobytes(order="C"))
    pointers = np.concatenate([[0], np.cumsum(np.array(lengths, np.int64) * dtype.itemsize)[:-1]]) if lengths else []
    with open(f"{prefix}.idx", "wb") as fh:
        fh.write(b"MMIDIDX\x00\x00")
        fh.write(struct.pack("<Q", 1))
        fh.write(struct.pack("<B", CODES[dtype.type]))
        fh.write(struct.pack("<Q", len(lengths)))
        fh.write(struct.pack("<Q", len(lengths) + 1))  # document index: 0, then one end per document
        fh.write(np.array(lengths, dtype=np.int32).tobytes(order="C"))
        fh.write(np.array(pointers, dtype=np.int64).tobytes(order="C"))
        fh.write(np.arange(len(lengths) + 1, dtype=np.int64).tobytes(order="C"))


def read_dataset(prefix: Path) -> list[np.ndarray]:
    """Every sequence, read as megatron's ``_IndexReader`` + ``IndexedDataset.__getitem__`` do."""
    idx = Path(f"{prefix}.idx").read_bytes()
    assert idx[:9] == b"MMIDIDX\x00\x00" and struct.unpack_from("<Q", idx, 9)[0] == 1
    dtype = DTYPES[idx[17]]
    count, _documents = struct.unpack_from("<QQ", idx, 18)
    lengths = np.frombuffer(idx, np.int32, count, 34)
    pointers = np.frombuffer(idx, np.int64, count, 34 + 4 * count)
    data = Path(f"{prefix}.bin").read_bytes()
    return [np.frombuffer(data, dtype, int(n), int(p)).copy() for n, p in zip(lengths, pointers)]
