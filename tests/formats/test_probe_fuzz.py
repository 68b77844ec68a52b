"""Bytes on the origin are untrusted: each layout's probe, fed mangled shards, answers or refuses, never crashes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa

from stager.errors import ManifestError
from stager.manifest.layouts.arrow import ArrowStreamProbe
from stager.manifest.layouts.litdata import ChunkProbe
from stager.manifest.layouts.mds import ShardProbe, TokenColumn
from stager.manifest.layouts.megatron import IdxHeader, IdxProbe

from .megatron_format import write_dataset

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CASES = 150


def mangled(data: bytes, rng: np.random.Generator):
    """Truncations, bit flips and overwritten words of ``data``, each case bounded."""
    for _ in range(CASES):
        out = bytearray(data)
        kind = rng.integers(3)
        if kind == 0:
            out = out[:int(rng.integers(0, len(out)))]
        elif kind == 1:
            for at in rng.integers(0, len(out), int(rng.integers(1, 4))):
                out[int(at)] ^= 1 << int(rng.integers(8))
        else:
            at = int(rng.integers(0, max(1, len(out) - 4)))
            out[at:at + 4] = rng.integers(0, 256, 4, dtype=np.uint8).tobytes()
        yield bytes(out)


def feed(probe, data: bytes, rng: np.random.Generator):
    at = 0
    while at < len(data):  # pieces of any size, as blocks arrive
        step = int(rng.integers(1, 700))
        probe.feed(data[at:at + step])
        at += step
    try:
        return probe.finish()
    except ManifestError:
        return None


def test_mangled_shards_of_every_layout_are_refused_or_described_never_crash(tmp_path):
    rng = np.random.default_rng(19)
    shard = (FIXTURES / "mds" / "fixed" / "shard.00001.mds").read_bytes()
    entry = json.loads((FIXTURES / "mds" / "fixed" / "index.json").read_text())["shards"][1]
    column = TokenColumn("index.json", entry, None)
    assert feed(ShardProbe("s.mds", "index.json", entry, column), shard, rng).tokens == entry["samples"] * 64
    for data in mangled(shard, rng):
        feed(ShardProbe("s.mds", "index.json", entry, column), data, rng)

    chunk = (FIXTURES / "litdata" / "data" / "chunk-0-0.bin").read_bytes()
    listed = json.loads((FIXTURES / "litdata" / "data" / "index.json").read_text())["chunks"][0]
    assert feed(ChunkProbe("c.bin", "index.json", listed, "int32"), chunk, rng).tokens == listed["dim"]
    for data in mangled(chunk, rng):
        feed(ChunkProbe("c.bin", "index.json", listed, "int32"), data, rng)

    write_dataset(tmp_path / "ds", [np.arange(n, dtype=np.uint16) for n in (5, 9, 1, 30)])
    idx, bin_size = (tmp_path / "ds.idx").read_bytes(), (tmp_path / "ds.bin").stat().st_size
    for data in [idx, *mangled(idx, rng)]:
        try:
            header = IdxHeader("ds.idx", data[:34], len(data))
        except ManifestError:
            continue
        feed(IdxProbe("ds.idx", header, "ds.bin", bin_size), data, rng)

    sink = pa.BufferOutputStream()
    column_type = pa.list_(pa.int32())
    with pa.ipc.new_stream(sink, pa.schema([("input_ids", column_type), ("text", pa.string())])) as writer:
        for i in range(3):
            writer.write_batch(pa.record_batch([pa.array([[1, 2], [3]], column_type), pa.array(["a", "b"])],
                                               names=["input_ids", "text"]))
    stream = sink.getvalue().to_pybytes()
    assert feed(ArrowStreamProbe("d.arrow", None), stream, rng).tokens == 9
    for data in mangled(stream, rng):
        feed(ArrowStreamProbe("d.arrow", None), data, rng)
