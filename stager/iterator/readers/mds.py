"""MosaicML Streaming (MDS) shards: the token column of every sample, in order.

The shard is memory-mapped; its offset table gives each sample, and each
sample's column sizes give where its tokens are (the parsing is shared with
the index, :mod:`stager.manifest.layouts.mds`). Samples carry headers and
other columns between their tokens, so the tokens are gathered into one
array once per open (one copy, as Parquet's decoding is).
"""

from __future__ import annotations

import json
import struct

import numpy as np

from ...errors import CorruptData, ManifestError
from ...manifest.layouts.mds import TokenColumn, shard_slices
from .base import ColumnReader, Source, as_buffer, check_tokens


class MdsReader(ColumnReader):
    suffixes = (".mds",)

    def open(self, source: Source, name: str, dtype: str | None, tokens: int) -> np.ndarray:
        if dtype is None:
            raise ManifestError(f"{name}: an MDS shard needs a dtype in the manifest")
        data = as_buffer(source, name)
        view = memoryview(data)
        try:
            config = _shard_config(view)
            column = TokenColumn(name, config, self.column)
            starts, counts = shard_slices(view, column, int(config["samples"]))
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise CorruptData(f"{name}: not a readable MDS shard: {exc}") from exc
        out = np.empty(int(counts.sum()), np.dtype(dtype).newbyteorder("<"))
        at = 0
        for start, count in zip(starts.tolist(), counts.tolist()):
            out[at:at + count] = np.frombuffer(data, out.dtype, count, start)
            at += count
        out.flags.writeable = False
        return check_tokens(out.astype(out.dtype.newbyteorder("="), copy=False), name, dtype, tokens)


def _shard_config(view: memoryview) -> dict:
    """The column layout a shard carries after its offset table (the writer's config JSON)."""
    count = struct.unpack_from("<I", view, 0)[0]
    table_end = 4 * (count + 2)
    first = struct.unpack_from("<I", view, 4)[0]
    config = json.loads(bytes(view[table_end:first]))
    config["samples"] = count
    return config
