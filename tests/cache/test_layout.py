"""The cache directory: format version file, refusal of unknown versions and foreign directories."""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

import pytest

from stager.cache import BlobState, CacheTier
from stager.cache.layout import FORMAT_FILE, CacheLayout, check_digest
from stager.errors import CacheError

from .blobs import check_invariants, config, fill, make_blob


def test_new_cache_gets_a_format_file(tmp_path):
    directory = tmp_path / "a" / "b"
    CacheTier(config(directory, 1 << 20)).close()
    assert (directory / FORMAT_FILE).read_text() == 'format = "stager-cache"\nversion = 1\n'
    assert (directory / "blobs").is_dir() and (directory / "partial").is_dir()
    assert os.listdir(directory / "blobs") == []  # a blob's shard directory is made by its first commit


def test_a_commit_makes_its_shard_directory_and_a_restart_finds_the_blob(tmp_path):
    directory = tmp_path / "cache"
    blob = make_blob(100_000)
    with CacheTier(config(directory, 1 << 20)) as tier:
        path = fill(tier, blob)
    assert path == directory / "blobs" / blob.digest[:2] / blob.digest and path.read_bytes() == blob.data
    with CacheTier(config(directory, 1 << 20)) as tier:
        assert tier.state(blob.digest) is BlobState.COMPLETE
        check_invariants(tier)


def test_unknown_format_version_is_refused_in_one_line(tmp_path):
    directory = tmp_path / "cache"
    CacheTier(config(directory, 1 << 20)).close()
    (directory / FORMAT_FILE).write_text('format = "stager-cache"\nversion = 99\n')
    with pytest.raises(CacheError) as info:
        CacheTier(config(directory, 1 << 20))
    message = str(info.value)
    assert "\n" not in message and str(directory) in message and "version 99" in message


def test_unknown_index_schema_is_refused(tmp_path):
    directory = tmp_path / "cache"
    CacheTier(config(directory, 1 << 20)).close()
    with sqlite3.connect(directory / "index.sqlite") as conn:
        conn.execute("PRAGMA user_version = 7")
    with pytest.raises(CacheError, match="schema version 7"):
        CacheTier(config(directory, 1 << 20))


def test_a_foreign_non_empty_directory_is_refused(tmp_path):
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "thesis.tex").write_text("precious")
    with pytest.raises(CacheError, match="not a stager cache"):
        CacheTier(config(tmp_path / "home", 1 << 20))
    (tmp_path / "nvme" / "lost+found").mkdir(parents=True)  # a dedicated disk's root is fine
    CacheTier(config(tmp_path / "nvme", 1 << 20)).close()


def test_a_garbled_format_file_is_refused(tmp_path):
    directory = tmp_path / "cache"
    CacheTier(config(directory, 1 << 20)).close()
    (directory / FORMAT_FILE).write_text("version = = 1")
    with pytest.raises(CacheError, match="unreadable"):
        CacheTier(config(directory, 1 << 20))


def test_concurrent_creators_agree(tmp_path):
    directory = tmp_path / "cache"
    errors = []

    def create():
        try:
            CacheTier(config(directory, 1 << 20)).close()
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=create) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == []


def test_paths_and_digests():
    layout = CacheLayout(Path("/c"))
    d = "0123456789abcdef0123456789abcdef"
    assert str(layout.complete_path(d)) == f"/c/blobs/01/{d}"
    assert str(layout.partial_path(d, "00112233aabbccdd")) == f"/c/partial/{d}.00112233aabbccdd"
    for bad in ("0123", d.upper(), d + "0", 5):
        with pytest.raises(ValueError):
            check_digest(bad)
