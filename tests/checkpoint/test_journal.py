"""The drain journal survives a torn last line; the staging queue is oldest first; records check themselves."""

from __future__ import annotations

import asyncio
import time

import pytest

from stager.checkpoint.journal import JOURNAL, DrainJournal
from stager.checkpoint.manifest import FileRecord
from stager.checkpoint.staging import DrainSpec, StagingDir
from stager.config import SourceConfig
from stager.errors import ManifestError


def test_a_torn_last_line_is_ignored_and_the_rest_replayed(tmp_path):
    journal = DrainJournal(tmp_path)
    asyncio.run(journal.mark_verified(0, "a.distcp", "d" * 32))
    asyncio.run(journal.mark_upload(1, "b.distcp", "e" * 32, "token", 5 << 20))
    asyncio.run(journal.mark_part(1, "b.distcp", "e" * 32, 1, 5 << 20))
    with open(tmp_path / JOURNAL, "ab") as fh:
        fh.write(b'{"kind":"verified","store":1,"pa')  # the kill came mid-write
    again = DrainJournal(tmp_path)
    assert again.is_verified(0, "a.distcp", "d" * 32)
    assert again.uploads[(1, "b.distcp", "e" * 32)] == ("token", 5 << 20)
    assert again.parts[(1, "b.distcp", "e" * 32)] == {1: 5 << 20}
    assert not again.is_verified(1, "b.distcp", "e" * 32)


def test_the_queue_is_oldest_sealed_first(tmp_path):
    staging = StagingDir(tmp_path)
    spec = DrainSpec((SourceConfig("file:///x"),))
    for name in ("zeta", "alpha", "mid"):
        entry = staging.entry(f"file:///dest/{name}")
        entry.path.mkdir(parents=True)
        entry.write_spec(spec)
        entry.seal()
        time.sleep(0.01)
    unsealed = staging.entry("file:///dest/writing")
    unsealed.path.mkdir()
    unsealed.write_spec(spec)
    assert [e.name.split("-")[0] for e in staging.pending()] == ["zeta", "alpha", "mid"]
    assert staging.entries()[-1].path == unsealed.path


def test_a_record_with_the_wrong_block_count_is_refused():
    with pytest.raises(ManifestError, match="x.distcp: 1 block digests for 3000000 bytes"):
        FileRecord.from_json({"path": "x.distcp", "size": 3_000_000, "digest": "0" * 32, "blocks": ["0" * 16]},
                             "where", 1 << 20)
