"""Direct writes (O_DIRECT): exact bytes at any offset, past the page cache, and a fallback where refused."""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import random

import numpy as np
import pytest

from stager.cache import BlobState, CacheTier
from stager.cache.direct import ALIGN, BUFFER_BYTES, DirectWriter, open_direct
from stager.config import CacheConfig

from .blobs import check_invariants, fill, make_blob, resident_pages

MiB = 1 << 20


@pytest.fixture
def direct_file(tmp_path):
    path = tmp_path / "blob"
    with open(path, "wb") as fh:
        fh.truncate(4 * BUFFER_BYTES)
    direct_fd = open_direct(path)
    if direct_fd is None:
        pytest.skip("this filesystem has no O_DIRECT")
    buffered_fd = os.open(path, os.O_RDWR)
    yield path, direct_fd, buffered_fd
    os.close(direct_fd)
    os.close(buffered_fd)


@pytest.mark.parametrize("offset, pieces", [
    (0, [MiB]),  # one aligned block
    (0, [1000, 5000, MiB - 6000]),  # a block received in pieces
    (3 * ALIGN, [123_457]),  # an aligned start, a blob's short tail
    (100, [50]),  # not one whole page
    (ALIGN - 1, [2]),  # across a page boundary, no whole page
    (777, [ALIGN * 3, 17, ALIGN]),  # unaligned head and tail around whole pages
    (ALIGN, [BUFFER_BYTES + 5, BUFFER_BYTES - 3, 2 * ALIGN]),  # more than one thread buffer
])
def test_every_byte_lands_at_its_offset(direct_file, offset, pieces):
    path, direct_fd, buffered_fd = direct_file
    before = path.read_bytes()
    rng = random.Random(offset + len(pieces))
    data = [rng.randbytes(n) for n in pieces]
    DirectWriter().write(direct_fd, buffered_fd, [memoryview(d) for d in data], offset)
    joined = b"".join(data)
    expected = before[:offset] + joined + before[offset + len(joined):]
    assert path.read_bytes() == expected


def test_views_placed_congruent_to_the_file_are_written_in_place_in_one_call(direct_file, monkeypatch):
    path, direct_fd, buffered_fd = direct_file
    source = mmap.mmap(-1, 4 * MiB)  # page-aligned, like the HTTP client's receive buffers
    source.write(random.Random(3).randbytes(4 * MiB))
    offset = 5 * ALIGN
    # As received: a first piece placed anywhere (it came with the answer's headers), then pieces
    # congruent to the file, one ending inside a page (the receive buffer changed there).
    first = memoryview(bytes(source[100:100 + 3000]))
    at = offset + 3000
    second = memoryview(source)[at % ALIGN + ALIGN:at % ALIGN + ALIGN + 700_001]
    at += 700_001
    third = memoryview(source)[2 * MiB + at % ALIGN:2 * MiB + at % ALIGN + 400_000]
    calls = []
    real_pwritev = os.pwritev

    def record(fd, buffers, where):
        if fd == direct_fd:
            calls.append([np.frombuffer(b, dtype=np.uint8).ctypes.data for b in buffers])
        return real_pwritev(fd, buffers, where)

    monkeypatch.setattr(os, "pwritev", record)
    before = path.read_bytes()
    DirectWriter().write(direct_fd, buffered_fd, [first, second, third], offset)
    joined = bytes(first) + bytes(second) + bytes(third)
    assert path.read_bytes() == before[:offset] + joined + before[offset + len(joined):]
    assert len(calls) == 1  # every whole page of the write in one system call
    base = np.frombuffer(source, dtype=np.uint8).ctypes.data
    in_place = [a for a in calls[0] if base <= a < base + len(source)]
    assert len(in_place) == 2  # the second and third pieces' pages were not copied


def test_a_staged_blob_bypasses_the_page_cache(tmp_path):
    blob = make_blob(4 * MiB, block_size=MiB, seed=5)
    resident = {}
    for direct in (True, False):
        with CacheTier(CacheConfig(tmp_path / f"cache-{direct}", capacity=64 * MiB, direct_writes=direct)) as tier:
            path = fill(tier, blob, durable=False)
            resident[direct], pages = resident_pages(path)
            assert path.read_bytes() == blob.data
            check_invariants(tier)
    if resident[False] == 0:
        pytest.skip("the kernel dropped the buffered copy's pages at once: nothing to compare with")
    assert resident[True] == 0, f"{resident[True]} of {pages} pages went through the page cache"
    assert resident[False] > pages // 2  # the buffered copy shows the test can see resident pages


def test_a_partial_blob_reads_back_direct_writes_and_its_buffered_tail(tmp_path):
    blob = make_blob(3 * MiB + 1234, block_size=MiB, seed=6)
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 * MiB, direct_writes=True)) as tier:
        with tier.begin(blob.digest, blob.size, blob.block_size, blob.blocks) as partial:
            for i in reversed(range(blob.block_count)):  # the tail first: the file's last page is buffered
                partial.write_block(i, blob.block(i), durable=False)
                assert partial.read_block(i) == blob.block(i)
            reader = tier.open_partial(blob.digest)
            assert reader._direct_fd is None  # a reader's handle holds no descriptor to write with
            try:
                assert [reader.read_block(i) for i in range(blob.block_count)] == \
                    [blob.block(i) for i in range(blob.block_count)]
            finally:
                reader.close()
            path = partial.commit()
        assert path.read_bytes() == blob.data
        check_invariants(tier)


def test_a_filesystem_refusing_direct_writes_gets_buffered_writes(tmp_path, monkeypatch, caplog):
    blob = make_blob(3 * MiB, block_size=MiB, seed=7)
    real_pwritev = os.pwritev

    def refuse(fd, buffers, offset):
        if fcntl.fcntl(fd, fcntl.F_GETFL) & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real_pwritev(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", refuse)
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=64 * MiB, direct_writes=True)) as tier:
        with caplog.at_level("INFO", logger="stager.cache.blob_files"):
            path = fill(tier, blob, durable=False)
        assert path.read_bytes() == blob.data
        assert tier.state(blob.digest) is BlobState.COMPLETE
        assert "refuses O_DIRECT" in caplog.text
        second = make_blob(2 * MiB, block_size=MiB, seed=8)
        assert fill(tier, second, durable=False).read_bytes() == second.data
        check_invariants(tier)

