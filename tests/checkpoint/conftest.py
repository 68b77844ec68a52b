"""A destination and a replica: two rclone S3 servers, each with its own keys, each behind a fault proxy."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from stager.loopback.fault_plan import FaultPlan
from stager.loopback.fault_proxy import FaultProxy
from stager.testing.s3server import S3Server


@dataclass
class Side:
    """One S3 server, the proxy in front of it, and a bucket."""

    server: S3Server
    proxy: FaultProxy
    bucket: str

    def url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}"

    @property
    def options(self) -> dict:
        return self.server.storage_options(self.proxy.url)

    def flags(self, flag: str) -> list[str]:
        """The command line's storage option flags (``-o`` or ``-r``) that reach this side."""
        opts = self.options
        return [flag, f"key={opts['key']}", flag, f"secret={opts['secret']}",
                flag, f"client_kwargs.endpoint_url={opts['client_kwargs']['endpoint_url']}",
                flag, "config_kwargs.response_checksum_validation=when_required"]

    def path(self, prefix: str) -> Path:
        """The folder on the server's disk that holds ``prefix`` (rclone serves files as they are)."""
        return self.server.root / self.bucket / prefix

    def puts(self, key_part: str) -> int:
        """PUT requests the proxy saw whose path contains ``key_part`` (the plan must match PUTs)."""
        return sum(1 for e in self.proxy.events if e.method == "PUT" and key_part in e.path)


def _side(s3_server_factory, fault_proxy, bucket: str) -> Side:
    server = s3_server_factory()
    server.make_bucket(bucket)
    proxy = fault_proxy(server, FaultPlan(methods=("GET", "PUT", "POST", "HEAD")))
    return Side(server, proxy, bucket)


@pytest.fixture
def sides(s3_server_factory, fault_proxy) -> tuple[Side, Side]:
    """(destination, replica)."""
    return _side(s3_server_factory, fault_proxy, "dest"), _side(s3_server_factory, fault_proxy, "replica")


def wait_for(predicate, timeout: float = 30.0, what: str = "condition") -> None:
    """Poll ``predicate`` until true, at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)
