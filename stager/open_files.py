"""Open files: the process's limit, and how many requests in flight it leaves room for.

Every request in flight holds a socket, and every blob being fetched its
partial file (two descriptors of it with direct writes); the plan's
prefetcher keeps up to two blobs per request in flight. Many systems still
start processes with a soft limit of 1,024 open files: a concurrency ceiling
of 2,048 there ended in "Too many open files" for every shard past the
limit. So:

- the ``stager`` command raises its soft limit to the hard one at start (as
  Go programs, rclone and s5cmd among them, do by default), which is where
  the operator's policy lives; a library caller's process is left as it is;
- the engine takes its concurrency ceiling as the lesser of the configured
  one and what the soft limit has room for (:func:`request_ceiling`), and
  warns when that is lower.
"""

from __future__ import annotations

import logging

try:
    import resource
except ImportError:  # not a POSIX system: no limit to read or raise
    resource = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

#: Descriptors kept for everything but requests: the index's connections (one per thread, with
#: their write-ahead logs), the lock file, the daemon's and the mount's own, standard streams.
RESERVED = 128
#: Never raise the soft limit past this, whatever the hard one says (some systems allow millions).
MOST = 1 << 20


def raise_soft_limit() -> int | None:
    """Raise this process's soft limit of open files to its hard limit (at most :data:`MOST`); the new
    soft limit, or None where it cannot be read or changed (the old one then stays)."""
    if resource is None:
        return None
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = MOST if hard == resource.RLIM_INFINITY else min(hard, MOST)
        if soft != resource.RLIM_INFINITY and soft < wanted:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            return wanted
        return soft
    except (OSError, ValueError):  # a hard limit above the kernel's nr_open, a seccomp policy
        return None


def request_ceiling(configured: int, descriptors_per_blob: int = 1) -> int:
    """The most requests in flight the soft limit of open files has room for, at most ``configured``.

    Each request counts its socket and the partial files of the two blobs the prefetcher may keep
    per request (``descriptors_per_blob`` each); :data:`RESERVED` are left for the rest.
    """
    if resource is None:
        return configured
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return configured
    if soft == resource.RLIM_INFINITY:
        return configured
    room = max(4, (soft - RESERVED) // (1 + 2 * descriptors_per_blob))
    if room < configured:
        log.warning("concurrency ceiling %d lowered to %d: the soft limit of %d open files has room for no more "
                 "(raise it with `ulimit -n`)", configured, room, soft)
        return room
    return configured
