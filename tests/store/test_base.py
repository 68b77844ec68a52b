"""Path and range validation, ObjectInfo, and the part ledger of uploads."""

from __future__ import annotations

import dataclasses

import pytest

from stager.errors import OriginError
from stager.store.base import InvalidPath, InvalidRange, ObjectInfo, validate_path, validate_range
from stager.store.parts import MAX_PARTS, PartLedger


@pytest.mark.parametrize("path", ["a", "a/b.bin", "deep/er/x-1_2.3.bin", "..hidden", "a/.b", "ünï cödé.bin"])
def test_valid_paths(path):
    assert validate_path(path) == path


@pytest.mark.parametrize(
    "path", ["", "/abs", "../up", "a/../b", "a/..", ".", "./a", "a//b", "a/", "a\\b", "a\x00b", None, 3]
)
def test_invalid_paths(path):
    with pytest.raises(InvalidPath) as info:
        validate_path(path)
    assert isinstance(info.value, ValueError) and isinstance(info.value, OriginError)


@pytest.mark.parametrize(("start", "end"), [(0, 0), (0, 1), (5, 5), (3, 10)])
def test_valid_ranges(start, end):
    validate_range("a", start, end)


@pytest.mark.parametrize(("start", "end"), [(-1, 3), (4, 3), (0, -1), (0.5, 2)])
def test_invalid_ranges(start, end):
    with pytest.raises(InvalidRange):
        validate_range("a", start, end)


def test_object_info_is_frozen_and_slotted():
    info = ObjectInfo("a/b", 10, 1.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.size = 3  # type: ignore[misc]
    assert not hasattr(info, "__dict__")
    assert ObjectInfo("a", 1) == ObjectInfo("a", 1, None)


def test_part_ledger_offsets_and_total():
    ledger = PartLedger("x", 10)
    assert ledger.add(3, 4) == 20
    assert ledger.add(1, 10) == 0
    assert ledger.add(2, 10) == 10
    assert ledger.total() == 24


def test_part_ledger_rewrites_a_part():
    ledger = PartLedger("x", 10)
    ledger.add(1, 3)
    ledger.add(1, 10)
    assert ledger.total() == 10


def test_part_ledger_empty_is_zero():
    assert PartLedger("x", 10).total() == 0


@pytest.mark.parametrize("number", [0, -1, MAX_PARTS + 1, 1.0])
def test_part_ledger_rejects_bad_numbers(number):
    with pytest.raises(ValueError):
        PartLedger("x", 10).add(number, 1)


def test_part_ledger_rejects_large_parts_gaps_and_short_middles():
    ledger = PartLedger("x", 10)
    with pytest.raises(ValueError):
        ledger.add(1, 11)
    ledger.add(1, 10)
    ledger.add(3, 10)
    with pytest.raises(ValueError, match="missing"):
        ledger.total()
    ledger.add(2, 9)
    with pytest.raises(ValueError, match="shorter"):
        ledger.total()


def test_part_ledger_rejects_bad_part_size():
    with pytest.raises(ValueError):
        PartLedger("x", 0)


@pytest.mark.parametrize("path", ["a/b.bin", "a\\b.bin", "a/./b", "../x", "/abs", "a//b", "a/", "", "tab\there",
                                  "ok name.bin", "a/..b", "..b/c"])
def test_stores_and_manifests_judge_a_path_by_one_rule(path):
    import pyarrow as pa

    from stager.errors import ManifestError
    from stager.manifest.validate import validate_table

    try:
        validate_path(path)
        store_ok = True
    except InvalidPath:
        store_ok = False
    table = pa.table({"path": [path], "size": [0], "digest": [b"\0" * 16], "blocks": pa.array([[]], pa.list_(pa.uint64())),
                      "dtype": pa.array([None], pa.string()), "tokens": pa.array([None], pa.int64())})
    try:
        validate_table(table, 4096, "m")
        manifest_ok = True
    except ManifestError:
        manifest_ok = False
    assert store_ok == manifest_ok
    assert store_ok == (path in ("a/b.bin", "ok name.bin", "a/..b", "..b/c"))
