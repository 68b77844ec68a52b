"""The two store additions replication relies on: resumable uploads and paged listings."""

from __future__ import annotations

import os

import pytest

from stager.config import SourceConfig
from stager.errors import ShardNotFound
from stager.store import open_store

PART = 64 * 1024  # rclone and the local store take small parts; S3 would want 5 MiB


def make_store(kind: str, tmp_path, clusters=None):
    if kind == "local":
        return open_store(SourceConfig(str(tmp_path / "local")))
    if kind == "memory":
        return open_store(SourceConfig(f"memory://stager-test/{tmp_path.name}"))  # one memory fs per process
    _, b = clusters
    return open_store(b.source("pre"))


@pytest.fixture(params=["local", "memory", "s3"])
def kind(request):
    return request.param


async def test_an_upload_resumes_in_another_store_instance(kind, tmp_path, request):
    clusters = request.getfixturevalue("clusters") if kind == "s3" else None
    data = os.urandom(3 * PART + 100)
    first = make_store(kind, tmp_path, clusters)
    upload = await first.open_upload("dir/big.bin", part_size=PART)
    await upload.write_part(1, data[:PART])
    await upload.write_part(3, data[2 * PART:3 * PART])
    token = upload.token
    assert token
    await first.close()  # the process that started it is gone (its upload is not aborted)

    second = make_store(kind, tmp_path, clusters)
    try:
        if kind == "s3":  # it can list the upload's parts; the others trust the caller's journal
            with pytest.raises(ShardNotFound):
                await second.resume_upload("dir/big.bin", part_size=PART, token=token, parts={2: PART})
        with pytest.raises(ShardNotFound):
            await second.resume_upload("dir/big.bin", part_size=PART, token=token + "x", parts={})
        resumed = await second.resume_upload("dir/big.bin", part_size=PART, token=token, parts={1: PART, 3: PART})
        await resumed.write_part(2, data[PART:2 * PART])
        await resumed.write_part(4, data[3 * PART:])
        assert not await second.exists("dir/big.bin")
        await resumed.complete()
        assert await second.read("dir/big.bin") == data
        assert resumed.token is None  # completed: nothing left to resume
    finally:
        await second.close()


async def test_scan_pages_cover_the_listing(kind, tmp_path, request):
    clusters = request.getfixturevalue("clusters") if kind == "s3" else None
    store = make_store(kind, tmp_path, clusters)
    try:
        names = [f"d{i % 7}/sub{i % 2}/f{i:05d}" for i in range(1100 if kind == "s3" else 60)]
        if kind == "s3":  # straight to the server's disk: fast, and the server sees it at once
            root = clusters[1].root / "pre"
            for name in names:
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                (root / name).write_bytes(b"x" * (len(name) % 5))
        else:
            for name in names:
                await store.write(name, b"x" * (len(name) % 5))
        if kind == "local":  # an upload in progress is not an object
            await (await store.open_upload("d0/partial", part_size=PART)).write_part(1, b"abc")
        pages = [page async for page in store.scan()]
        found = {o.path: o.size for page in pages for o in page}
        assert found == {n: len(n) % 5 for n in names}
        assert sorted(found) == sorted(o.path for o in await store.list())
        if kind != "memory":
            assert len(pages) > 1  # paged: S3 by 1,000 keys, a folder by directory
    finally:
        await store.close()
