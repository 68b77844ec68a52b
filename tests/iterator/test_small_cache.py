"""The iterator on a cache smaller than the dataset, on a real 20 MiB tmpfs (issue 14, item 8).

A capacity below two shuffle windows is refused at once, with the capacity it
needs and a window that fits; with that window, a dataset larger than the disk
streams through the capacity: every sample once, the disk never holding more
than the capacity (plus the index), and no evicted blob left mapped.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from stager.cache import CacheTier
from stager.config import CacheConfig
from stager.errors import ConfigError
from stager.iterator import TokenIterator
from tests.cache.small_disk import mounted_tmpfs
from tests.iterator.corpus import check_sample, expected_firsts, write_counting_corpus

from .test_iterator import FETCH

SHARD_TOKENS = 250_000  # 1 MB shards of uint32
SEQ_LEN = 1024
CAPACITY = 8_000_000
INDEX_ROOM = 1 << 20  # the index, its WAL and its reserve, on top of the blobs


@pytest.fixture
def disk(tmp_path):
    with mounted_tmpfs(tmp_path / "disk", "20m") as mountpoint:
        yield mountpoint


def used_bytes(path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def deleted_blob_maps() -> int:
    """Cache files this process still maps although they were unlinked (evicted)."""
    with open("/proc/self/maps") as maps:
        return sum(1 for line in maps if "/blobs/" in line and line.rstrip().endswith("(deleted)"))


class DiskWatch:
    """Samples the disk's use and this process's maps of deleted blobs on a thread, for a bounded time."""

    def __init__(self, path, limit: float = 120.0) -> None:
        self.path, self.limit = path, limit
        self.peak_used = self.peak_deleted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        ends = time.monotonic() + self.limit
        while not self._stop.is_set() and time.monotonic() < ends:
            self.peak_used = max(self.peak_used, used_bytes(self.path))
            self.peak_deleted = max(self.peak_deleted, deleted_blob_maps())
            self._stop.wait(0.01)

    def __enter__(self) -> "DiskWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def test_a_cache_smaller_than_two_windows_is_refused_at_once_then_a_window_that_fits_streams(tmp_path, disk):
    manifest = write_counting_corpus(tmp_path / "data", [SHARD_TOKENS] * 24, block_size=1 << 18)  # 24 MB > disk
    settings = dict(seq_len=SEQ_LEN, seed=3, cache_dir=disk / "cache", capacity=CAPACITY, fetch=FETCH,
                    log_every=0, session="embedded")
    charged = -(-int(manifest.sizes.max()) // 4096) * 4096
    began = time.monotonic()
    with pytest.raises(ConfigError) as info:
        TokenIterator(str(tmp_path / "data"), shuffle_window=8, **settings)
    assert time.monotonic() - began < 10
    message = str(info.value)
    assert f"{CAPACITY:,}" in message and f"{2 * 8 * charged:,}" in message, message
    assert "shuffle_window=3" in message, message  # 3 shards of 1 MB: two windows fit in 8 MB
    assert not (disk / "cache" / "blobs").exists() or not any((disk / "cache" / "blobs").iterdir())

    baseline = used_bytes(disk)
    with DiskWatch(disk) as watch, TokenIterator(str(tmp_path / "data"), shuffle_window=3, **settings) as it:
        firsts = [check_sample(sample, SEQ_LEN) for sample in it]
    assert sorted(firsts) == sorted(expected_firsts(manifest, SEQ_LEN))  # every sample, once
    assert watch.peak_used - baseline <= CAPACITY + INDEX_ROOM, (watch.peak_used - baseline, CAPACITY)
    assert watch.peak_deleted == 0


def test_a_disk_another_program_filled_fails_at_once_and_streams_once_room_is_back(tmp_path, disk):
    from stager.errors import DiskFull
    from tests.cache.small_disk import fill_disk

    manifest = write_counting_corpus(tmp_path / "data", [SHARD_TOKENS] * 6, block_size=1 << 18)
    settings = dict(seq_len=SEQ_LEN, seed=3, shuffle_window=2, cache_dir=disk / "cache", capacity=1 << 30,
                    fetch=FETCH, log_every=0, session="embedded")
    with CacheTier(CacheConfig(disk / "cache", capacity=1 << 30)):
        pass  # the cache exists; then another program fills its disk
    fill_disk(disk / "filler")
    with TokenIterator(str(tmp_path / "data"), **settings) as it:
        began = time.monotonic()
        with pytest.raises(DiskFull) as info:
            for _ in it:
                pass
        assert time.monotonic() - began < 20  # not the retry deadline and the iterator's patience
        assert str(disk / "cache") in str(info.value) and "disk" in str(info.value)
    os.unlink(disk / "filler")
    with TokenIterator(str(tmp_path / "data"), **settings) as it:
        firsts = [check_sample(sample, SEQ_LEN) for sample in it]
    assert sorted(firsts) == sorted(expected_firsts(manifest, SEQ_LEN))
