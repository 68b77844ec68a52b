"""The decompressed form of a compressed blob, made into a real cache tier: checked, counted, remade, shared."""

from __future__ import annotations

import bz2
import gzip
import os
import threading

import numpy as np
import pyarrow as pa
import pytest
import xxhash

from stager.cache import BlobState, CacheTier
from stager.cache.inflate import InflatedForm, Inflater
from stager.cache.reader import VerifiedReads
from stager.errors import CorruptData

from .blobs import config

BLOCK = 16 * 1024


def raw_bytes(size: int = 5 * BLOCK + 123) -> bytes:
    return np.random.default_rng(5).integers(0, 50, size, dtype=np.uint8).tobytes()


def compress(codec: str, data: bytes) -> bytes:
    if codec == "gz":
        return gzip.compress(data)
    if codec == "bz2":
        return bz2.compress(data)
    return pa.Codec({"br": "brotli"}.get(codec, codec)).compress(data, asbytes=True)


def form(data: bytes, codec: str = "zstd", **changes) -> InflatedForm:
    values = dict(name="ds/shard.00000.mds.zstd", codec=codec, size=len(data), digest=xxhash.xxh3_128_hexdigest(data),
                  block_size=BLOCK)
    values.update(changes)
    return InflatedForm(**values)


def inflater(tier: CacheTier) -> Inflater:
    return Inflater(lambda: tier, tier.complete_path, VerifiedReads("first"))


@pytest.mark.parametrize("codec", ["zstd", "gz", "bz2", "br", "snappy"])
def test_made_once_into_the_cache_as_a_blob_of_its_own_then_reused(tmp_path, codec):
    data = raw_bytes()
    packed = compress(codec, data)
    calls = []
    with CacheTier(config(tmp_path / "cache", 1 << 20)) as tier:
        first = inflater(tier)
        out = first.open(form(data, codec), lambda: calls.append(1) or packed)
        assert bytes(out) == data and calls == [1] and first.stats.made == 1
        record = tier.record(form(data).digest)
        assert record is not None and record.state is BlobState.COMPLETE and record.size == len(data)
        assert tier.usage().used >= len(data)  # counted in the capacity like any blob
        again = inflater(tier)  # another process's view: found, checked, mapped; not decompressed again
        assert bytes(again.open(form(data, codec), lambda: calls.append(2) or packed)) == data
        assert calls == [1] and again.stats.reused == 1


def test_bytes_that_do_not_match_the_manifest_are_refused_and_nothing_is_written(tmp_path):
    data = raw_bytes()
    packed = compress("zstd", data)
    with CacheTier(config(tmp_path / "cache", 1 << 20)) as tier:
        lying = form(data, digest=xxhash.xxh3_128_hexdigest(b"other"))
        with pytest.raises(CorruptData, match="ds/shard.00000.mds.zstd: decompresses to bytes whose xxh3-128"):
            inflater(tier).open(lying, lambda: packed)
        with pytest.raises(CorruptData, match="does not decompress to the .* bytes the manifest says"):
            inflater(tier).open(form(data, size=len(data) - 1), lambda: packed)
        with pytest.raises(CorruptData, match="truncated|Truncated"):
            inflater(tier).open(form(data), lambda: packed[:-9])
        assert tier.usage().complete + tier.usage().partial == 0 and not any((tmp_path / "cache" / "blobs").rglob("*"))


def test_a_decompressed_file_changed_on_disk_is_dropped_and_made_again_never_served(tmp_path):
    data = raw_bytes()
    packed = compress("zstd", data)
    with CacheTier(config(tmp_path / "cache", 1 << 20)) as tier:
        inflater(tier).open(form(data), lambda: packed)
        path = tier.complete_path(form(data).digest)
        os.chmod(path, 0o644)
        with open(path, "r+b") as fh:  # one flipped byte, as a rotting disk would
            fh.seek(BLOCK + 7)
            byte = fh.read(1)
            fh.seek(BLOCK + 7)
            fh.write(bytes([byte[0] ^ 0x40]))
        fresh = inflater(tier)  # a new process: its first map of the file hashes it
        assert bytes(fresh.open(form(data), lambda: packed)) == data
        assert fresh.stats.remade == 1 and fresh.stats.made == 1
        assert path.read_bytes() == data  # the file on disk is a good one again (the inode may be reused)


def test_no_room_in_the_cache_means_decompressed_in_memory_checked_the_same_way(tmp_path):
    data = raw_bytes(20 * BLOCK)
    packed = compress("zstd", data)
    with CacheTier(config(tmp_path / "cache", 8 * BLOCK)) as tier:  # smaller than the decompressed shard
        made = inflater(tier)
        assert bytes(made.open(form(data), lambda: packed)) == data
        assert made.stats.in_memory == 1 and tier.usage().complete + tier.usage().partial == 0


def test_concurrent_consumers_decompress_once_and_all_read_the_same_bytes(tmp_path):
    data = raw_bytes(40 * BLOCK)
    packed = compress("zstd", data)
    calls, results, errors = [], [], []
    with CacheTier(config(tmp_path / "cache", 4 << 20)) as tier:
        start = threading.Barrier(4, timeout=10)

        def consumer() -> None:
            try:
                start.wait()
                results.append(bytes(inflater(tier).open(form(data), lambda: calls.append(1) or packed)))
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=consumer) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert not errors and len(results) == 4 and all(r == data for r in results)
        assert calls == [1]  # one decompressed; the others waited on the blob's lock and mapped its file


def parquet_file(tokens: np.ndarray, rows: int = 7) -> bytes:
    import pyarrow.parquet as pq

    docs = np.array_split(tokens, rows)
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"input_ids": pa.array([d.tolist() for d in docs], pa.list_(pa.int32()))}), sink,
                   row_group_size=2)
    return sink.getvalue().to_pybytes()


def test_a_parquet_token_column_is_decoded_once_into_flat_tokens_and_wrong_ones_are_refused(tmp_path):
    tokens = np.random.default_rng(9).integers(0, 1 << 20, 3 * BLOCK, dtype=np.int32)
    packed = parquet_file(tokens)
    decoded = form(tokens.astype("<i4").tobytes(), "parquet-tokens", name="ds/train-0.parquet", column="input_ids",
                   dtype="int32")
    calls = []
    with CacheTier(config(tmp_path / "cache", 1 << 20)) as tier:
        made = inflater(tier)
        out = made.open(decoded, lambda: calls.append(1) or packed)
        assert np.array_equal(np.frombuffer(out, "<i4"), tokens) and made.stats.made == 1
        assert tier.record(decoded.digest).state is BlobState.COMPLETE
        assert bytes(inflater(tier).open(decoded, lambda: calls.append(2) or packed)) == tokens.tobytes()
        assert calls == [1]
    with CacheTier(config(tmp_path / "other", 1 << 20)) as tier:
        with pytest.raises(CorruptData, match="ds/train-0.parquet: decompresses to bytes whose xxh3-128"):
            inflater(tier).open(form(tokens.tobytes(), "parquet-tokens", name="ds/train-0.parquet", column="input_ids",
                                     dtype="int32", digest=xxhash.xxh3_128_hexdigest(b"other")), lambda: packed)
        with pytest.raises(CorruptData, match="ds/train-0.parquet: its token column decodes to more than the 196604 "
                                              "bytes the manifest says"):
            inflater(tier).open(form(tokens.tobytes()[:-4], "parquet-tokens", name="ds/train-0.parquet",
                                     column="input_ids", dtype="int32"), lambda: packed)
        with pytest.raises(CorruptData, match="ds/train-0.parquet: its token column decodes to 196608 bytes, the "
                                              "manifest says 196612"):
            inflater(tier).open(form(tokens.tobytes() + b"\0" * 4, "parquet-tokens", name="ds/train-0.parquet",
                                     column="input_ids", dtype="int32"), lambda: packed)
        with pytest.raises(CorruptData, match="ds/train-0.parquet: column 'input_ids' holds int32 tokens, the "
                                              "manifest says int64"):
            inflater(tier).open(form(tokens.tobytes(), "parquet-tokens", name="ds/train-0.parquet", column="input_ids",
                                     dtype="int64"), lambda: packed)
        with pytest.raises(CorruptData, match="ds/train-0.parquet: cannot read column 'input_ids'"):
            inflater(tier).open(decoded, lambda: packed[: len(packed) // 2])
        assert tier.usage().complete + tier.usage().partial == 0


def test_a_form_made_ahead_is_what_open_returns_and_one_that_failed_ahead_is_made_again(tmp_path):
    data, other = raw_bytes(), raw_bytes(3 * BLOCK)
    packed, packed_other = compress("zstd", data), compress("zstd", other)
    calls = []
    gate = threading.Event()

    def slow():
        calls.append("ahead")
        assert gate.wait(10)
        return packed

    def failing():
        calls.append("failed ahead")
        raise OSError("gone")

    with CacheTier(config(tmp_path / "cache", 1 << 20)) as tier:
        made = inflater(tier)
        made.prepare([(form(data), slow), (form(other), failing)])
        made.prepare([(form(data), slow)])  # being made already: not a second time
        threading.Timer(0.2, gate.set).start()
        assert bytes(made.open(form(data), lambda: calls.append("open") or packed)) == data  # waited for it
        assert bytes(made.open(form(other), lambda: calls.append("open") or packed_other)) == other
        assert sorted(calls) == ["ahead", "failed ahead", "open"] and calls[-1] == "open"
        assert (made.stats.ahead, made.stats.made) == (1, 2)
        made.prepare([(form(data), slow)])  # in the cache already: nothing to make
        assert len(calls) == 3
