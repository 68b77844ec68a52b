"""Manifest files: round trip, and every kind of bad manifest refused with a clear message."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stager.errors import ManifestError
from stager.hashing import blob_digest, block_digest
from stager.manifest import SCHEMA, Manifest, ShardEntry, decode_manifest, encode_manifest

BS = 4096


def entry(path: str, data: bytes, **kw) -> ShardEntry:
    blocks = tuple(block_digest(data[i:i + BS]) for i in range(0, len(data), BS))
    return ShardEntry(path, len(data), blob_digest(data), blocks, **kw)


def good_manifest() -> Manifest:
    rng = np.random.default_rng(1)
    entries = [entry(f"train/{i:03d}.bin", rng.bytes(int(n)), dtype="uint16", tokens=int(n) // 2)
               for i, n in enumerate([0, 10, 4096, 4098, 20000])]
    return Manifest.from_entries(entries, BS)


def table_with(manifest: Manifest, **columns) -> bytes:
    table = manifest.table
    for name, values in columns.items():
        table = table.set_column(table.schema.get_field_index(name), SCHEMA.field(name), pa.array(values, SCHEMA.field(name).type))
    return encode_manifest(Manifest(table, manifest.block_size))


def test_round_trip_keeps_every_field():
    m = good_manifest()
    back = decode_manifest(encode_manifest(m), "m.parquet")
    assert list(back) == list(m)
    assert back.block_size == BS
    assert back.total_bytes == sum(e.size for e in m)
    assert back.index_of("train/002.bin") == 2
    assert back[3].blocks == m[3].blocks and len(back[3].blocks) == 2


@pytest.mark.parametrize("bad_path", ["../etc/passwd", "/abs/file", "a/../../b", "a//b", "", "a/./b", "dir/", "x\x00y", "."])
def test_unsafe_paths_are_refused_naming_the_entry(bad_path):
    m = good_manifest()
    paths = m.paths
    paths[3] = bad_path
    with pytest.raises(ManifestError, match=r"m\.parquet: entry 3 .*path"):
        decode_manifest(table_with(m, path=paths), "m.parquet")


def test_duplicate_paths_are_refused():
    m = good_manifest()
    paths = m.paths
    paths[4] = paths[1]
    with pytest.raises(ManifestError, match="duplicate path"):
        decode_manifest(table_with(m, path=paths), "m.parquet")


def test_unsorted_but_unique_paths_load():
    m = good_manifest()
    paths = list(reversed(m.paths))
    assert len(decode_manifest(table_with(m, path=paths), "m.parquet")) == len(m)


def test_wrong_block_digest_count_is_refused():
    m = good_manifest()
    blocks = [list(m.block_digests(i)) for i in range(len(m))]
    blocks[4] = blocks[4][:-1]
    with pytest.raises(ManifestError, match="entry 4 .*block digests"):
        decode_manifest(table_with(m, blocks=blocks), "m.parquet")


@pytest.mark.parametrize("size", [-1, 1 << 60])
def test_negative_or_absurd_sizes_are_refused(size):
    m = good_manifest()
    sizes = list(m.sizes)
    sizes[2] = size
    with pytest.raises(ManifestError, match="entry 2 .*size"):
        decode_manifest(table_with(m, size=sizes), "m.parquet")


def test_impossible_token_counts_are_refused():
    m = good_manifest()
    tokens = [int(t) for t in m.tokens]
    tokens[2] = 10**12
    with pytest.raises(ManifestError, match="entry 2 .*token count"):
        decode_manifest(table_with(m, tokens=tokens), "m.parquet")


def test_unknown_dtype_is_refused():
    m = good_manifest()
    with pytest.raises(ManifestError, match="unknown dtype"):
        decode_manifest(table_with(m, dtype=["uint16", "uint16", "float128", "uint16", "uint16"]), "m.parquet")


def test_truncated_file_is_refused():
    data = encode_manifest(good_manifest())
    for cut in (0, 10, len(data) // 2, len(data) - 1):
        with pytest.raises(ManifestError, match="m.parquet: "):
            decode_manifest(data[:cut], "m.parquet")


def test_unknown_format_version_is_refused():
    table = good_manifest().table.replace_schema_metadata({b"stager.format_version": b"99", b"stager.block_size": b"4096"})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    with pytest.raises(ManifestError, match="version 99 is not supported"):
        decode_manifest(buf.getvalue(), "m.parquet")


def test_plain_parquet_without_version_is_refused():
    buf = io.BytesIO()
    pq.write_table(pa.table({"path": ["a"]}), buf)
    with pytest.raises(ManifestError, match="not a stager manifest"):
        decode_manifest(buf.getvalue(), "m.parquet")


def test_missing_column_is_refused():
    table = good_manifest().table.drop_columns(["blocks"]).replace_schema_metadata(
        {b"stager.format_version": b"1", b"stager.block_size": b"4096"})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    with pytest.raises(ManifestError, match="lacks column"):
        decode_manifest(buf.getvalue(), "m.parquet")


def test_block_size_out_of_range_is_refused():
    table = good_manifest().table.replace_schema_metadata({b"stager.format_version": b"1", b"stager.block_size": b"7"})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    with pytest.raises(ManifestError, match="block size 7"):
        decode_manifest(buf.getvalue(), "m.parquet")


def _written(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table.replace_schema_metadata({b"stager.format_version": b"1", b"stager.block_size": b"4096"}), buf)
    return buf.getvalue()


def test_columns_written_with_narrower_types_are_cast_to_the_manifest_types():
    m = good_manifest()
    table = m.table
    for name, narrow in (("size", pa.int32()), ("tokens", pa.int32()), ("mtime", pa.float32())):
        i = table.schema.get_field_index(name)
        table = table.set_column(i, pa.field(name, narrow), table.column(name).cast(narrow))
    back = decode_manifest(_written(table), "m.parquet")
    assert back.table.schema.equals(SCHEMA, check_metadata=False)
    assert [(e.path, e.size, e.tokens, e.blocks) for e in back] == [(e.path, e.size, e.tokens, e.blocks) for e in m]


def test_a_column_that_cannot_be_cast_is_refused_in_one_line():
    table = good_manifest().table
    i = table.schema.get_field_index("size")
    table = table.set_column(i, pa.field("size", pa.string()), pa.array(["10", "ten", "3", "4", "5"]))
    with pytest.raises(ManifestError, match="m.parquet: manifest columns have the wrong types") as info:
        decode_manifest(_written(table), "m.parquet")
    assert "\n" not in str(info.value)
