"""Two S3 "clusters": independent rclone servers, each with its own random keys and a bucket."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from stager.config import SourceConfig
from stager.testing.s3server import S3Server


@dataclass
class Cluster:
    """One S3 server and a bucket on it."""

    server: S3Server
    bucket: str

    @property
    def root(self):
        return self.server.root / self.bucket

    def url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}"

    def options(self, endpoint: str | None = None) -> dict:
        return self.server.storage_options(endpoint)

    def source(self, prefix: str, endpoint: str | None = None) -> SourceConfig:
        return SourceConfig(self.url(prefix), self.options(endpoint))


@pytest.fixture
def clusters(s3_server_factory):
    """(source, destination): two servers whose keys differ, so each side needs its own options."""
    a = Cluster(s3_server_factory(), "alpha")
    b = Cluster(s3_server_factory(), "beta")
    assert a.server.access_key != b.server.access_key
    a.server.make_bucket(a.bucket)
    b.server.make_bucket(b.bucket)
    return a, b
