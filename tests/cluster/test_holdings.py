"""What a node reads of a blob it holds for a peer: also while the blob is being committed."""

from __future__ import annotations

import os

from stager.cache import CacheTier
from stager.cluster.holdings import read_held_block
from tests.cache.blobs import config, make_blob


def test_a_held_block_is_read_while_its_blob_is_renamed_complete_before_the_index_says_so(tmp_path):
    # A commit renames the partial file into blobs/, fsyncs the directory, then marks the blob complete
    # in the index. A peer's read in between found neither (the partial gone, the index not yet saying
    # complete): "block 7 left the cache while being sent", the connection cut, and the asker skipped this
    # node for 300 s (seen in tests/cluster/test_first_copies.py).
    blob = make_blob(4 * 16 * 1024, 16 * 1024)
    with CacheTier(config(tmp_path / "cache", 1 << 20)) as tier:
        partial = tier.begin(blob.digest, blob.size, blob.block_size, blob.blocks)
        for index in range(blob.block_count):
            partial.write_block(index, blob.block(index))
        dest = tier.complete_path(blob.digest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.rename(partial.path, dest)  # the commit's rename, its index update not yet made
        start, end = 2 * blob.block_size, 3 * blob.block_size
        assert read_held_block(tier, blob.digest, start, end, 2) == blob.block(2)
        partial.close()
