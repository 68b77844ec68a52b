"""MosaicML Streaming (MDS) shards: the token column of every sample, in order.

The shard is memory-mapped; its offset table gives each sample, and each
sample's column sizes give where its tokens are (the parsing is shared with
the index, :mod:`stager.manifest.layouts.mds`). A shard whose samples are one
fixed-size token column (``ndarray:uint16:2048``, as llm-foundry writes them)
holds its tokens back to back and is read in place, as a flat shard is;
samples that carry headers or other columns between their tokens are
gathered into one array once per open (one copy, as Parquet's decoding is).
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
            out = _gather(data, starts, counts, np.dtype(dtype).newbyteorder("<"))
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise CorruptData(f"{name}: not a readable MDS shard: {exc}") from exc
        out.flags.writeable = False
        return check_tokens(out.astype(out.dtype.newbyteorder("="), copy=False), name, dtype, tokens)


def _gather(data, starts: np.ndarray, counts: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The tokens at ``starts`` (bytes), ``counts`` of them each, in one array: a view of ``data`` when
    the samples' tokens lie back to back (one fixed-size column: the shard's samples are a flat token
    stream), one strided copy when the samples are evenly spaced and of one length (fixed-size
    samples with other columns), else one copy per sample."""
    if len(starts) and (len(starts) == 1 or (bool(np.all(counts == counts[0]))
                                             and bool(np.all(np.diff(starts) == starts[1] - starts[0])))):
        width = int(counts[0]) * dtype.itemsize
        step = int(starts[1] - starts[0]) if len(starts) > 1 else width
        raw = np.frombuffer(data, np.uint8)
        if int(starts[-1]) + width > len(raw) or int(starts[0]) < 0:
            raise ValueError(f"samples reach byte {int(starts[-1]) + width} of {len(raw)}")
        if step == width:  # nothing between the samples' tokens: mapped as they are, like a flat shard
            return np.frombuffer(data, dtype, int(counts.sum()), int(starts[0]))
        out = np.empty(int(counts.sum()), dtype)
        rows = np.lib.stride_tricks.as_strided(raw[int(starts[0]):], (len(starts), width), (step, 1),
                                               writeable=False)
        out.view(np.uint8).reshape(len(starts), width)[:] = rows
        return out
    out = np.empty(int(counts.sum()), dtype)
    at = 0
    for start, count in zip(starts.tolist(), counts.tolist()):
        out[at:at + count] = np.frombuffer(data, dtype, count, start)
        at += count
    return out


def _shard_config(view: memoryview) -> dict:
    """The column layout a shard carries after its offset table (the writer's config JSON)."""
    count = struct.unpack_from("<I", view, 0)[0]
    table_end = 4 * (count + 2)
    first = struct.unpack_from("<I", view, 4)[0]
    config = json.loads(bytes(view[table_end:first]))
    config["samples"] = count
    return config
