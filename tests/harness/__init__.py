"""Test harness: pytest fixtures over stager.testing's real origins and fault proxy.

The origins and the proxy live in stager.testing (the demo and the benchmarks use
them too); the modules here re-export them under their old names.

* `S3Server` (s3server.py): ``rclone serve s3`` as a child process;
  `S3Bucket` is one bucket on it.
* `HttpOrigin` (http_origin.py): a read-only HTTP server over a directory,
  with exact single-range semantics.
* `FaultProxy` (fault_proxy.py) driven by a live `FaultPlan` and a seeded
  `FaultDecider` (fault_plan.py): latency, spikes, 503 SlowDown, 500, resets,
  truncated and corrupted bodies, ignored ranges, bandwidth caps, outages.
* sigv4.py signs and re-signs S3 requests; web_thread.py runs an aiohttp app
  on its own loop in a thread; bandwidth.py is the proxy's shared rate cap.
* fixtures.py exposes all of it to pytest (loaded from tests/conftest.py).
"""

from stager.loopback.fault_plan import Fault, FaultPlan
from stager.loopback.fault_proxy import FaultProxy, ProxyStats
from stager.loopback.http_origin import HttpOrigin
from stager.testing.s3server import S3Bucket, S3Server

__all__ = ["Fault", "FaultPlan", "FaultProxy", "HttpOrigin", "ProxyStats", "S3Bucket", "S3Server"]
