"""Fixtures: a corpus in a bucket of `rclone serve s3`, behind the fault proxy, and a cluster factory."""

from __future__ import annotations

import pytest

from tests.cluster.support import BUCKET, Cluster, write_secret
from tests.daemon.support import make_corpus


@pytest.fixture
def cluster(s3_server_factory, fault_proxy, tmp_path):
    server = s3_server_factory()
    bucket = server.make_bucket(BUCKET)
    corpus = make_corpus(bucket / "corpus", shards=12, tokens=160_000, block_size=64 * 1024)
    made = Cluster(corpus, fault_proxy(server), (server.access_key, server.secret_key), write_secret(tmp_path))
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def fine_cluster(s3_server_factory, fault_proxy, tmp_path):
    """As ``cluster``, with blobs of 20 blocks (16 KiB blocks): where in a blob each node is can be told."""
    server = s3_server_factory()
    bucket = server.make_bucket(BUCKET)
    corpus = make_corpus(bucket / "corpus", shards=12, tokens=160_000, block_size=16 * 1024)
    made = Cluster(corpus, fault_proxy(server), (server.access_key, server.secret_key), write_secret(tmp_path))
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def big_blob_cluster(s3_server_factory, fault_proxy, tmp_path):
    """As ``cluster``, with 16 shards of 9 blocks of 1 MiB: more than one request each (requests are 8 MiB),
    as the blobs of a real dataset are."""
    server = s3_server_factory()
    bucket = server.make_bucket(BUCKET)
    corpus = make_corpus(bucket / "corpus", shards=16, tokens=9 * 512 * 1024, block_size=1 << 20)
    made = Cluster(corpus, fault_proxy(server), (server.access_key, server.secret_key), write_secret(tmp_path))
    try:
        yield made
    finally:
        made.close()
