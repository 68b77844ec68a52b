"""LitData chunks of zstd frames (litdata's default for ``compression="zstd"``: ``compression_level``
``batch``, and ``sample``), from fixtures written by litdata's own ``optimize`` with its default
``PyTreeLoader`` (fixtures/make_litdata.py): every frame checked at index time, each chunk decompressed
once into the cache in the TokensLoader layout, its documents read bit-identical to litdata's reader."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from stager.codecs import decompress, unframe

from .golden import (assert_a_changed_decompressed_form_is_made_again, assert_decompressed_once_then_mapped,
                     assert_every_sample_once, epoch, index, refused)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "litdata"
SEQ = 16
LEVELS = ["batch", "sample"]


def copy(tmp_path, level: str) -> Path:
    data = tmp_path / f"data-{level}"
    shutil.copytree(FIXTURES / f"data-{level}", data)
    return data


def native(level: str) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """litdata's documents per chunk, concatenated, and the SEQ-token windows of each chunk's stream."""
    streams = dict(np.load(FIXTURES / f"expected-{level}.npz"))
    return streams, [s[j:j + SEQ] for s in streams.values() for j in range(0, len(s) - SEQ + 1, SEQ)]


@pytest.mark.parametrize("level", LEVELS)
def test_framed_chunks_read_as_litdatas_documents_decompressed_once_into_the_cache(tmp_path, capsys, level):
    data = copy(tmp_path, level)
    listed = json.loads((data / "index.json").read_text())
    assert listed["config"]["compression_level"] == level and listed["config"]["item_loader"] == "PyTreeLoader"
    manifest = index(data, capsys)
    streams, windows = native(level)
    for chunk in listed["chunks"]:
        i = manifest.index_of(chunk["filename"])
        assert (manifest.layouts[i], manifest.codecs[i], manifest.dtypes[i]) == ("litdata", f"zstd-{level}", "int32")
        assert int(manifest.sizes[i]) == chunk["chunk_bytes"]  # the shard is the file as litdata wrote it
        assert int(manifest.tokens[i]) == len(streams[chunk["filename"]])
        items = chunk["chunk_size"]
        assert int(manifest.raw_sizes[i]) == (items + 2) * 4 + 4 * len(streams[chunk["filename"]])
    assert_decompressed_once_then_mapped(data, tmp_path / "cache", SEQ, manifest, windows, forms=4)


@pytest.mark.parametrize("level", LEVELS)
def test_the_decompressed_form_is_the_tokensloader_layout_of_litdatas_items(level):
    streams, _ = native(level)
    listed = json.loads((FIXTURES / f"data-{level}" / "index.json").read_text())["chunks"]
    for chunk in listed:
        packed = (FIXTURES / f"data-{level}" / chunk["filename"]).read_bytes()
        raw = b"".join(bytes(p) for p in unframe(f"zstd-{level}", packed))
        count = struct.unpack_from("<I", raw, 0)[0]
        offsets = np.frombuffer(raw, "<u4", count + 1, 4)
        assert count == chunk["chunk_size"] and offsets[0] == (count + 2) * 4 and offsets[-1] == len(raw)
        assert np.array_equal(np.frombuffer(raw, "<i4", offset=int(offsets[0])), streams[chunk["filename"]])
        pieces = list(decompress(f"zstd-{level}", packed, len(raw), piece=100))  # the cache's way: sized pieces
        assert b"".join(bytes(p) for p in pieces) == raw and max(len(p) for p in pieces) <= 100
        with pytest.raises(ValueError, match=f"decompresses to {len(raw)} bytes, not {len(raw) + 1}"):
            list(decompress(f"zstd-{level}", packed, len(raw) + 1))


@pytest.mark.parametrize("level", LEVELS)
def test_a_truncated_framed_chunk_is_refused_naming_it(tmp_path, capsys, level):
    data = copy(tmp_path, level)
    chunk = data / "chunk-0-1.bin"
    good = chunk.read_bytes()
    chunk.write_bytes(good[:-20])
    line = refused(data, capsys)
    assert f"chunk-0-1.bin: {len(good) - 20} bytes, " in line and f"index.json says {len(good)} (truncated?)" in line
    index_json = json.loads((data / "index.json").read_text())
    index_json["chunks"][1]["chunk_bytes"] -= 20  # an index that agrees with the cut: the frames themselves are short
    (data / "index.json").write_text(json.dumps(index_json))
    line = refused(data, capsys)
    assert line.startswith("stager: error: ") and "chunk-0-1.bin: " in line and "truncated" in line
    want = "frame 2 lies at bytes " if level == "batch" else "its offsets run from "
    assert want in line, line
    chunk.write_bytes(good[:30])  # cut inside the header or the frame table
    index_json["chunks"][1]["chunk_bytes"] = 30
    (data / "index.json").write_text(json.dumps(index_json))
    line = refused(data, capsys)
    assert "chunk-0-1.bin: 30 bytes, too short for the " in line and "truncated" in line


def test_a_frame_table_that_disagrees_is_refused_naming_the_chunk(tmp_path, capsys):
    data = copy(tmp_path, "batch")
    chunk = data / "chunk-0-2.bin"
    good = chunk.read_bytes()
    items, rows, frames = struct.unpack_from("<III", good, 12)
    assert (items, rows, frames) == (10, 4, 3)
    table = 24 + 4 * (items + 1)
    for field, value, want in [(4, 3, "frame 1 says items 4+3 of "),  # n_items
                               (0, 5, "frame 1 says items 5+4 of "),  # first_item
                               (20, 7, "frame 1 says items 4+4 of 7 bytes, its header's offsets say items 4+4 of "),
                               (8, 30, "frame 1 lies at bytes 30..")]:  # compressed_off before the frame data
        bad = bytearray(good)
        struct.pack_into("<Q" if field == 8 else "<I", bad, table + 24 + field, value)
        chunk.write_bytes(bytes(bad))
        line = refused(data, capsys)
        assert f"chunk-0-2.bin: {want}" in line, line
    for item, want in [(4, "frame 0 says items 0+4 of "),  # where frame 0 ends
                       (3, "item 2 is ")]:  # inside frame 0: item 2 no longer ends where its size word says
        bad = bytearray(good)
        struct.pack_into("<I", bad, 24 + 4 * item, struct.unpack_from("<I", good, 24 + 4 * item)[0] + 1)
        chunk.write_bytes(bytes(bad))
        assert f"chunk-0-2.bin: {want}" in refused(data, capsys)
    bad = bytearray(good)
    bad[struct.unpack_from("<Q", good, table + 2 * 24 + 8)[0]] ^= 0xFF  # the last frame's zstd magic
    chunk.write_bytes(bytes(bad))
    assert "chunk-0-2.bin: frame 2 " in refused(data, capsys)
    chunk.write_bytes(good)
    index_json = json.loads((data / "index.json").read_text())
    index_json["chunks"][2]["chunk_size"] = 9  # the frame table holds 10 items
    (data / "index.json").write_text(json.dumps(index_json))
    line = refused(data, capsys)
    assert "chunk-0-2.bin (decompressed): holds 10 items, " in line and "index.json says 9" in line


def test_a_sample_chunk_that_disagrees_is_refused_naming_it(tmp_path, capsys):
    data = copy(tmp_path, "sample")
    chunk = data / "chunk-0-0.bin"
    good = chunk.read_bytes()
    bad = bytearray(good)
    struct.pack_into("<I", bad, 8, struct.unpack_from("<I", good, 8)[0] + 3)  # item 0's end: inside item 1's frame
    chunk.write_bytes(bytes(bad))
    assert "chunk-0-0.bin: " in (line := refused(data, capsys)) and "zstd" in line, line
    bad = bytearray(good)
    bad[struct.unpack_from("<I", good, 4)[0]] ^= 0xFF  # item 0's zstd magic
    chunk.write_bytes(bytes(bad))
    assert "chunk-0-0.bin: an item is not a zstd frame: not a zstd frame" in refused(data, capsys)
    chunk.write_bytes(good)
    index_json = json.loads((data / "index.json").read_text())
    index_json["chunks"][0]["chunk_size"] = 11
    (data / "index.json").write_text(json.dumps(index_json))
    line = refused(data, capsys)
    assert "chunk-0-0.bin (decompressed): holds 10 items, " in line and "index.json says 11" in line


def test_what_litdata_does_not_write_with_frames_is_refused(tmp_path, capsys):
    data = copy(tmp_path, "batch")
    original = json.loads((data / "index.json").read_text())
    for change, want in [({"item_loader": "TokensLoader"}, "written with PyTreeLoader, one no_header_tensor or "
                                                          "no_header_numpy leaf per item; this one has 'TokensLoader'"),
                         ({"data_format": ["no_header_tensor:16", "int"]}, "this one has 'PyTreeLoader' and "),
                         ({"compression": "gz"}, "compression_level 'batch' with compression 'gz'"),
                         ({"compression_level": "frame"}, "compression_level 'frame' is none of chunk, batch, sample"),
                         # read as uncompressed PyTreeLoader chunks (test_litdata_pytree.py): the frame table's
                         # magic is no item count
                         ({"compression": None, "compression_level": None},
                          "bytes, too short for the header of the 1514554444 items it says it holds (truncated)")]:
        index_json = json.loads(json.dumps(original))
        index_json["config"].update(change)
        (data / "index.json").write_text(json.dumps(index_json))
        assert want in refused(data, capsys)


def test_a_decompressed_framed_chunk_changed_on_the_cache_disk_is_made_again_never_served(tmp_path, capsys):
    data = copy(tmp_path, "sample")
    manifest = index(data, capsys)
    _, windows = native("sample")
    assert_a_changed_decompressed_form_is_made_again(data, tmp_path / "cache", SEQ, manifest, windows, "chunk-0-2.bin")


def test_sample_items_whose_zstd_frames_record_no_size_are_read_too(tmp_path, capsys):
    """litdata's zstd frames say their size; a streaming zstd writer's do not: the items are then
    decompressed to learn it (and still checked)."""
    import pyarrow as pa

    data = copy(tmp_path, "sample")
    chunk = data / "chunk-0-3.bin"
    good = chunk.read_bytes()
    count = struct.unpack_from("<I", good, 0)[0]
    offsets = np.frombuffer(good, "<u4", count + 1, 4)
    items = []
    for a, b in zip(offsets[:-1], offsets[1:]):
        raw = pa.CompressedInputStream(pa.BufferReader(good[a:b]), "zstd").read()
        sink = pa.BufferOutputStream()
        with pa.CompressedOutputStream(sink, "zstd") as out:
            out.write(raw)
        items.append(sink.getvalue().to_pybytes())
    start = (count + 2) * 4
    table = np.cumsum([start] + [len(i) for i in items]).astype("<u4")
    assert items[0][4] & 0xC0 == 0 and not items[0][4] & 0x20  # no content size in these frames' headers
    chunk.write_bytes(struct.pack("<I", count) + table.tobytes() + b"".join(items))
    index_json = json.loads((data / "index.json").read_text())
    index_json["chunks"][3]["chunk_bytes"] = chunk.stat().st_size
    (data / "index.json").write_text(json.dumps(index_json))
    manifest = index(data, capsys)
    streams, windows = native("sample")
    assert int(manifest.tokens[manifest.index_of("chunk-0-3.bin")]) == len(streams["chunk-0-3.bin"])
    assert_every_sample_once(epoch(data, tmp_path / "cache", SEQ), windows)
