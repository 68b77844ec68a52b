"""The manifest's seal: every byte of a written manifest is checked before it is parsed; legacy ones still load."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stager.errors import ManifestError
from stager.manifest import FORMAT_VERSION, LEGACY_FORMAT_VERSION, decode_manifest, encode_manifest
from stager.manifest.seal import DIGEST_KEY, DIGEST_TAG, check_seal

from .test_parquet import good_manifest


def legacy_bytes(manifest=None) -> bytes:
    """A manifest as stager wrote them before the seal: format version 1, no digest."""
    manifest = manifest or good_manifest()
    table = manifest.table.replace_schema_metadata(
        {b"stager.format_version": b"1", b"stager.block_size": str(manifest.block_size).encode(),
         b"stager.created_by": b"stager 0.1.0"})
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd", use_dictionary=["dtype"], row_group_size=1 << 20)
    return sink.getvalue()


def spread_offsets(data: bytes) -> dict[str, int]:
    """A dozen offsets over the whole file: header magic, data pages, footer, digest, footer length, trailing magic."""
    footer_len = int.from_bytes(data[-8:-4], "little")
    footer = len(data) - 8 - footer_len
    at = data.rfind(DIGEST_TAG) + len(DIGEST_TAG)
    return {
        "leading magic": 1,
        "first page header": 6,
        "data pages, early": footer // 4,
        "data pages, middle": footer // 2,
        "data pages, late": footer - 3,
        "footer start": footer + 1,
        "footer middle (schema, row groups)": footer + footer_len // 3,
        "digest key": data.rfind(DIGEST_KEY) + 3,
        "digest value": at + 5,
        "footer length": len(data) - 8,
        "footer length, high byte": len(data) - 5,
        "trailing magic": len(data) - 2,
    }


def flipped(data: bytes, offset: int, mask: int = 0xFF) -> bytes:
    out = bytearray(data)
    out[offset] ^= mask
    return bytes(out)


def test_a_written_manifest_is_sealed_round_trips_and_opens_in_any_parquet_reader():
    m = good_manifest()
    data = encode_manifest(m)
    assert check_seal(data, "m.parquet") is True
    assert list(decode_manifest(data, "m.parquet")) == list(m)
    table = pq.read_table(pa.BufferReader(data))  # plain pyarrow, knowing nothing of the seal
    assert table.column("path").to_pylist() == m.paths
    assert pq.ParquetFile(pa.BufferReader(data)).schema_arrow.metadata[b"stager.format_version"] == \
        str(FORMAT_VERSION).encode()


def test_the_same_manifest_encodes_to_the_same_bytes():
    assert encode_manifest(good_manifest()) == encode_manifest(good_manifest())


@pytest.mark.parametrize("where", list(spread_offsets(encode_manifest(good_manifest()))))
def test_one_flipped_byte_at_a_dozen_offsets_is_refused_naming_the_file(where):
    data = encode_manifest(good_manifest())
    bad = flipped(data, spread_offsets(data)[where])
    with pytest.raises(ManifestError, match=r"^m\.parquet: ") as info:
        decode_manifest(bad, "m.parquet")
    assert "\n" not in str(info.value)
    assert "digest" in str(info.value)  # caught by the seal, before the parser saw anything


@pytest.mark.parametrize("mask", [0xFF, 0x01, 0x20])
def test_every_single_byte_flip_anywhere_is_refused(mask):
    data = encode_manifest(good_manifest())
    slipped = []
    for offset in range(len(data)):
        try:
            decode_manifest(flipped(data, offset, mask), "m.parquet")
        except ManifestError:
            continue
        slipped.append(offset)
    assert slipped == [], f"{len(slipped)} of {len(data)} flips were taken as valid, e.g. at {slipped[:5]}"


def test_no_single_flip_makes_a_sealed_manifest_look_legacy():
    data = encode_manifest(good_manifest())
    legacy = []
    for offset in range(len(data)):
        for mask in (0xFF, *(1 << bit for bit in range(8))):
            try:
                if check_seal(flipped(data, offset, mask), "m.parquet") is False:
                    legacy.append(offset)
            except ManifestError:
                continue  # refused outright: as good as a seal that does not check out
    assert legacy == [], f"{len(legacy)} flips made the manifest look unsealed, e.g. at {legacy[:5]}"


def test_a_cut_manifest_is_refused():
    data = encode_manifest(good_manifest())
    for cut in (1, 8, 40, len(data) // 2, len(data) - 10):
        with pytest.raises(ManifestError, match=r"^m\.parquet: "):
            decode_manifest(data[:-cut], "m.parquet")


def test_a_legacy_manifest_loads_as_before_and_is_reported_unsealed():
    m = good_manifest()
    data = legacy_bytes(m)
    assert check_seal(data, "old.parquet") is False
    assert list(decode_manifest(data, "old.parquet")) == list(m)


def test_a_version_2_manifest_without_its_digest_is_refused():
    m = good_manifest()
    table = m.table.replace_schema_metadata({b"stager.format_version": str(FORMAT_VERSION).encode(),
                                             b"stager.block_size": str(m.block_size).encode()})
    sink = io.BytesIO()
    pq.write_table(table, sink)
    with pytest.raises(ManifestError, match="without its digest"):
        decode_manifest(sink.getvalue(), "m.parquet")


def test_a_legacy_version_with_a_digest_is_refused():
    # A digest matching the bytes, but the version says 1: not something stager writes.
    from stager.manifest.seal import UNSEALED_VALUE, seal

    m = good_manifest()
    table = m.table.replace_schema_metadata({b"stager.format_version": str(LEGACY_FORMAT_VERSION).encode(),
                                             b"stager.block_size": str(m.block_size).encode(),
                                             DIGEST_KEY: UNSEALED_VALUE})
    sink = io.BytesIO()
    pq.write_table(table, sink)
    with pytest.raises(ManifestError, match="a version 1 manifest with a digest"):
        decode_manifest(seal(sink.getvalue()), "m.parquet")


def test_a_shard_path_quoting_the_digest_tag_does_not_confuse_the_seal():
    from tests.manifest.test_parquet import entry
    from stager.manifest import Manifest

    m = Manifest.from_entries([entry("xxh3-128:0000000000000000000000000000000000", b"abc"),
                               entry("stager.manifest_digest", b"de")], 4096)
    data = encode_manifest(m)
    assert list(decode_manifest(data, "m.parquet")) == list(m)
