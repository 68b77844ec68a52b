"""Uncompressed LitData ``PyTreeLoader`` chunks (litdata's plain ``optimize(fn=..., output_dir=...)`` of a
function returning a token tensor), from a fixture written by litdata's own ``optimize``
(fixtures/make_litdata.py): every offset and size word checked at index time, each chunk's size words
taken out once into the cache (codec ``litdata-pytree``), its documents read bit-identical to litdata's
reader."""

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
#: The fixtures: a function returning an int32 tensor, and one returning {"input_ids": a uint16 array}.
DTYPES = {"data-pytree": "int32", "data-pytree-u16": "uint16"}


def copy(tmp_path, folder: str = "data-pytree") -> Path:
    data = tmp_path / folder
    shutil.copytree(FIXTURES / folder, data)
    return data


def native(folder: str = "data-pytree") -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """litdata's documents per chunk, concatenated, and the SEQ-token windows of each chunk's stream."""
    streams = dict(np.load(FIXTURES / f"expected-{folder.removeprefix('data-')}.npz"))
    return streams, [s[j:j + SEQ] for s in streams.values() for j in range(0, len(s) - SEQ + 1, SEQ)]


def rewrite_index(data: Path, change) -> None:
    index_json = json.loads((data / "index.json").read_text())
    change(index_json)
    (data / "index.json").write_text(json.dumps(index_json))


@pytest.mark.parametrize("folder", DTYPES)
def test_uncompressed_pytree_chunks_read_as_litdatas_documents_made_once_into_the_cache(tmp_path, capsys, folder):
    data = copy(tmp_path, folder)
    listed = json.loads((data / "index.json").read_text())
    assert listed["config"]["item_loader"] == "PyTreeLoader" and listed["config"]["compression"] is None
    manifest = index(data, capsys)
    streams, windows = native(folder)
    dtype = DTYPES[folder]
    for chunk in listed["chunks"]:
        i = manifest.index_of(chunk["filename"])
        assert (manifest.layouts[i], manifest.codecs[i], manifest.dtypes[i]) == ("litdata", "litdata-pytree", dtype)
        assert int(manifest.sizes[i]) == chunk["chunk_bytes"] == (data / chunk["filename"]).stat().st_size
        assert int(manifest.tokens[i]) == len(streams[chunk["filename"]])
        assert streams[chunk["filename"]].dtype == np.dtype(dtype)
        items = chunk["chunk_size"]
        assert int(manifest.raw_sizes[i]) == (items + 2) * 4 + streams[chunk["filename"]].nbytes
        assert int(manifest.raw_sizes[i]) == chunk["chunk_bytes"] - 4 * items  # the size words, taken out
    assert_decompressed_once_then_mapped(data, tmp_path / "cache", SEQ, manifest, windows, forms=4)


def test_windows_of_any_length_are_cut_from_each_chunks_documents_concatenated(tmp_path, capsys):
    """Documents concatenated per chunk, as the flat formats are: the tokens of every chunk once, in
    windows that never straddle two chunks."""
    data = copy(tmp_path)
    index(data, capsys)
    streams, _ = native()
    seq = 7
    want = [s[j:j + seq] for s in streams.values() for j in range(0, len(s) - seq + 1, seq)]
    assert_every_sample_once(epoch(data, tmp_path / "cache", seq), want)


def test_with_seq_len_a_documents_length_one_window_is_one_of_litdatas_items(tmp_path, capsys):
    data = copy(tmp_path, "data-pytree-fixed")
    index(data, capsys)
    streams, _ = native("data-pytree-fixed")
    items = list(np.concatenate(list(streams.values())).reshape(-1, 64))  # litdata's 40 items, 64 tokens each
    assert len(items) == 40
    assert_every_sample_once(epoch(data, tmp_path / "cache", 64), items)


def test_the_decoded_form_is_the_tokensloader_layout_of_litdatas_items():
    streams, _ = native()
    listed = json.loads((FIXTURES / "data-pytree" / "index.json").read_text())["chunks"]
    for chunk in listed:
        packed = (FIXTURES / "data-pytree" / chunk["filename"]).read_bytes()
        raw = b"".join(bytes(p) for p in unframe("litdata-pytree", packed))
        count = struct.unpack_from("<I", raw, 0)[0]
        offsets = np.frombuffer(raw, "<u4", count + 1, 4)
        assert count == chunk["chunk_size"] and offsets[0] == (count + 2) * 4 and offsets[-1] == len(raw)
        assert np.array_equal(np.frombuffer(raw, "<i4", offset=int(offsets[0])), streams[chunk["filename"]])
        pieces = list(decompress("litdata-pytree", packed, len(raw), piece=100))  # the cache's way: sized pieces
        assert b"".join(bytes(p) for p in pieces) == raw and max(len(p) for p in pieces) <= 100
        with pytest.raises(ValueError, match=f"decompresses to {len(raw)} bytes, not {len(raw) + 1}"):
            list(decompress("litdata-pytree", packed, len(raw) + 1))


def test_items_are_taken_a_piece_at_a_time_and_each_checked(monkeypatch):
    """The size words are taken out up to a piece of items at a time (memory stays at a piece), the
    pieces of long items and of short ones alike, and every word is checked before a byte is produced,
    the last item's too."""
    import stager.codecs as codecs

    monkeypatch.setattr(codecs, "PIECE", 1000)
    monkeypatch.setattr(codecs, "_JOINED", 0)  # every piece's items joined, as pieces of long items are
    packed = (FIXTURES / "data-pytree" / "chunk-0-0.bin").read_bytes()
    whole = list(unframe("litdata-pytree", packed))
    assert len(whole) > 3  # the header, then several pieces of items
    streams, _ = native()
    assert np.array_equal(np.frombuffer(b"".join(bytes(p) for p in whole[1:]), "<i4"), streams["chunk-0-0.bin"])
    offsets = np.frombuffer(packed, "<u4", 11, 4)
    bad = bytearray(packed)
    struct.pack_into("<I", bad, int(offsets[9]), struct.unpack_from("<I", packed, int(offsets[9]))[0] - 4)
    pieces = unframe("litdata-pytree", bytes(bad))
    with pytest.raises(ValueError, match="item 9 is "):
        next(pieces)
    monkeypatch.setattr(codecs, "_JOINED", 1 << 20)  # every piece masked, as pieces of short items are
    assert b"".join(bytes(p) for p in unframe("litdata-pytree", packed)) == b"".join(bytes(p) for p in whole)


def test_a_truncated_chunk_is_refused_naming_it(tmp_path, capsys):
    data = copy(tmp_path)
    chunk = data / "chunk-0-1.bin"
    good = chunk.read_bytes()
    chunk.write_bytes(good[:-8])
    line = refused(data, capsys)
    assert f"chunk-0-1.bin: {len(good) - 8} bytes, " in line and f"index.json says {len(good)} (truncated?)" in line
    rewrite_index(data, lambda j: j["chunks"][1].update(chunk_bytes=len(good) - 8))  # an index that agrees with it
    line = refused(data, capsys)
    assert line.startswith("stager: error: ") and "chunk-0-1.bin: its offsets run from 48 to " in line, line
    assert f"the file has {len(good) - 8} bytes" in line and "truncated" in line
    chunk.write_bytes(good[:30])  # cut inside the header
    rewrite_index(data, lambda j: j["chunks"][1].update(chunk_bytes=30))
    line = refused(data, capsys)
    assert "chunk-0-1.bin: 30 bytes, too short for the header of the 10 items" in line and "truncated" in line


def test_an_index_that_disagrees_with_a_chunk_is_refused_naming_it(tmp_path, capsys):
    data = copy(tmp_path)
    rewrite_index(data, lambda j: j["chunks"][2].update(chunk_size=9))
    line = refused(data, capsys)
    assert "chunk-0-2.bin: holds 10 items, " in line and "index.json says 9" in line, line
    rewrite_index(data, lambda j: j["chunks"][2].update(chunk_size=10, chunk_bytes=j["chunks"][2]["chunk_bytes"] + 4))
    assert "chunk-0-2.bin: 4720 bytes, " in (line := refused(data, capsys)) and "index.json says 4724" in line, line
    rewrite_index(data, lambda j: j["chunks"][2].update(chunk_bytes=4720))
    rewrite_index(data, lambda j: j["config"].update(data_format=["no_header_tensor:16", "no_header_tensor:16"]))
    line = refused(data, capsys)
    assert "index.json: its PyTreeLoader items hold 2 leaves" in line, line
    rewrite_index(data, lambda j: j["config"].update(data_format=["no_header_tensor:7"]))  # torch.float32
    assert "index.json: data format 'no_header_tensor:7' is not integer tokens" in refused(data, capsys)
    rewrite_index(data, lambda j: j["config"].update(data_format=["no_header_tensor:16"], compression="zstd",
                                                     compression_level="chunk"))
    line = refused(data, capsys)  # compressed whole: the decompressed chunk would still hold the size words
    assert "written with TokensLoader (one no_header_tensor or no_header_numpy item); this one has " \
           "'PyTreeLoader'" in line, line


def test_a_chunk_whose_size_words_or_offsets_disagree_is_refused_naming_it(tmp_path, capsys):
    data = copy(tmp_path)
    chunk = data / "chunk-0-2.bin"
    good = chunk.read_bytes()
    offsets = np.frombuffer(good, "<u4", 11, 4).astype(int)
    word = struct.unpack_from("<I", good, offsets[3])[0]
    assert word == offsets[4] - offsets[3] - 4

    def write(change) -> str:
        bad = bytearray(good)
        change(bad)
        chunk.write_bytes(bytes(bad))
        return refused(data, capsys)

    line = write(lambda b: struct.pack_into("<I", b, offsets[3], word + 4))  # item 3's size word
    assert f"chunk-0-2.bin: item 3 is {word + 4} bytes, its leaf size word says {word + 4} (+4)" in line, line
    line = write(lambda b: struct.pack_into("<I", b, 4 + 4 * 4, offsets[4] + 4))  # where item 3 ends, inside item 4
    assert f"chunk-0-2.bin: item 3 is {offsets[4] - offsets[3] + 4} bytes, its leaf size word says {word}" in line, line
    line = write(lambda b: struct.pack_into("<I", b, 4 + 4 * 4, offsets[2]))  # offsets that run back
    assert "chunk-0-2.bin: its offsets run from 48 to 4720" in line and "truncated or corrupt" in line, line

    def ragged(b: bytearray) -> None:  # item 3 a byte longer, item 4 a byte shorter, their words agreeing
        word4 = struct.unpack_from("<I", good, offsets[4])[0]
        b[offsets[3]:offsets[5]] = (struct.pack("<I", word + 1) + good[offsets[3] + 4:offsets[4]] + b"\0"
                                    + struct.pack("<I", word4 - 1) + good[offsets[4] + 4:offsets[5] - 1])
        struct.pack_into("<I", b, 4 + 4 * 4, offsets[4] + 1)

    line = write(ragged)
    assert f"chunk-0-2.bin: item 3's leaf holds {word + 1} bytes, not whole int32 tokens" in line, line
    def two_leaves(b: bytearray) -> None:  # item 0 as [u32 a][u32 b][a bytes][b bytes], as a dict of two is
        tokens = good[offsets[0] + 4:offsets[1]]
        b[offsets[0]:offsets[1]] = struct.pack("<II", 8, len(tokens) - 12) + tokens[:-4]

    line = write(two_leaves)
    assert f"chunk-0-2.bin: item 0 is {offsets[1] - offsets[0]} bytes, its leaf size word says 8 (+4): " \
           f"not one leaf, or corrupt" in line, line

def test_a_decoded_chunk_changed_on_the_cache_disk_is_made_again_never_served(tmp_path, capsys):
    data = copy(tmp_path)
    manifest = index(data, capsys)
    _, windows = native()
    assert_a_changed_decompressed_form_is_made_again(data, tmp_path / "cache", SEQ, manifest, windows, "chunk-0-2.bin")
