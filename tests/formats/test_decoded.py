"""Parquet and Arrow token columns decoded once into the cache (codecs ``parquet-tokens``, ``arrow-tokens``),
then mapped as flat tokens: the same samples as the column readers, the decoded form checked and reused."""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xxhash

from stager.cache import BlobState, CacheTier
from stager.config import CacheConfig
from stager.manifest import MANIFEST_PATH, Manifest
from stager.manifest.parquet import encode_manifest

from .golden import assert_every_sample_once, epoch, index

SEQ = 16


def documents(rng, count, dtype):
    return [rng.integers(0, 30000, int(rng.integers(0, 50)), dtype=dtype) for _ in range(count)]


def write_parquet(data, shards=3, dtype="int32", column="input_ids"):
    """Documents of any length (empty and null ones too) in several row groups per file, as the Hub's exports."""
    data.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    streams = []
    for i in range(shards):
        docs = documents(rng, 300, dtype)
        rows = [None if j % 37 == 5 else d.tolist() for j, d in enumerate(docs)]
        table = pa.table({"text": [str(j) for j in range(len(rows))],
                          column: pa.array(rows, pa.list_(pa.from_numpy_dtype(np.dtype(dtype))))})
        pq.write_table(table, data / f"train-{i:05d}-of-{shards:05d}.parquet", row_group_size=64, compression="zstd")
        streams.append(np.concatenate([d for j, d in enumerate(docs) if j % 37 != 5]).astype(dtype))
    return streams


def write_arrow(data, shards=3, dtype="uint16", file_format=False):
    """Arrow IPC streams (or files) of many small record batches, as ``save_to_disk`` writes 1,000-row ones."""
    data.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(11)
    streams = []
    for i in range(shards):
        docs = documents(rng, 250, dtype)
        schema = pa.schema([("input_ids", pa.list_(pa.from_numpy_dtype(np.dtype(dtype)))), ("n", pa.int64())])
        path = data / f"data-{i:05d}-of-{shards:05d}.arrow"
        with pa.OSFile(str(path), "wb") as sink:
            writer = (pa.ipc.new_file if file_format else pa.ipc.new_stream)(sink, schema)
            for start in range(0, len(docs), 40):
                part = docs[start:start + 40]
                writer.write_batch(pa.record_batch([pa.array([d.tolist() for d in part], schema.field(0).type),
                                                    pa.array(range(len(part)))], schema=schema))
            writer.close()
        streams.append(np.concatenate(docs).astype(dtype))
    return streams


def windows(streams, seq=SEQ):
    """Each shard's tokens cut into ``seq``-token samples, as the iterator cuts a token stream."""
    return [s[j:j + seq] for s in streams for j in range(0, len(s) - seq + 1, seq)]


def decoded_files(cache, manifest):
    return [cache / "blobs" / d[:2] / d for i in range(len(manifest)) if (d := manifest.raw_digest(i))]


def without_decoding(data, manifest):
    """The dataset's manifest as a stager that did not decode token columns wrote it (no codec)."""
    old = Manifest.from_entries((replace(e, codec=None, raw_size=None, raw_digest=None) for e in manifest),
                                manifest.block_size)
    (data / MANIFEST_PATH).write_bytes(encode_manifest(old))
    return old


@pytest.mark.parametrize("kind", ["parquet", "arrow stream", "arrow file"])
def test_a_token_column_is_decoded_once_into_the_cache_and_read_as_the_column_readers_read_it(tmp_path, capsys, kind):
    data = tmp_path / "data"
    if kind == "parquet":
        streams, codec, dtype = write_parquet(data), "parquet-tokens", "int32"
    else:
        streams, codec, dtype = write_arrow(data, file_format=kind == "arrow file"), "arrow-tokens", "uint16"
    manifest = index(data, capsys)
    shards = [i for i in range(len(manifest)) if manifest.tokens[i] >= 0]
    assert len(shards) == 3
    for i, stream in zip(shards, streams):
        assert (manifest.codecs[i], manifest.dtypes[i], manifest.columns[i]) == (codec, dtype, "input_ids")
        assert int(manifest.tokens[i]) == len(stream)
        # The flat tokens, not the file; every token below 2**16, so held as uint16 (int32's half).
        assert int(manifest.raw_sizes[i]) == 2 * len(stream)
        assert manifest.stored_dtype(i) == "uint16"
        assert manifest.raw_digest(i) == xxhash.xxh3_128_hexdigest(stream.astype("<u2").tobytes())
    cache = tmp_path / "cache"
    native = windows(streams)
    first = epoch(data, cache, SEQ)
    assert {sample.dtype for sample in first} == {np.dtype(dtype)}  # the column's dtype, whatever the form
    assert_every_sample_once(first, native)
    made = decoded_files(cache, manifest)
    assert len(made) == 3 and all(p.exists() for p in made)
    stamps = [p.stat().st_mtime_ns for p in made]
    with CacheTier(CacheConfig(directory=cache, capacity=1 << 30), reconcile=False) as tier:
        records = [tier.record(manifest.raw_digest(i)) for i in shards]
        assert all(r is not None and r.state is BlobState.COMPLETE for r in records)  # a blob of its own
        assert sorted(r.size for r in records) == sorted(2 * len(s) for s in streams)
    assert_every_sample_once(epoch(data, cache, SEQ, epoch_number=1), native)  # warm: mapped, not made again
    assert [p.stat().st_mtime_ns for p in made] == stamps
    # A manifest without the decoding (an older stager's) is read by the column readers: the same samples.
    without_decoding(data, manifest)
    assert_every_sample_once(epoch(data, tmp_path / "old-cache", SEQ), native)
    assert not any((tmp_path / "old-cache" / "blobs" / d[:2] / d).exists()
                   for d in (manifest.raw_digest(i) for i in shards))


def test_a_decoded_form_changed_on_the_cache_disk_is_dropped_and_decoded_again(tmp_path, capsys):
    data = tmp_path / "data"
    streams = write_parquet(data)
    manifest = index(data, capsys)
    cache = tmp_path / "cache"
    native = windows(streams)
    assert_every_sample_once(epoch(data, cache, SEQ), native)
    victim = decoded_files(cache, manifest)[1]
    good = victim.read_bytes()
    os.chmod(victim, 0o644)
    with open(victim, "r+b") as fh:  # one flipped token byte
        fh.seek(len(good) // 2)
        fh.write(bytes([good[len(good) // 2] ^ 0x01]))
    # A new iterator (a new process's checks): the bad file is hashed, dropped, decoded again; never served.
    assert_every_sample_once(epoch(data, cache, SEQ, epoch_number=1), native)
    assert victim.read_bytes() == good



def test_the_next_windows_decoded_forms_are_made_ahead_of_their_first_read(tmp_path, capsys):
    from stager.iterator import TokenIterator

    from .golden import FETCH

    data = tmp_path / "data"
    streams = write_parquet(data)
    index(data, capsys)
    # One shard a window: each window's shard is decoded while the one before it is read.
    with TokenIterator(str(data), seq_len=SEQ, seed=3, shuffle_window=1, cache_dir=tmp_path / "cache",
                       capacity=1 << 30, fetch=FETCH, log_every=0, session="embedded") as it:
        samples = [np.array(s) for s in it]
        stats = it._inflater.stats
    assert_every_sample_once(samples, windows(streams))
    assert (stats.made, stats.ahead) == (3, 2)  # the first window's was made at its read, the others ahead


def write_parquet_of(data, streams, dtype, name="train"):
    """One Parquet file per stream, its tokens as rows of 100 (row groups of 4 rows)."""
    data.mkdir(parents=True, exist_ok=True)
    for i, stream in enumerate(streams):
        rows = [stream[j:j + 100].tolist() for j in range(0, len(stream), 100)]
        table = pa.table({"input_ids": pa.array(rows, pa.list_(pa.from_numpy_dtype(np.dtype(dtype))))})
        pq.write_table(table, data / f"{name}-{i:05d}.parquet", row_group_size=4)


@pytest.mark.parametrize("dtype, top, form", [
    ("int32", 65535, "uint16"),      # every token fits 16 bits
    ("int32", 65536, "int32"),       # one token (in the last row group) does not
    ("int64", 1 << 20, "uint32"),    # a 64-bit column of a 20-bit vocabulary
    ("int64", 1000, "uint16"),
    ("int32", -1, "int32"),          # a negative id: kept as the column holds it
])
def test_a_decoded_column_is_held_in_the_narrowest_form_that_holds_every_token_and_yields_its_own_dtype(
        tmp_path, capsys, dtype, top, form):
    rng = np.random.default_rng(5)
    streams = [rng.integers(0, 60000, 1600).astype(dtype) for _ in range(2)]
    streams[1][-3] = top  # the last row group of the last file
    data = tmp_path / "data"
    write_parquet_of(data, streams, dtype)
    manifest = index(data, capsys)
    shards = [i for i in range(len(manifest)) if manifest.tokens[i] >= 0]
    held = [manifest.stored_dtype(i) for i in shards]
    assert held == ["uint16", form]  # the first file's tokens all fit 16 bits
    for i, stream, kind in zip(shards, streams, held):
        assert int(manifest.raw_sizes[i]) == len(stream) * np.dtype(kind).itemsize
        assert manifest.raw_digest(i) == xxhash.xxh3_128_hexdigest(stream.astype(np.dtype(kind).newbyteorder("<")).tobytes())
    samples = epoch(data, tmp_path / "cache", SEQ)
    assert_every_sample_once(samples, windows(streams))  # values and dtype: the column's, bit for bit
    # Batches too (the form is widened into the batch).
    from stager.iterator import TokenIterator

    from .golden import FETCH

    with TokenIterator(str(data), seq_len=SEQ, batch_size=7, batches=True, seed=3, cache_dir=tmp_path / "cache",
                       capacity=1 << 30, fetch=FETCH, log_every=0, session="embedded") as it:
        batches = [np.array(b) for b in it]
    assert {b.dtype for b in batches} == {np.dtype(dtype)}
    assert_every_sample_once([row for b in batches for row in b], windows(streams))


def test_a_manifest_whose_decoded_size_is_no_form_of_its_tokens_is_refused_naming_the_shard(tmp_path, capsys):
    from stager.errors import ManifestError
    from stager.manifest import read_manifest_file

    data = tmp_path / "data"
    write_parquet(data)
    manifest = index(data, capsys)
    row = next(i for i in range(len(manifest)) if manifest.codecs[i] == "parquet-tokens")
    raw = manifest.table.column("raw_size").to_pylist()
    raw[row] = 3 * int(manifest.tokens[row])  # three bytes a token: no form of int32
    table = manifest.table.set_column(manifest.table.schema.get_field_index("raw_size"), "raw_size",
                                      pa.array(raw, pa.int64()))
    (data / MANIFEST_PATH).write_bytes(encode_manifest(Manifest(table, manifest.block_size)))
    with pytest.raises(ManifestError) as caught:
        read_manifest_file(str(data / MANIFEST_PATH))
    message = str(caught.value)
    assert manifest.paths[row] in message and "raw_size" in message and "\n" not in message
