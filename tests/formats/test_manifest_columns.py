"""The manifest's optional layout and column columns: old manifests load, bad values are refused."""

from __future__ import annotations

import pyarrow as pa
import pytest

from stager.errors import ManifestError
from stager.hashing import blob_digest, block_digest
from stager.manifest import SCHEMA, Manifest, ShardEntry, decode_manifest, encode_manifest


def entry(path, data=b"\x01\x00" * 10, **kw):
    return ShardEntry(path, len(data), blob_digest(data), (block_digest(data),), "uint16", 10, None, **kw)


def test_a_manifest_without_them_loads_and_reads_by_suffix():
    old = Manifest.from_entries([entry("a.bin"), entry("b.bin")], 4096)
    assert old.table.schema.names == SCHEMA.names  # written as before: older readers see nothing new
    back = decode_manifest(encode_manifest(old), "m.parquet")
    assert back.layouts == [None, None] and back.columns == [None, None]


def test_they_round_trip():
    m = Manifest.from_entries([entry("a.bin", layout="megatron"), entry("b.arrow", layout="arrow", column="input_ids"),
                               entry("c.idx")], 4096)
    back = decode_manifest(encode_manifest(m), "m.parquet")
    assert list(back) == list(m)
    assert back.layouts == ["megatron", "arrow", None] and back.columns == [None, "input_ids", None]


def test_an_unknown_layout_is_refused_naming_the_entry():
    m = Manifest.from_entries([entry("a.bin", layout="megatron"), entry("b.bin", layout="megatron")], 4096)
    table = m.table.set_column(m.table.schema.get_field_index("layout"), "layout", pa.array(["megatron", "zip"]))
    with pytest.raises(ManifestError, match=r"m\.parquet: entry 1 \('b\.bin'\): unknown layout 'zip'"):
        decode_manifest(encode_manifest(Manifest(table, 4096)), "m.parquet")
