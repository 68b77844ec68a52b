"""LocalStore: exact ranges, atomic writes, uploads, retries of a flaky file system."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest
import xxhash

from stager.config import RetryConfig
from stager.errors import CorruptData, OriginChanged, OriginUnavailable, ShardNotFound
from stager.store import local_store
from stager.store.base import InvalidPath, InvalidRange, RangeSink
from stager.store.held import held_bytes, receiving_requests
from stager.store.local_store import TMP_MARKER, LocalStore, path_from_url
from stager.store.options import StoreOptions

FAST_RETRY = RetryConfig(attempts=4, backoff_base=0.001, backoff_max=0.01, deadline=5.0, request_timeout=5.0)


@pytest.fixture
async def store(tmp_path: Path):
    s = LocalStore(str(tmp_path / "root"), options=StoreOptions(retry=FAST_RETRY, concurrency=4))
    try:
        yield s
    finally:
        await s.close()


def put(store: LocalStore, rel: str, data: bytes) -> None:
    p = Path(store.root, rel)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)


def test_url_forms(tmp_path: Path):
    assert path_from_url(str(tmp_path)) == str(tmp_path)
    assert path_from_url(f"file://{tmp_path}") == str(tmp_path)
    assert path_from_url(f"file://localhost{tmp_path}") == str(tmp_path)
    assert LocalStore(f"file://{tmp_path}/").url == f"file://{tmp_path}"


async def test_list_is_recursive_sorted_relative_and_hides_temp_files(store: LocalStore):
    put(store, "b.bin", b"bb")
    put(store, "a/z.bin", b"z")
    put(store, "a/c/d.bin", b"ddd")
    put(store, f"a/.x.bin{TMP_MARKER}123", b"partial")
    os.symlink("/nonexistent", Path(store.root, "dangling"))
    infos = await store.list()
    assert [(i.path, i.size) for i in infos] == [("a/c/d.bin", 3), ("a/z.bin", 1), ("b.bin", 2)]
    assert all(i.mtime is not None for i in infos)


async def test_list_of_a_missing_root_is_not_found(tmp_path: Path):
    async with LocalStore(str(tmp_path / "nope"), options=StoreOptions(retry=FAST_RETRY)) as s:
        with pytest.raises(ShardNotFound):
            await s.list()


async def test_info_exists_and_directories(store: LocalStore):
    put(store, "d/x.bin", b"12345")
    info = await store.info("d/x.bin")
    assert (info.path, info.size) == ("d/x.bin", 5)
    assert await store.exists("d/x.bin")
    assert not await store.exists("d/y.bin")
    assert not await store.exists("d")
    with pytest.raises(ShardNotFound):
        await store.info("d")


async def test_range_reads_are_exact_at_the_edges(store: LocalStore):
    data = bytes(range(256)) * 4
    put(store, "x.bin", data)
    assert await store.read_range("x.bin", 0, 0) == b""
    assert await store.read_range("x.bin", len(data), len(data)) == b""
    assert await store.read_range("x.bin", 0, 1) == data[:1]
    assert await store.read_range("x.bin", len(data) - 1, len(data)) == data[-1:]
    assert await store.read_range("x.bin", 100, 777) == data[100:777]
    assert await store.read_range("x.bin", 0, len(data)) == data
    assert await store.read("x.bin") == data


async def test_a_body_handed_over_whole_counts_as_held_while_its_sink_has_it(store: LocalStore):
    """What the engine's memory bound reads for stores that do not stream: the body, while it is written."""
    data = os.urandom(3 << 20)
    put(store, "x.bin", data)
    base_bytes, base_receiving = held_bytes(), receiving_requests()
    seen: list[tuple[int, int]] = []

    class Sink(RangeSink):
        async def write(self, chunk: bytes) -> None:
            seen.append((held_bytes() - base_bytes, receiving_requests() - base_receiving))

        async def close(self) -> None:
            """Nothing to finish: the test keeps only what write saw."""

        async def abort(self) -> None:
            """As close."""

    await store.read_range_into("x.bin", 0, len(data), Sink)
    assert seen == [(len(data), 1)]
    assert (held_bytes() - base_bytes, receiving_requests() - base_receiving) == (0, 0)


@pytest.mark.parametrize(("start", "end"), [(1020, 1025), (1024, 1025), (2000, 3000), (5, 4), (-1, 3)])
async def test_range_reads_past_the_end_or_reversed_fail_without_retry(store: LocalStore, start, end):
    put(store, "x.bin", bytes(1024))
    with pytest.raises(InvalidRange):
        await store.read_range("x.bin", start, end)
    assert store.stats.retries == 0


async def test_missing_object_fails_fast_naming_the_path(store: LocalStore):
    with pytest.raises(ShardNotFound, match="nope/x.bin"):
        await store.read_range("nope/x.bin", 0, 10)
    with pytest.raises(ShardNotFound):
        await store.read("nope/x.bin")
    assert store.stats.retries == 0 and store.stats.not_found == 2


@pytest.mark.parametrize("bad", ["../x", "/etc/passwd", "a/../../x", ""])
async def test_paths_are_validated(store: LocalStore, bad):
    with pytest.raises(InvalidPath):
        await store.read_range(bad, 0, 1)
    with pytest.raises(InvalidPath):
        await store.write(bad, b"x")


async def test_check_failure_is_retried_then_origin_changed(store: LocalStore):
    put(store, "x.bin", b"hello world")
    good = xxhash.xxh3_64_intdigest(b"hello")
    calls = []

    def check(data: bytes) -> None:
        calls.append(data)
        if xxhash.xxh3_64_intdigest(data) != good:
            raise CorruptData("digest mismatch")

    assert await store.read_range("x.bin", 0, 5, check=check) == b"hello"
    with pytest.raises(OriginChanged, match="x.bin"):
        await store.read_range("x.bin", 6, 11, check=check)
    assert len(calls) == 1 + FAST_RETRY.attempts
    assert store.stats.corrupt == FAST_RETRY.attempts


async def test_flaky_file_system_is_retried(store: LocalStore, monkeypatch):
    put(store, "x.bin", b"0123456789")
    real = os.pread
    failures = [OSError(errno.EIO, "I/O error"), OSError(errno.ESTALE, "stale")]

    def flaky(fd, n, offset):
        if failures:
            raise failures.pop(0)
        return real(fd, n, offset)

    monkeypatch.setattr(local_store.os, "pread", flaky)
    assert await store.read_range("x.bin", 2, 6) == b"2345"
    assert store.stats.transient == 2 and store.stats.retries == 2


async def test_file_system_that_stays_broken_gives_up(store: LocalStore, monkeypatch):
    put(store, "x.bin", b"0123456789")

    def broken(fd, n, offset):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(local_store.os, "pread", broken)
    with pytest.raises(OriginUnavailable, match="x.bin"):
        await store.read_range("x.bin", 0, 4)


async def test_short_read_is_transient(store: LocalStore, monkeypatch):
    put(store, "x.bin", b"0123456789")
    real = os.pread
    calls = []

    def short_once(fd, n, offset):
        calls.append(1)
        data = real(fd, n, offset)
        return data[:1] if len(calls) == 1 else data

    monkeypatch.setattr(local_store.os, "pread", short_once)
    assert await store.read_range("x.bin", 0, 8) == b"01234567"


async def test_write_creates_parents_and_replaces(store: LocalStore):
    await store.write("a/b/c.bin", b"one")
    assert Path(store.root, "a/b/c.bin").read_bytes() == b"one"
    await store.write("a/b/c.bin", b"two!")
    assert await store.read("a/b/c.bin") == b"two!"
    assert store.stats.bytes_written == 7
    assert [i.path for i in await store.list()] == ["a/b/c.bin"]
    assert sorted(os.listdir(Path(store.root, "a/b"))) == ["c.bin"]


async def test_failed_write_leaves_old_content_and_no_temp_file(store: LocalStore, monkeypatch):
    await store.write("x.bin", b"old")

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(local_store.os, "fsync", no_space)
    with pytest.raises(OSError):
        await store.write("x.bin", b"new" * 1000)
    assert Path(store.root, "x.bin").read_bytes() == b"old"
    assert os.listdir(store.root) == ["x.bin"]


async def test_readers_never_see_a_partial_write(store: LocalStore):
    size = 4 << 20
    versions = [bytes([i]) * size for i in range(3)]
    await store.write("x.bin", versions[0])
    seen: set[bytes] = set()

    async def writer():
        for i in range(1, 9):
            await store.write("x.bin", versions[i % 3])

    async def reader():
        for _ in range(40):
            data = await store.read("x.bin")
            assert len(data) == size and data in versions, "partial or mixed file seen"
            seen.add(data[:1])

    await asyncio.gather(writer(), reader(), reader())
    assert len(seen) >= 1


async def test_delete_is_idempotent(store: LocalStore):
    await store.write("x.bin", b"x")
    await store.delete("x.bin")
    await store.delete("x.bin")
    assert not await store.exists("x.bin")


async def test_upload_out_of_order_is_invisible_until_complete(store: LocalStore):
    data = os.urandom(25)
    upload = await store.open_upload("big/obj.bin", part_size=10)
    await upload.write_part(3, data[20:])
    await upload.write_part(1, data[:10])
    assert not await store.exists("big/obj.bin")
    assert await store.list() == []
    await upload.write_part(2, data[10:20])
    await upload.complete()
    assert await store.read("big/obj.bin") == data
    assert os.listdir(Path(store.root, "big")) == ["obj.bin"]
    with pytest.raises(ValueError):
        await upload.write_part(1, b"x")


async def test_upload_abort_and_errors_leave_nothing(store: LocalStore):
    upload = await store.open_upload("obj.bin", part_size=10)
    with pytest.raises(ValueError):
        await upload.write_part(1, b"x" * 11)
    await upload.write_part(2, b"x" * 10)
    with pytest.raises(ValueError, match="missing"):
        await upload.complete()
    await upload.abort()
    await upload.abort()
    assert os.listdir(store.root) == []

    async def failing_copy():
        async with await store.open_upload("obj.bin", part_size=10) as up:
            await up.write_part(1, b"y" * 10)
            raise RuntimeError("copy failed")

    with pytest.raises(RuntimeError):
        await failing_copy()
    assert os.listdir(store.root) == []


async def test_empty_upload_makes_an_empty_object(store: LocalStore):
    upload = await store.open_upload("empty.bin", part_size=10)
    await upload.complete()
    assert await store.read("empty.bin") == b""
