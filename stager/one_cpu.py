"""Keeping a process's threads on one CPU, where two CPUs cost more than they bring.

The engine's threads (the event loop, the disk threads, the lock threads)
take turns at the interpreter's lock. On different CPUs every turn is a
wake-up across them: staging 2,000 shards of 256 KiB on a two-CPU machine
cost 136 futex calls and 59 context switches per shard, against 5 and 4 with
every thread on one CPU, and took 1.5 to 1.8 times as long (staging 32 MiB
shards behind an origin 40 ms away, 1.25 times; at loopback up to 1.1 times;
behind slower origins no clear difference).
On one CPU a thread that lets go of the lock for a system call takes it back
at once, and the other CPU stays free for whatever else the machine runs (the
origin, a proxy, the training job).

On a larger machine the kernel's share of staging (the copies of ``recv``
and ``pwrite``) spreads over the cores, which one CPU would cap, and pinning
was not measured there: by default, only a process that may run on exactly
two CPUs keeps to one of them. ``--one-cpu`` asks for it anywhere, ``--any-cpu``
never.
"""

from __future__ import annotations

import os


def keep_on_one_cpu(wanted: bool | None) -> int | None:
    """Pin the calling thread, and so every thread it starts afterwards, to the CPU it runs on now.

    ``wanted``: True pins wherever the process may run on two CPUs or more, False never, None (the
    default) only where it may run on exactly two. Returns the CPU pinned to, or None.
    """
    if wanted is False or not hasattr(os, "sched_setaffinity"):
        return None
    try:
        allowed = os.sched_getaffinity(0)
    except OSError:
        return None
    if len(allowed) < 2 or (wanted is None and len(allowed) != 2):
        return None
    cpu = _current_cpu()
    if cpu not in allowed:
        cpu = min(allowed)
    try:
        os.sched_setaffinity(0, {cpu})
    except OSError:  # a cpuset that changed meanwhile, or a seccomp policy: run as we are
        return None
    return cpu


def _current_cpu() -> int | None:
    """The CPU the calling thread last ran on (field 39 of its stat), None if it cannot be read."""
    try:
        with open("/proc/thread-self/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return int(fields[36])  # field 39 counted from the pid; the split starts at field 3
    except (OSError, ValueError, IndexError):
        return None
