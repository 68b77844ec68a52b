"""LitData optimized datasets (TokensLoader), from fixtures written by litdata itself (fixtures/make_litdata.py)."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np

from .golden import assert_every_sample_once, epoch, index, refused

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "litdata"
BLOCK = 32  # the TokensLoader block size the fixture's expected samples were read with


def copy(tmp_path) -> Path:
    data = tmp_path / "data"
    shutil.copytree(FIXTURE / "data", data)
    return data


def test_one_window_is_one_tokensloader_sample(tmp_path, capsys):
    data = copy(tmp_path)
    manifest = index(data, capsys)
    listed = json.loads((data / "index.json").read_text())["chunks"]
    for chunk in listed:
        i = manifest.index_of(chunk["filename"])
        assert (manifest.layouts[i], manifest.dtypes[i], int(manifest.tokens[i])) == ("litdata", "int32", chunk["dim"])
    assert manifest.tokens[manifest.index_of("index.json")] == -1
    native = list(np.load(FIXTURE / "expected.npy"))  # litdata's StreamingDataset, in order
    assert_every_sample_once(epoch(data, tmp_path / "cache", BLOCK), native)


def test_a_truncated_chunk_and_an_index_that_disagrees_are_refused(tmp_path, capsys):
    data = copy(tmp_path)
    chunk = data / "chunk-0-1.bin"
    good = chunk.read_bytes()
    chunk.write_bytes(good[:-8])
    line = refused(data, capsys)
    assert "chunk-0-1.bin: its offsets run from" in line and "truncated" in line
    chunk.write_bytes(good)
    bad = bytearray(good)
    struct.pack_into("<I", bad, 0, 3)  # the header's item count no longer matches index.json
    chunk.write_bytes(bytes(bad))
    assert "chunk-0-1.bin: holds 3 items, " in refused(data, capsys)
    chunk.write_bytes(good)
    index_json = json.loads((data / "index.json").read_text())
    index_json["chunks"][2]["dim"] += 5
    (data / "index.json").write_text(json.dumps(index_json))
    assert "chunk-0-2.bin: 5156 bytes, " in refused(data, capsys)
    index_json["chunks"][2]["dim"] -= 5
    # zstd frames inside each chunk, which litdata writes for PyTreeLoader chunks only (test_litdata_framed.py)
    index_json["config"].update(compression="zstd", compression_level="batch")
    (data / "index.json").write_text(json.dumps(index_json))
    assert "index.json: a LitData dataset stager reads with zstd frames is written with PyTreeLoader" \
        in refused(data, capsys)
    index_json["config"].update(compression=None, compression_level=None, encryption={"algorithm": "fernet"})
    (data / "index.json").write_text(json.dumps(index_json))
    assert "index.json: encrypted LitData chunks are not supported" in refused(data, capsys)
    index_json["config"]["encryption"] = None
    index_json["chunks"][0]["filename"] = "chunk-9-9.bin"
    (data / "index.json").write_text(json.dumps(index_json))
    assert "index.json: lists chunk-9-9.bin, which is not there" in refused(data, capsys)
