"""Positional writes: bytes land where they belong, in system calls of the size asked for."""

from __future__ import annotations

import os
import random

from stager.cache import CacheTier
from stager.diskio import PAGE_CACHE_WRITE, write_in_pieces
from stager.cache.partial import PartialBlob

from .blobs import config, make_blob


def _counting_pwritev(monkeypatch) -> list[int]:
    sizes: list[int] = []
    real = os.pwritev

    def pwritev(fd, buffers, offset, *flags):
        written = real(fd, buffers, offset, *flags)
        sizes.append(written)
        return written

    monkeypatch.setattr(os, "pwritev", pwritev)
    return sizes


def test_write_in_pieces_puts_every_byte_in_place_in_calls_of_at_most_a_piece(tmp_path, monkeypatch):
    rng = random.Random(3)
    data = rng.randbytes(1_000_003)
    cuts = sorted(rng.sample(range(1, len(data)), 40))  # buffers of every size, crossing the pieces' edges
    buffers = [memoryview(data)[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]
    path = tmp_path / "file"
    path.write_bytes(b"\xff" * 7)
    sizes = _counting_pwritev(monkeypatch)
    fd = os.open(path, os.O_RDWR)
    try:
        write_in_pieces(fd, buffers, 7, piece=4096 * 3)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"\xff" * 7 + data
    assert max(sizes) <= 4096 * 3 and sum(sizes) == len(data)


def test_a_partial_blob_written_through_the_page_cache_asks_for_no_more_than_a_piece_at_once(tmp_path, monkeypatch):
    blob = make_blob(3 * (1 << 20) + 77, block_size=1 << 20, seed=4)
    with CacheTier(config(tmp_path / "cache", 64 << 20)) as tier:  # the default: through the page cache
        sizes = _counting_pwritev(monkeypatch)
        with tier.begin(blob.digest, blob.size, blob.block_size, blob.blocks) as partial:
            assert isinstance(partial, PartialBlob) and not partial.writes_direct
            for i in partial.missing_blocks():
                partial.write_block(i, blob.block(i), durable=False)
            path = partial.commit()
        assert path.read_bytes() == blob.data
    assert sum(sizes) == blob.size and max(sizes) <= PAGE_CACHE_WRITE
