"""NumPy ``.npy`` token files: header checked by NumPy, data memory-mapped read-only (no copy)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...errors import CorruptData
from .base import ShardReader, check_tokens, prefer_large_pages


class NpyReader(ShardReader):
    suffixes = (".npy",)

    def open(self, path: Path, name: str, dtype: str | None, tokens: int) -> np.ndarray:
        try:
            mapped = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise CorruptData(f"{name}: not a readable .npy file: {exc}") from exc
        if mapped.dtype.hasobject or mapped.ndim != 1:
            raise CorruptData(f"{name}: a token .npy must hold a flat integer array, "
                              f"got {mapped.dtype} {mapped.shape}")
        prefer_large_pages(getattr(mapped, "_mmap", None))
        # A plain ndarray view of the map: slicing a memmap subclass costs far more per sample.
        array = mapped.view(np.ndarray)
        if not array.dtype.isnative:
            array = array.astype(array.dtype.newbyteorder("="))
        return check_tokens(array, name, dtype, tokens)
