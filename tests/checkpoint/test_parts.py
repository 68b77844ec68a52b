"""A multi-node save's part records: they check their own digest, and cover only their save's files."""

from __future__ import annotations

import json

import pytest

from stager.checkpoint.manifest import FileRecord
from stager.checkpoint.parts import PartPlace, PartRecord, SavePart, coverage
from stager.errors import ManifestError

LAYOUT = (PartPlace(0, "gpu1", (0, 1)), PartPlace(1, "gpu2", (2, 3)))
FILES = {name: FileRecord(name, 10, "0" * 32, (7,)) for name in ("__0_0.distcp", "__2_0.distcp", "__3_0.distcp")}
SAVE = SavePart("save-a", 0, LAYOUT, tuple(sorted(FILES)))


def _record(part: int, names: list[str], save_id: str = "save-a") -> PartRecord:
    return PartRecord(save_id, part, LAYOUT, tuple(FILES[n] for n in names), block_size=1 << 20)


def test_a_part_record_round_trips_and_a_changed_byte_is_refused_naming_it():
    record = _record(1, ["__2_0.distcp", "__3_0.distcp"])
    assert PartRecord.decode(record.encode(), "p") == record
    obj = json.loads(record.encode())
    obj["files"][0]["size"] = 11
    with pytest.raises(ManifestError, match=r"^s3://b/run/x/.stager/parts/part-1.json: digest mismatch"):
        PartRecord.decode(json.dumps(obj).encode(), "s3://b/run/x/.stager/parts/part-1.json")
    with pytest.raises(ManifestError, match="not a part record"):
        PartRecord.decode(b"\x00", "p")


def test_coverage_names_the_node_whose_files_are_missing():
    sizes = {name: 10 for name in FILES}
    found = coverage(SAVE, [_record(0, ["__0_0.distcp"])], sizes)
    assert not found.complete and found.missing_files == ("__2_0.distcp", "__3_0.distcp")
    assert found.missing_parts == (LAYOUT[1],) and "part 1 (host gpu2, ranks 2,3)" in found.describe()
    done = coverage(SAVE, [_record(0, ["__0_0.distcp"]), _record(1, ["__2_0.distcp", "__3_0.distcp"])], sizes)
    assert done.complete and set(done.files) == set(FILES)


def test_a_record_of_another_save_or_a_file_gone_from_the_store_covers_nothing():
    sizes = {name: 10 for name in FILES}
    stale = coverage(SAVE, [_record(0, ["__0_0.distcp"]), _record(1, ["__2_0.distcp", "__3_0.distcp"], "old")], sizes)
    assert stale.missing_parts == (LAYOUT[1],)
    del sizes["__3_0.distcp"]
    gone = coverage(SAVE, [_record(0, ["__0_0.distcp"]), _record(1, ["__2_0.distcp", "__3_0.distcp"])], sizes)
    assert gone.missing_files == ("__3_0.distcp",)
