"""One behavioural suite, run against every origin kind: local path, file://, HTTP, S3 (rclone)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import xxhash

from stager.errors import CorruptData, OriginChanged, ShardNotFound
from stager.store import ObjectInfo
from stager.store.base import InvalidPath, InvalidRange, UnsupportedOperation

from .origins import ORIGIN_KINDS, Origin, make_origin

DATA = os.urandom(300_000)


@pytest.fixture(params=ORIGIN_KINDS)
async def origin(request, tmp_path: Path):
    o = make_origin(request.param, request, tmp_path)
    try:
        yield o
    finally:
        await o.store.close()


async def test_info_and_exists(origin: Origin):
    origin.put("d/x.bin", DATA)
    info = await origin.store.info("d/x.bin")
    assert isinstance(info, ObjectInfo)
    assert (info.path, info.size) == ("d/x.bin", len(DATA))
    assert await origin.store.exists("d/x.bin")
    assert not await origin.store.exists("d/y.bin")


async def test_range_reads_exact_at_the_edges(origin: Origin):
    origin.put("x.bin", DATA)
    s = origin.store
    n = len(DATA)
    assert await s.read_range("x.bin", 0, 0) == b""
    assert await s.read_range("x.bin", 0, 1) == DATA[:1]
    assert await s.read_range("x.bin", n - 1, n) == DATA[-1:]
    assert await s.read_range("x.bin", 12_345, 200_000) == DATA[12_345:200_000]
    assert await s.read_range("x.bin", 0, n) == DATA
    assert await s.read("x.bin") == DATA


@pytest.mark.parametrize("offsets", [(-1, 1), (0, 1), (10, 11)], ids=["straddling", "at-end", "beyond"])
async def test_range_past_the_end_is_invalid(origin: Origin, offsets):
    origin.put("x.bin", DATA)
    start, end = (len(DATA) + o for o in offsets)
    with pytest.raises(InvalidRange):
        await origin.store.read_range("x.bin", start, end)
    assert origin.store.stats.retries == 0


async def test_missing_object_fails_fast_naming_it(origin: Origin):
    origin.put("present.bin", b"x")
    for call in (origin.store.read_range("gone/x.bin", 0, 10), origin.store.read("gone/x.bin"), origin.store.info("gone/x.bin")):
        with pytest.raises(ShardNotFound, match="gone/x.bin"):
            await call
    assert origin.store.stats.retries == 0


async def test_unusual_names(origin: Origin):
    name = "dir with space/ünï+code=1.bin"
    origin.put(name, b"payload")
    assert await origin.store.read_range(name, 1, 4) == b"ayl"
    assert (await origin.store.info(name)).size == 7


async def test_paths_are_validated(origin: Origin):
    for bad in ("../x", "/abs", "a//b"):
        with pytest.raises(InvalidPath):
            await origin.store.read_range(bad, 0, 1)


async def test_check_is_applied_and_a_bad_digest_is_origin_changed(origin: Origin):
    origin.put("x.bin", DATA)
    want = xxhash.xxh3_64_intdigest(DATA[:1000])

    def check(data: bytes) -> None:
        if xxhash.xxh3_64_intdigest(data) != want:
            raise CorruptData("xxh3 mismatch")

    assert await origin.store.read_range("x.bin", 0, 1000, check=check) == DATA[:1000]
    with pytest.raises(OriginChanged):
        await origin.store.read_range("x.bin", 1, 1001, check=check)


async def test_list(origin: Origin):
    origin.put("b.bin", b"bb")
    origin.put("a/c.bin", b"ccc")
    if not origin.listable:
        with pytest.raises(UnsupportedOperation):
            await origin.store.list()
        return
    assert [(i.path, i.size) for i in await origin.store.list()] == [("a/c.bin", 3), ("b.bin", 2)]


async def test_write_roundtrip_and_delete(origin: Origin):
    if not origin.writable:
        with pytest.raises(UnsupportedOperation):
            await origin.store.write("w.bin", b"x")
        return
    await origin.store.write("w/new.bin", DATA)
    assert await origin.store.read("w/new.bin") == DATA
    await origin.store.write("w/new.bin", b"replaced")
    assert await origin.store.read("w/new.bin") == b"replaced"
    assert [i.path for i in await origin.store.list()] == ["w/new.bin"]
    await origin.store.delete("w/new.bin")
    await origin.store.delete("w/new.bin")
    assert not await origin.store.exists("w/new.bin")


@pytest.fixture(params=ORIGIN_KINDS)
async def own_origin(request, tmp_path: Path):
    """As ``origin``, but S3 on a private rclone: an aborted upload can keep rclone busy for a while."""
    o = make_origin(request.param, request, tmp_path, private=True)
    try:
        yield o
    finally:
        await o.store.close()


async def test_multipart_upload(own_origin: Origin):
    origin = own_origin
    if not origin.writable:
        return
    part = 64 * 1024  # real S3 wants >= 5 MiB; rclone does not, and small parts keep the test fast
    data = os.urandom(2 * part + 1234)
    upload = await origin.store.open_upload("up/big.bin", part_size=part)
    # rclone serve s3 streams an upload's parts into the file as they come, in order, and
    # a HEAD in that directory meanwhile can wait for the upload to finish: on S3 write the
    # parts in order and look only afterwards (out-of-order parts: see the local store tests).
    rclone = origin.kind == "s3"
    for number in (1, 2, 3) if rclone else (3, 1, 2):
        await upload.write_part(number, data[(number - 1) * part:number * part])
    if not rclone:
        assert not await origin.store.exists("up/big.bin")
    await upload.complete()
    assert (await origin.store.info("up/big.bin")).size == len(data)
    assert await origin.store.read_range("up/big.bin", part - 10, part + 10) == data[part - 10:part + 10]
    assert await origin.store.read("up/big.bin") == data

    aborted = await origin.store.open_upload("up/never.bin", part_size=part)
    await aborted.write_part(1, data[:part])
    await aborted.abort()
    assert not await origin.store.exists("up/never.bin")


async def test_stats_count_bytes(origin: Origin):
    origin.put("x.bin", DATA)
    await origin.store.read_range("x.bin", 0, 1000)
    await origin.store.read_range("x.bin", 1000, 3000)
    assert origin.store.stats.bytes_read == 3000
    assert origin.store.stats.ok >= 2
