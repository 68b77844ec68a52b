"""MosaicML Streaming (MDS) datasets, from fixtures written by its own MDSWriter (fixtures/make_mds.py)."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from stager.errors import CorruptData

from .golden import assert_every_sample_once, epoch, index, refused

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "mds"
SEQ = 64
EXPECTED = dict(np.load(FIXTURE / "expected.npz"))  # MDSReader's samples, shard by shard, concatenated


def copy(tmp_path, name) -> Path:
    data = tmp_path / name
    shutil.copytree(FIXTURE / name, data)
    return data


def test_one_window_is_one_mds_sample_beside_other_columns(tmp_path, capsys):
    data = copy(tmp_path, "fixed")
    manifest = index(data, capsys)
    shards = [i for i, p in enumerate(manifest.paths) if p.endswith(".mds")]
    assert len(shards) == 4 and manifest.tokens[manifest.index_of("index.json")] == -1
    assert {(manifest.layouts[i], manifest.dtypes[i], manifest.columns[i]) for i in shards} == {("mds", "uint16", "tokens")}
    native = [row for key, tokens in EXPECTED.items() if key.startswith("fixed/") for row in tokens.reshape(-1, SEQ)]
    assert len(native) == 150
    assert_every_sample_once(epoch(data, tmp_path / "cache", SEQ), native)


def test_documents_of_any_length_concatenate_within_each_shard(tmp_path, capsys):
    data = copy(tmp_path, "documents")
    manifest = index(data, capsys, "--format", "mds")
    seq = 10
    native = []
    for key, stream in EXPECTED.items():
        if key.startswith("documents/"):
            assert int(manifest.tokens[manifest.index_of(key.split("/", 1)[1])]) == len(stream)
            native += [stream[i:i + seq] for i in range(0, len(stream) - seq + 1, seq)]
    assert_every_sample_once(epoch(data, tmp_path / "cache", seq), native)


def test_a_truncated_shard_a_wrong_hash_and_a_disagreeing_index_are_refused(tmp_path, capsys):
    data = copy(tmp_path, "fixed")
    shard = data / "shard.00001.mds"
    good = shard.read_bytes()
    shard.write_bytes(good[:-100])
    assert "shard.00001.mds: 5840 bytes, " in refused(data, capsys)
    bad = bytearray(good)
    bad[-1] ^= 1  # one token changed: the layout's own sha1 says so
    shard.write_bytes(bytes(bad))
    assert "shard.00001.mds: its sha1 is " in refused(data, capsys)
    shard.write_bytes(good)
    index_json = json.loads((data / "index.json").read_text())
    index_json["shards"][2]["samples"] += 1  # the failure MDS users meet mid-epoch as an IndexError
    (data / "index.json").write_text(json.dumps(index_json))
    line = refused(data, capsys)
    assert "shard.00002.mds: disagrees with " in line and "holds 38 samples, " in line
    index_json["shards"][2]["samples"] -= 1
    index_json["shards"][0]["zip_data"] = {"basename": "shard.00000.mds.lz9", "bytes": 10, "hashes": {}}
    index_json["shards"][0]["compression"] = "lz9"
    (data / "index.json").write_text(json.dumps(index_json))
    (data / "shard.00000.mds").rename(data / "shard.00000.mds.lz9")  # compressed only, as MDSWriter leaves it
    assert "shard shard.00000.mds.lz9: compression 'lz9' is not one stager decompresses" in refused(data, capsys)
    (data / "shard.00000.mds.lz9").rename(data / "shard.00000.mds")
    index_json["shards"][0]["zip_data"] = None
    (data / "index.json").write_text(json.dumps(index_json))
    assert "no token column input_ids" in refused(data, capsys, "--token-column", "input_ids")


def test_an_offset_table_that_points_past_its_shard_is_refused(tmp_path, capsys):
    data = copy(tmp_path, "documents")
    index_json = json.loads((data / "index.json").read_text())
    for shard in index_json["shards"]:
        shard["raw_data"]["hashes"] = {}
    shard = data / "shard.00000.mds"
    bad = bytearray(shard.read_bytes())
    count = struct.unpack_from("<I", bad, 0)[0]
    struct.pack_into("<I", bad, 4 * (count + 1), len(bad) + 40)  # the last sample ends past the file
    shard.write_bytes(bytes(bad))
    (data / "index.json").write_text(json.dumps(index_json))
    assert "shard.00000.mds: its samples end at byte" in refused(data, capsys)


def test_a_shard_changed_after_indexing_is_refused_at_stage_time_naming_it(tmp_path, capsys):
    data = copy(tmp_path, "fixed")
    index(data, capsys)
    shard = data / "shard.00002.mds"
    bad = bytearray(shard.read_bytes())
    bad[-3] ^= 0x40  # same size, other bytes: the manifest's digests catch it before any sample is cut
    shard.write_bytes(bytes(bad))
    with pytest.raises(CorruptData, match="shard.00002.mds"):
        epoch(data, tmp_path / "cache", SEQ, shuffle=False)


def _fixed_shard(samples: np.ndarray, *, cut: int = 0) -> bytes:
    """An MDS shard of one fixed-size uint16 column, laid out as MDSWriter lays one out."""
    n, seq = samples.shape
    config = json.dumps({"column_names": ["tokens"], "column_encodings": [f"ndarray:uint16:{seq}"],
                         "column_sizes": [seq * 2], "compression": None, "format": "mds", "hashes": [],
                         "size_limit": 1 << 26, "version": 2}).encode()
    offsets = 4 * (n + 2) + len(config) + np.arange(n + 1) * seq * 2
    data = struct.pack("<I", n) + offsets.astype("<u4").tobytes() + config + samples.astype("<u2").tobytes()
    return data[:len(data) - cut]


def test_fixed_size_samples_are_gathered_whole_and_a_short_one_is_refused():
    from stager.iterator.readers.mds import MdsReader

    samples = np.random.default_rng(7).integers(0, 60000, (300, 48), dtype=np.uint16)
    reader = MdsReader()
    shard = _fixed_shard(samples)
    tokens = reader.open(shard, "s.mds", "uint16", samples.size)
    assert np.array_equal(tokens, samples.ravel())
    # One fixed-size column: the samples' tokens lie back to back, read in place (no copy), as a flat shard.
    assert np.shares_memory(tokens, np.frombuffer(shard, np.uint8)) and not tokens.flags.writeable
    with pytest.raises(CorruptData, match="s.mds"):
        reader.open(_fixed_shard(samples, cut=2), "s.mds", "uint16", samples.size)


def _ragged_shard(docs: list[np.ndarray], header_bytes: list[int]) -> bytes:
    """An MDS shard of one variable-size uint16 column: each sample its size, its array header, its tokens."""
    config = json.dumps({"column_names": ["tokens"], "column_encodings": ["ndarray:uint16"], "column_sizes": [None],
                         "compression": None, "format": "mds", "hashes": [], "size_limit": 1 << 26,
                         "version": 2}).encode()
    samples = []
    for doc, byte in zip(docs, header_bytes):
        dim = struct.pack("<H" if byte % 4 == 1 else "<I", len(doc))
        body = bytes([byte]) + dim + doc.astype("<u2").tobytes()
        samples.append(struct.pack("<I", len(body)) + body)
    offsets = 4 * (len(docs) + 2) + len(config) + np.concatenate([[0], np.cumsum([len(s) for s in samples])])
    return struct.pack("<I", len(docs)) + offsets.astype("<u4").tobytes() + config + b"".join(samples)


def test_ragged_samples_read_alike_whether_their_array_headers_agree_and_a_bad_count_is_refused():
    from stager.iterator.readers.mds import MdsReader

    rng = np.random.default_rng(3)
    docs = [rng.integers(0, 60000, int(n), dtype=np.uint16) for n in rng.integers(1, 90, 40)]
    whole, reader = np.concatenate(docs), MdsReader()
    one_header = _ragged_shard(docs, [(1 << 2) | 2] * len(docs))  # every sample's header alike: read at once
    two_headers = _ragged_shard(docs, [(1 << 2) | 1] + [(1 << 2) | 2] * (len(docs) - 1))  # parsed one by one
    for data in (one_header, two_headers):
        assert np.array_equal(reader.open(data, "s.mds", "uint16", whole.size), whole)
    bad = bytearray(one_header)
    at = bad.index(bytes([(1 << 2) | 2]) + struct.pack("<I", len(docs[0])))
    bad[at + 1:at + 5] = struct.pack("<I", len(docs[0]) + 1)  # the shape says one token more than the bytes hold
    with pytest.raises(CorruptData, match="s.mds"):
        reader.open(bytes(bad), "s.mds", "uint16", whole.size)
