"""Fuzzing the manifest loader: whatever the bytes, it loads a valid manifest or raises ManifestError."""

from __future__ import annotations

import posixpath

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stager.errors import ManifestError
from stager.manifest import SCHEMA, Manifest, decode_manifest, encode_manifest

from .test_parquet import good_manifest

GOOD = encode_manifest(good_manifest())

path_parts = st.sampled_from(["a", "b", "..", ".", "", "/", "x y", "\x00", "ü", "c.bin"])
paths = st.lists(path_parts, min_size=0, max_size=4).map("/".join) | st.text(max_size=12)


def assert_valid(m: Manifest) -> None:
    seen = set()
    for i in range(len(m)):
        path = m.paths[i]
        assert path and not path.startswith("/") and path not in seen
        assert ".." not in path.split("/") and "" not in path.split("/")
        assert posixpath.normpath(path) == path
        seen.add(path)
        assert 0 <= m.sizes[i]
        assert len(m.block_digests(i)) == -(-int(m.sizes[i]) // m.block_size)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2048))
def test_random_bytes_are_refused_cleanly(data):
    try:
        assert_valid(decode_manifest(data, "fuzz.parquet"))
    except ManifestError as exc:
        assert str(exc).startswith("fuzz.parquet: ")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, len(GOOD) - 1), st.integers(0, 255), st.integers(0, 8))
def test_flipped_or_cut_bytes_of_a_real_manifest_never_slip_through(pos, value, cut):
    data = bytearray(GOOD)
    data[pos] = value
    data = bytes(data[: len(data) - cut])
    try:
        assert_valid(decode_manifest(data, "fuzz.parquet"))
    except ManifestError as exc:
        assert "fuzz.parquet" in str(exc)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(paths, st.integers(-5, 1 << 20), st.integers(0, 4)), min_size=1, max_size=8))
def test_arbitrary_entries_either_validate_or_are_refused(rows):
    table = pa.table(
        {
            "path": [r[0] for r in rows],
            "size": [r[1] for r in rows],
            "digest": [bytes(16)] * len(rows),
            "blocks": [[0] * r[2] for r in rows],
            "dtype": [None] * len(rows),
            "tokens": [None] * len(rows),
            "mtime": [None] * len(rows),
        },
        schema=SCHEMA,
    )
    try:
        assert_valid(decode_manifest(encode_manifest(Manifest(table, 4096)), "fuzz.parquet"))
    except ManifestError as exc:
        assert str(exc).startswith("fuzz.parquet: ")
