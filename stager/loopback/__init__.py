"""A bad origin on demand, on loopback: an HTTP origin over a folder and a fault-injecting proxy.

stager's promise is about bad infrastructure, so its demo, its tests and its
benchmarks all need a bad origin on demand. This package ships one (the demo
uses it, so it is part of the installed library; ``stager.testing`` adds the
test-only S3 server and re-exports all of this):

* :class:`HttpOrigin` (http_origin.py): a read-only HTTP server over a
  directory, with exact single-range semantics.
* :class:`FaultProxy` (fault_proxy.py), driven by a live :class:`FaultPlan`
  and a seeded decider (fault_plan.py): latency, spikes, 503 SlowDown, 500,
  resets, truncated and corrupted bodies, ignored ranges, bandwidth caps
  (bandwidth.py), outages. Put it in front of any origin to see what your
  pipeline does. It also behaves like an object store on demand: first-byte
  latency with jitter, a per-connection and an aggregate bandwidth cap, and a
  request-rate limit per key prefix answered ``503 SlowDown`` (rate_limit.py);
  profiles.py names such origins (``object_store_plan("near")``).
* web_thread.py runs an aiohttp app on its own loop in a thread, so sync code
  and other processes can use it.

Everything listens on 127.0.0.1 on a port the OS picks.
"""

from .fault_plan import Fault, FaultPlan
from .fault_proxy import FaultProxy, ProxyStats
from .http_origin import HttpOrigin
from .profiles import PROFILES, object_store_plan

__all__ = ["PROFILES", "Fault", "FaultPlan", "FaultProxy", "HttpOrigin", "ProxyStats", "object_store_plan"]
