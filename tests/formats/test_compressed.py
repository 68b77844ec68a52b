"""Compressed MDS shards and LitData chunks, from fixtures written by the real writers with compression
(fixtures/make_mds.py: MDSWriter zstd:7, gz, bz2, br, snappy; fixtures/make_litdata.py: optimize zstd,
whole chunks): staged compressed, decompressed once into the cache and checked, read bit-identical to the
native readers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stager.cache import BlobState, CacheTier
from stager.config import CacheConfig

from .golden import as_multiset, assert_every_sample_once, epoch, index, refused

FIXTURES = Path(__file__).resolve().parent / "fixtures"
MDS_EXPECTED = dict(np.load(FIXTURES / "mds" / "expected.npz"))
SEQ = 64  # the zstd MDS fixture's fixed sample length
BLOCK = 32  # the TokensLoader block size of the LitData fixture


def copy(tmp_path, *parts) -> Path:
    data = tmp_path / parts[-1]
    shutil.copytree(FIXTURES.joinpath(*parts), data)
    return data


def decompressed_files(cache: Path, manifest) -> list[Path]:
    """The cache files of each compressed shard's decompressed form (complete blobs of their own)."""
    return [cache / "blobs" / d[:2] / d for i in range(len(manifest)) if (d := manifest.raw_digest(i))]


def test_zstd_mds_shards_read_as_their_samples_decompressed_once_into_the_cache(tmp_path, capsys):
    data = copy(tmp_path, "mds", "zstd")
    manifest = index(data, capsys)
    shards = [i for i, p in enumerate(manifest.paths) if p.endswith(".mds.zstd")]
    assert len(shards) == 3
    listed = {s["zip_data"]["basename"]: s for s in json.loads((data / "index.json").read_text())["shards"]}
    for i in shards:
        shard = listed[manifest.paths[i]]
        assert (manifest.layouts[i], manifest.codecs[i], manifest.dtypes[i]) == ("mds", "zstd", "uint16")
        assert int(manifest.sizes[i]) == shard["zip_data"]["bytes"]  # the shard is the compressed file
        assert int(manifest.raw_sizes[i]) == shard["raw_data"]["bytes"]
    native = [row for key, tokens in MDS_EXPECTED.items() if key.startswith("zstd/") for row in tokens.reshape(-1, SEQ)]
    assert len(native) == 120
    cache = tmp_path / "cache"
    assert_every_sample_once(epoch(data, cache, SEQ), native)
    made = decompressed_files(cache, manifest)
    assert len(made) == 3 and all(p.exists() for p in made)
    stamps = [p.stat().st_mtime_ns for p in made]
    with CacheTier(CacheConfig(directory=cache, capacity=1 << 30), reconcile=False) as tier:
        records = [tier.record(manifest.raw_digest(i)) for i in shards]
        assert all(r is not None and r.state is BlobState.COMPLETE for r in records)
        assert sorted(r.size for r in records) == sorted(int(manifest.raw_sizes[i]) for i in shards)
    assert_every_sample_once(epoch(data, cache, SEQ, epoch_number=1), native)  # warm: the same files, mapped
    assert [p.stat().st_mtime_ns for p in made] == stamps


@pytest.mark.parametrize("codec", ["gz", "bz2", "br", "snappy"])
def test_mds_shards_of_every_codec_concatenate_their_documents(tmp_path, capsys, codec):
    data = copy(tmp_path, "mds", codec)
    manifest = index(data, capsys, "--format", "mds")
    seq, native = 10, []
    for key, stream in MDS_EXPECTED.items():
        if key.startswith(f"{codec}/"):
            i = manifest.index_of(key.split("/", 1)[1])
            assert manifest.codecs[i] == codec and int(manifest.tokens[i]) == len(stream)
            native += [stream[j:j + seq] for j in range(0, len(stream) - seq + 1, seq)]
    assert native
    assert_every_sample_once(epoch(data, tmp_path / "cache", seq), native)


def test_zstd_litdata_chunks_read_as_tokensloader_samples(tmp_path, capsys):
    data = copy(tmp_path, "litdata", "data-zstd")
    manifest = index(data, capsys)
    for chunk in json.loads((data / "index.json").read_text())["chunks"]:
        i = manifest.index_of(chunk["filename"])
        assert chunk["filename"].endswith(".zstd.bin")
        assert (manifest.layouts[i], manifest.codecs[i], int(manifest.tokens[i])) == ("litdata", "zstd", chunk["dim"])
        assert int(manifest.raw_sizes[i]) == chunk["chunk_bytes"] > int(manifest.sizes[i])
    native = list(np.load(FIXTURES / "litdata" / "expected-zstd.npy"))  # litdata's own reader, in order
    assert_every_sample_once(epoch(data, tmp_path / "cache", BLOCK), native)


def test_a_truncated_compressed_shard_and_an_index_that_disagrees_with_it_are_refused(tmp_path, capsys):
    data = copy(tmp_path, "mds", "zstd")
    shard = data / "shard.00001.mds.zstd"
    good = shard.read_bytes()
    shard.write_bytes(good[:-50])
    assert f"shard.00001.mds.zstd: {len(good) - 50} bytes, " in refused(data, capsys)  # zip_data's size
    shard.write_bytes(good)
    original = (data / "index.json").read_text()
    index_json = json.loads(original)
    index_json["shards"][1]["zip_data"]["bytes"] -= 50
    index_json["shards"][1]["zip_data"]["hashes"] = {}
    (data / "index.json").write_text(json.dumps(index_json))
    shard.write_bytes(good[:-50])  # cut, and an index that agrees with the cut: the stream itself is short
    line = refused(data, capsys)
    assert "shard.00001.mds.zstd: not a whole zstd stream" in line and "truncated or corrupt?" in line
    shard.write_bytes(good)
    index_json = json.loads(original)
    index_json["shards"][2]["samples"] += 1  # the decompressed shard holds one sample fewer
    (data / "index.json").write_text(json.dumps(index_json))
    line = refused(data, capsys)
    assert "shard.00002.mds.zstd (decompressed): disagrees with " in line and "holds 38 samples, " in line
    index_json = json.loads(original)
    index_json["shards"][0]["raw_data"]["bytes"] += 100
    (data / "index.json").write_text(json.dumps(index_json))
    assert "shard.00000.mds.zstd: decompresses to 5963 bytes, not 6063" in refused(data, capsys)
    index_json = json.loads(original)
    index_json["shards"][0]["compression"] = "lz4:3"
    (data / "index.json").write_text(json.dumps(index_json))
    assert "shard.00000.mds.zstd: compression 'lz4:3' is not one stager decompresses" in refused(data, capsys)


def test_a_truncated_litdata_chunk_and_a_chunk_size_that_disagrees_are_refused(tmp_path, capsys):
    data = copy(tmp_path, "litdata", "data-zstd")
    chunk = data / "chunk-0-1.zstd.bin"
    good = chunk.read_bytes()
    chunk.write_bytes(good[:-20])
    assert "chunk-0-1.zstd.bin: not a whole zstd stream" in refused(data, capsys)
    chunk.write_bytes(good)
    index_json = json.loads((data / "index.json").read_text())
    index_json["chunks"][2]["chunk_bytes"] -= 4
    (data / "index.json").write_text(json.dumps(index_json))
    assert "chunk-0-2.zstd.bin: decompresses to more than 5152 bytes" in refused(data, capsys)


def test_a_decompressed_cache_file_changed_on_disk_is_detected_and_made_again(tmp_path, capsys):
    data = copy(tmp_path, "litdata", "data-zstd")
    manifest = index(data, capsys)
    native = list(np.load(FIXTURES / "litdata" / "expected-zstd.npy"))
    cache = tmp_path / "cache"
    assert_every_sample_once(epoch(data, cache, BLOCK), native)
    victim = decompressed_files(cache, manifest)[1]
    good = victim.read_bytes()
    os.chmod(victim, 0o644)
    with open(victim, "r+b") as fh:  # one flipped token byte, past the chunk's header
        fh.seek(len(good) - 3)
        fh.write(bytes([good[-3] ^ 0x01]))
    assert victim.read_bytes() != good
    # A new iterator (a new process's checks): the bad file is hashed, dropped, made again; never served.
    assert_every_sample_once(epoch(data, cache, BLOCK, epoch_number=1), native)
    assert victim.read_bytes() == good


WORKER = """
import sys, hashlib
from pathlib import Path
import numpy as np
from tests.formats.golden import epoch
samples = epoch(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
print(hashlib.sha256(b"".join(sorted(np.asarray(s).tobytes() for s in samples))).hexdigest(), len(samples))
"""


def test_consumers_in_two_processes_share_one_cache_without_racing(tmp_path, capsys):
    data = copy(tmp_path, "mds", "zstd")
    manifest = index(data, capsys)
    cache = tmp_path / "cache"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                       os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(data), str(cache), str(SEQ)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        outputs.append(out.split())
    native = [row for key, tokens in MDS_EXPECTED.items() if key.startswith("zstd/") for row in tokens.reshape(-1, SEQ)]
    import hashlib

    want = hashlib.sha256(b"".join(sorted(np.asarray(s).tobytes() for s in native))).hexdigest()
    assert outputs == [[want, str(len(native))]] * 2
    assert len(as_multiset(native)) == len(native)
    made = decompressed_files(cache, manifest)
    assert all(p.exists() for p in made) and not any((cache / "partial").glob("*"))


def test_a_cache_with_room_for_the_compressed_shards_only_is_refused_up_front(tmp_path, capsys):
    from stager.errors import ConfigError

    data = copy(tmp_path, "mds", "zstd")
    index(data, capsys)
    # two windows of two compressed shards fit in 20,000 bytes; with their decompressed forms they do not
    with pytest.raises(ConfigError, match="too small for shuffle_window=2"):
        epoch(data, tmp_path / "cache", SEQ, capacity=20_000)


def test_a_dataset_larger_than_the_cache_streams_through_it_decompressed_forms_and_all(tmp_path, capsys):
    data = copy(tmp_path, "mds", "zstd")
    index(data, capsys)
    native = [row for key, tokens in MDS_EXPECTED.items() if key.startswith("zstd/") for row in tokens.reshape(-1, SEQ)]
    cache = tmp_path / "cache"
    # room for two windows of one shard each (compressed and decompressed), not for the three shards' six blobs
    for number in range(2):
        samples = epoch(data, cache, SEQ, epoch_number=number, capacity=28_672, shuffle_window=1)
        assert_every_sample_once(samples, native)
    with CacheTier(CacheConfig(directory=cache, capacity=28_672), reconcile=False) as tier:
        assert tier.usage().used <= 28_672


def test_a_decompressed_mds_shard_beside_its_compressed_one_is_read_in_place(tmp_path, capsys):
    from stager.codecs import decompress

    data = copy(tmp_path, "mds", "zstd")
    shard = json.loads((data / "index.json").read_text())["shards"][0]
    packed = (data / shard["zip_data"]["basename"]).read_bytes()
    raw = b"".join(bytes(p) for p in decompress("zstd", packed, shard["raw_data"]["bytes"]))
    (data / shard["raw_data"]["basename"]).write_bytes(raw)  # as StreamingDataset leaves its local copy
    manifest = index(data, capsys)
    plain = manifest.index_of(shard["raw_data"]["basename"])
    assert (manifest.layouts[plain], manifest.codecs[plain], int(manifest.sizes[plain])) == ("mds", None, len(raw))
    assert manifest.tokens[manifest.index_of(shard["zip_data"]["basename"])] == -1  # a plain file beside it
    native = [row for key, tokens in MDS_EXPECTED.items() if key.startswith("zstd/") for row in tokens.reshape(-1, SEQ)]
    assert_every_sample_once(epoch(data, tmp_path / "cache", SEQ), native)
